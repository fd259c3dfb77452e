"""The runner against a sequential model of its rules.

Every fetch waits on a gate of its own until the machine decides how it ends,
so the machine knows at each step which targets are in flight. With one
worker the model predicts the rotation exactly: which target is fetched next,
every job status, every hook call in order. With several workers the model
accepts any job that may start a target and checks what no ordering can
change: statuses, stored targets, hook counts, one target in flight per job.
With upstreams (SPEC 2d) the machine also steps the runner's clock, and the
model says which jobs may start: the runner starts no other, and starts one
whenever one may. The model and the gated fetch are ``tests/runner_model.py``.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import batch
import store
from tests.helpers import EXAMPLES, TIMEOUT, Recorder, StepClock, as_async, eventually, examples
from tests.runner_model import (
    ACTS,
    CALLER,
    CALLERS,
    PACED_ACTS,
    SECRET,
    SIZE,
    Act,
    Call,
    GatedFetch,
    MJob,
    Model,
    MUpstream,
    err_name,
    job_key,
    target_index,
)

# The timeout guards against a hang, not a slow run: a machine's hundred
# examples took 44 s on a loaded two-core host, and up to 66 s when more
# ran beside it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 * max(1.0, EXAMPLES))]


# -- the machine ----------------------------------------------------------------


class RunnerMachine(RuleBasedStateMachine):
    """A runner with gated fetches, stepped together with the model."""

    workers = 1
    #: True: the model says which target each pick must fetch.
    exact = True
    #: True: the fetch is an async def, run on the runner's event loop.
    run_async = False
    #: Config.fair and Config.weights.
    fair = "job"
    weights: dict[str, int] | None = None
    #: Config.limits; with them each target gets an upstream from ``hosts``,
    #: and the runner and the store read ``clock``, which the machine steps.
    limits: dict[str, batch.Limit] | None = None
    hosts: st.SearchStrategy[str | None] = st.none()
    #: How fetches end.
    acts = ACTS
    #: Callers (and with ``limits``, upstreams) are paused and unpaused.
    pausing = True
    #: Jobs are submitted to start later (after others; at a time, with
    #: ``limits``, whose clock the machine steps). Such a job joins the
    #: rotation when a beat takes it, while another worker may pick: the
    #: order of turns is then not the model's to say, so only where the
    #: model accepts any pick (not ``exact``).
    later = False

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.clock = StepClock() if self.limits is not None else None
        self.db = store.open(
            Path(self.tmp.name) / "jobs.sqlite3",
            clock=None if self.clock is None else self.store_time,
        )
        self.hooks = Recorder()
        self.fetch = GatedFetch()
        self.model = Model(self.fair, self.weights, self.limits)
        self.upstream_of: dict[str, str | None] = {}
        self.calls: dict[str, Call] = {}
        self.over: set[str] = set()
        self.checks = 0
        config = batch.Config(
            workers=self.workers,
            retry_wait=0,
            retry_for=3600.0,
            fair=self.fair,  # type: ignore[arg-type]
            weights=self.weights,
            # Leases as long as the machine's steps of the clock add up to.
            takeover_after=3600.0,
            upstream=None if self.limits is None else self.target_upstream,
            limits=self.limits,
        )
        fetch = as_async(self.fetch) if self.run_async else self.fetch
        self.runner: batch.Runner[batch.Caller] = batch.Runner(
            self.db, fetch, config, hooks=self.hooks, clock=self.clock
        )

    def store_time(self) -> float:
        """The store's clock: the runner's, from an epoch time on."""
        assert self.clock is not None
        return 1_700_000_000.0 + self.clock.now

    def target_upstream(self, target: batch.Target) -> str | None:
        return self.upstream_of[target.ref]

    def teardown(self) -> None:
        try:
            # Closed first, so that a released worker starts nothing new.
            with contextlib.suppress(TimeoutError):
                self.runner.close(timeout=0)
            self.fetch.open_all()
            self.runner.close(timeout=TIMEOUT)
        finally:
            self.db.close()
            self.tmp.cleanup()

    # -- keeping in step

    def settle(self) -> None:
        """Take every fetch the runner starts now (each free worker picks while
        a job is ready), checking that each is one the model allows. With
        upstreams, then wait for any job parked until the store shares its
        upstream with the runner (the first time the runner meets it) to be
        let go, and take what starts then: so what starts next never depends
        on how long the keeper's sync took. First, the jobs the model says
        may start now after waiting are waited for until the runner took
        them (or ended them, their ``after_ok`` unmet)."""
        self.join_due()
        self.take_calls()
        if self.limits is not None:
            assert eventually(self.shared), "the store never shared an upstream"
            self.take_calls()

    def join_due(self) -> None:
        """Wait until the runner took (or ended) each job the model says may
        leave its wait now, and let the model release it."""
        while not self.model.closed and (due := self.model.due()):
            # One at a time: a job ended for its after_ok may free others.
            job = due[0]
            caller = CALLERS[job.caller]
            assert eventually(
                lambda job=job, caller=caller: (
                    self.runner.explain(caller, job.id)["state"]
                    not in ("later", "elsewhere", "waiting")
                )
            ), f"{job.key} was due and never taken"
            self.model.release(job)
            event("a job that waited joined" if not job.terminal else "after_ok unmet")

    def shared(self) -> bool:
        """Whether no live job waits for a share of its upstream."""
        return not any(
            self.runner.explain(CALLERS[job.caller], job.id).get("why") == "share"
            for job in self.model.live
        )

    def take_calls(self) -> None:
        """Take every fetch the runner starts now (see ``settle``)."""
        model = self.model
        while not model.closed and len(self.calls) < self.workers and model.any_ready():
            try:
                call = self.fetch.calls.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError("a ready job was never picked") from None
            job = model.jobs[job_key(call.ref)]
            if self.exact:
                picked = model.pick()
                assert picked is job, (
                    f"fetched {call.ref}; the rotation gives {picked and picked.key}"
                )
                if job.key in model.newcomers and job.next == 0 and len(model.live) > 1:
                    event("a newcomer went before the rotation started over")
            else:
                model.start(job)
            assert target_index(call.ref) == job.next, f"{call.ref}: {job.next} was due"
            assert call.caller is CALLERS[job.caller]
            assert not call.ctx.cancelled()
            self.calls[job.key] = call
        self.note_upstreams()

    def note_upstreams(self) -> None:
        """Tell the statistics what the upstreams held back."""
        model = self.model
        for upstream in model.upstreams.values():
            if upstream.breaker != "closed":
                event(f"a breaker {upstream.breaker}")
            if upstream.held_until > model.now:
                event("an upstream held")
            if upstream.limit.concurrency == upstream.inflight:
                event("an upstream full")

    def recorded(self) -> None:
        """Wait until the runner has recorded what its fetch returned: its
        ``inflight`` hook comes first, then (the lock let go while the outcome
        is written, by the worker or an async runner's writer) its ``target``
        hook if it was stored, its ``retry`` hook if it is to be tried again,
        its ``depth`` hook if the job left; the runner's lock is held from
        those hooks until the rest is done."""
        m = self.model
        want = (len(m.inflights), len(m.targets), len(m.depths), m.retries)
        self.hooks.wait_for(
            lambda h: all(
                got >= wanted
                for got, wanted in zip(
                    (len(h.inflights), len(h.targets), len(h.depths), len(h.retries)),
                    want,
                    strict=True,
                )
            )
        )
        self.runner.statistics()

    def end(self, key: str, act: Act) -> None:
        call = self.calls.pop(key)
        self.model.finish(self.model.jobs[key], act)
        if self.run_async:
            self.model.unrecorded = self.model.jobs[key]
        call.finish(act)
        self.recorded()
        job = self.model.jobs[key]
        if act.after and (name := job.upstreams[job.next]) is not None:
            self.told(name)

    def told(self, name: str) -> None:
        """Wait until the store holds upstream ``name`` as long as the model
        says: the runner's sync that tells it is over, so the clock does not
        move while it runs (a hold told while time passes is told longer)."""
        held = self.model.upstreams[name].held_until - self.model.now
        assert eventually(
            lambda: any(
                u.name == name
                and u.held_until is not None
                and u.held_until - self.store_time() >= held
                for u in self.db.upstreams()
            )
        ), f"the store never held {name} for {held} s"

    def jobs_where(self, pred: Any) -> list[MJob]:
        return [j for j in self.model.jobs.values() if pred(j)]

    # -- rules

    @initialize(
        data=st.data(),
        jobs=st.lists(st.tuples(CALLER, SIZE, st.booleans()), min_size=1, max_size=3),
    )
    def some_jobs(self, data: st.DataObject, jobs: list[tuple[int, int, bool]]) -> None:
        for caller, size, plain in jobs:
            self.submit(data, caller, size, plain)

    @rule(data=st.data(), caller=CALLER, size=SIZE, plain=st.booleans())
    def submit(self, data: st.DataObject, caller: int, size: int, plain: bool) -> None:
        if self.model.closed:
            with pytest.raises(batch.RunnerClosed):
                self.runner.submit(CALLERS[caller], ["late"])
            return
        hosts = [data.draw(self.hosts, label="upstream") for _ in range(size)]
        job = self.model.submit(caller, size, hosts)
        self.upstream_of.update(zip(job.refs, hosts, strict=True))
        targets: list[str | batch.Target] = list(job.refs)
        if not plain:
            targets = [batch.Target(ref) for ref in job.refs]
        job.id = self.runner.submit(CALLERS[caller], targets)
        self.settle()

    @precondition(lambda self: self.later and not self.model.closed)
    @rule(
        data=st.data(),
        caller=CALLER,
        size=SIZE,
        after_ok=st.booleans(),
        wait=st.sampled_from([0, 3, 11]),
    )
    def submit_later(
        self, data: st.DataObject, caller: int, size: int, after_ok: bool, wait: int
    ) -> None:
        """A job after some of its caller's jobs (``after_ok`` or not), and
        with a clock, not before a time."""
        mine = sorted(
            (j for j in self.model.jobs.values() if j.caller == caller), key=lambda j: j.key
        )
        after = data.draw(
            st.lists(st.sampled_from(mine), max_size=2, unique_by=lambda j: j.key)
            if mine
            else st.just([]),
            label="after",
        )
        wait = wait if self.clock is not None else 0
        if not after and not wait:
            return
        hosts = [data.draw(self.hosts, label="upstream") for _ in range(size)]
        job = self.model.submit_later(
            caller,
            size,
            hosts,
            [j.key for j in after],
            after_ok=after_ok and bool(after),
            not_before=self.model.now + wait,
        )
        self.upstream_of.update(zip(job.refs, hosts, strict=True))
        job.id = self.runner.submit(
            CALLERS[caller],
            job.refs,
            after=[j.id for j in after] or None,
            after_ok=job.after_ok,
            not_before=self.store_time() + wait if wait else None,
        )
        self.settle()

    @precondition(lambda self: self.pausing and not self.model.closed)
    @rule(caller=CALLER, on=st.booleans())
    def pause(self, caller: int, on: bool) -> None:
        """Pause or unpause a caller: none of its jobs starts a target while
        it is paused; once unpaused they go on in their turn."""
        if on:
            self.runner.pause(CALLERS[caller])
            self.model.paused.add(caller)
        else:
            self.runner.unpause(CALLERS[caller])
            self.model.paused.discard(caller)
        self.settle()

    @precondition(lambda self: self.pausing and self.limits is not None and not self.model.closed)
    @rule(name=st.sampled_from(["a", "b"]), on=st.booleans())
    def pause_upstream(self, name: str, on: bool) -> None:
        """Pause or unpause an upstream: no target of it starts meanwhile."""
        if on:
            self.runner.pause(upstream=name)
            self.model.paused_upstreams.add(name)
        else:
            self.runner.unpause(upstream=name)
            self.model.paused_upstreams.discard(name)
        self.settle()

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """One fetch in flight returns as the act drawn says."""
        key = data.draw(st.sampled_from(sorted(self.calls)), label="job")
        act = data.draw(self.acts, label="act")
        if act.kind == "busy":
            event("a busy target")
        self.end(key, act)
        self.settle()

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data(), n=st.integers(2, 6))
    def steps(self, data: st.DataObject, n: int) -> None:
        """Several fetches return, one after the other, while any is in flight."""
        for _ in range(n):
            if not self.calls:
                break
            self.step(data)

    @precondition(lambda self: self.clock is not None and self.clock.now < LAST_TICK)
    @rule(seconds=st.sampled_from([1, 3, 5, 11]))
    def tick(self, seconds: int) -> None:
        """Time passes: held upstreams, busy targets and open breakers come due."""
        assert self.clock is not None
        self.clock.tick(seconds)
        self.model.now += seconds
        self.settle()

    @precondition(lambda self: any(not j.terminal for j in self.model.jobs.values()))
    @rule(data=st.data())
    def cancel_live(self, data: st.DataObject) -> None:
        live = self.jobs_where(lambda j: not j.terminal)
        job = data.draw(st.sampled_from(live), label="job")
        if job.running:
            event("cancelled with a target in flight")
        assert self.runner.cancel(CALLERS[job.caller], job.id) is True
        assert self.model.cancel(job)
        self.settle()

    @rule(data=st.data(), how=st.sampled_from(["unknown", "foreign", "terminal"]))
    def cancel_refused(self, data: st.DataObject, how: str) -> None:
        """Cancel returns False, changing nothing, for an unknown id, another
        caller's job, or a job already terminal."""
        caller, job_id = CALLERS[0], uuid.uuid4().hex
        if how == "foreign" and self.model.jobs:
            job = data.draw(st.sampled_from(list(self.model.jobs.values())), label="job")
            caller, job_id = CALLERS[(job.caller + 1) % len(CALLERS)], job.id
        terminal = self.jobs_where(lambda j: j.terminal)
        if how == "terminal" and terminal:
            job = data.draw(st.sampled_from(terminal), label="job")
            caller, job_id = CALLERS[job.caller], job.id
        assert self.runner.cancel(caller, job_id) is False

    @precondition(lambda self: bool(self.model.jobs))
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        """Touch changes no status; another caller's job is not found."""
        job = data.draw(st.sampled_from(list(self.model.jobs.values())), label="job")
        self.runner.touch(CALLERS[job.caller], job.id)
        foreign = CALLERS[(job.caller + 1) % len(CALLERS)]
        with pytest.raises(batch.JobNotFound):
            self.runner.touch(foreign, job.id)
        with pytest.raises(batch.JobNotFound):
            self.runner.status(foreign, job.id)
        with pytest.raises(batch.JobNotFound):
            self.runner.touch(CALLERS[0], uuid.uuid4().hex)

    @precondition(lambda self: bool(self.model.jobs))
    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        """wait returns a terminal job at once; for a live one it times out
        (nothing can end while every fetch is gated), or raises RunnerClosed
        once the runner is closed."""
        job = data.draw(st.sampled_from(list(self.model.jobs.values())), label="job")
        caller = CALLERS[job.caller]
        if job.terminal:
            assert self.runner.wait(caller, job.id, timeout=0).status == job.status
        elif job.deferred:
            with pytest.raises(TimeoutError):  # in no runner's hands yet
                self.runner.wait(caller, job.id, timeout=0)
        elif self.model.closed:
            with pytest.raises(batch.RunnerClosed):
                self.runner.wait(caller, job.id, timeout=TIMEOUT)
        else:
            with pytest.raises(TimeoutError):
                self.runner.wait(caller, job.id, timeout=0)

    @precondition(lambda self: not self.model.closed)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        """Close: the fetches in flight see the context cancelled and what they
        return is stored as usual; nothing starts afterwards."""
        self.model.closed = True
        if self.calls:
            event("closed with a fetch in flight")
            with pytest.raises(TimeoutError):
                self.runner.close(timeout=0)
            for key in sorted(self.calls):
                assert self.calls[key].ctx.cancelled()
                self.end(key, data.draw(self.acts, label=f"act {key}"))
        self.runner.close(timeout=TIMEOUT)
        self.runner.close()

    # -- invariants

    @invariant()
    def nothing_unplanned_started(self) -> None:
        assert self.fetch.calls.empty(), f"an unexpected fetch: {self.fetch.calls.get()}"
        assert self.fetch.violations == []
        assert len(self.model.inflight) == len(self.calls)

    @invariant()
    def statuses_match(self) -> None:
        # A job that ended and left the rotation is read again only now and
        # then: nothing may change it any more.
        self.checks += 1
        for job in self.model.jobs.values():
            if job.key in self.over and self.checks % 8:
                continue
            got = self.runner.status(CALLERS[job.caller], job.id)
            assert got.id == job.id
            assert got.status == job.status, f"{job.key}: {got.status}, model {job.status}"
            assert [t.target.ref for t in got.targets] == job.refs
            for i, (seen, want) in enumerate(zip(got.targets, job.stored, strict=True)):
                assert want.matches(seen), f"{job.key} target {i}: {seen}, model {want}"
                assert SECRET not in f"{seen.error} {seen.hint}"
            if job.terminal and job not in self.model.live:
                self.over.add(job.key)

    @invariant()
    def hooks_match(self) -> None:
        model = self.model
        with self.hooks._cond:
            assert self.hooks.depths == model.depths
            assert self.hooks.inflights == model.inflights
            assert Counter(self.hooks.jobs) == model.ended
            assert len(self.hooks.seconds) == model.seconds
            assert [err_name(e) for e, _, _ in self.hooks.targets] == model.targets
            assert len(self.hooks.retries) == model.retries
            for err, seconds, nbytes in self.hooks.targets:
                assert seconds >= 0
                assert nbytes > 0 if err is None else nbytes == 0

    @invariant()
    def upstreams_match(self) -> None:
        """What the runner shows of each upstream is what the model says."""
        for got in self.runner.upstreams():
            want = self.model.upstreams.get(got.name, MUpstream(got.limit))
            assert got.limit == self.model.limits.get(got.name, batch.Limit())
            assert (got.inflight, got.breaker, got.done, got.busy, got.failed) == (
                want.inflight,
                want.breaker,
                want.done,
                want.busy,
                want.failed,
            ), f"{got.name}: {got}, model {want}"
            # When the hold ends, as an epoch time: the runner's stepped
            # clock read against the system's, a few milliseconds apart.
            left = want.held_until - self.model.now
            if left <= 0:
                assert got.held_until is None, f"{got.name}: held, model not"
            else:
                assert got.held_until is not None, f"{got.name}: not held, model {left} s"
                assert got.held_until - time.time() == pytest.approx(left, abs=0.5)

    @invariant()
    def statistics_match(self) -> None:
        stats = self.runner.statistics()
        assert stats.live == len(self.model.live)
        assert stats.inflight == len(self.model.inflight) <= self.workers
        assert stats.waiting_retry == self.model.waiting_retry()
        assert stats.closed is self.model.closed
        assert stats.workers == (0 if self.model.closed else self.workers)


class RunnerWorkersMachine(RunnerMachine):
    """Several workers; the model accepts any pick the rules allow. Jobs
    that start after others, too."""

    workers = 3
    exact = False
    later = True


class AsyncRunnerMachine(RunnerMachine):
    """One fetch at a time on an async runner: the same model, the same
    order of turns, every hook the same."""

    run_async = True


class AsyncRunnerWorkersMachine(RunnerWorkersMachine):
    """Three fetches at once on an async runner."""

    run_async = True


class CallerFairMachine(RunnerMachine):
    """``fair="caller"``, Alice weighted 2: the model gives the order of turns."""

    fair = "caller"
    weights = {"alice": 2}  # noqa: RUF012 - read, never changed
    #: A paused caller's turns in a row are spent on jobs it holds back:
    #: the model does not say how many.
    pausing = False


class AsyncCallerFairMachine(CallerFairMachine):
    """The same, one fetch at a time on an async runner."""

    run_async = True


class CallerFairWorkersMachine(RunnerWorkersMachine):
    """``fair="caller"`` with three workers: any pick the rules allow."""

    fair = "caller"
    weights = {"bob": 3}  # noqa: RUF012 - read, never changed
    pausing = False


class UpstreamMachine(RunnerMachine):
    """Targets on upstreams ``a`` (one in flight at a time), ``b`` and none,
    each upstream with a breaker; busy answers that hold their upstream;
    time stepped by the machine. One worker: the model accepts any job
    that may start (which of the jobs parked on an upstream goes first when
    it frees is the rotation's own business)."""

    exact = False
    later = True
    limits = {  # noqa: RUF012 - read, never changed
        "a": batch.Limit(concurrency=1, break_after=2, cool_down=10.0),
        "b": batch.Limit(break_after=3, cool_down=5.0),
    }
    hosts = st.sampled_from(["a", "b", None])
    acts = PACED_ACTS


class AsyncUpstreamWorkersMachine(UpstreamMachine):
    """The same, three fetches at once on an async runner. (Not with three
    worker threads: there, which of two jobs allowed to start goes first
    when an upstream frees is a race between threads, and the machine's
    next steps would differ from run to run.)"""

    workers = 3
    run_async = True


#: The machine steps the clock up to here: well short of the runner
#: forgetting an idle upstream (``batch.pacing.FORGET_AFTER``), and of
#: ``retry_for``.
LAST_TICK = 250

#: Bounded so that a failure is reported inside the test's own timeout: at
#: most this many examples, each step within the deadline (a step waits on
#: the runner for TIMEOUT at most: longer is a hang), and shrinking for at
#: most ``conftest.SHRINK_SECONDS``.
SETTINGS = settings(
    max_examples=examples(130),
    stateful_step_count=50,
    deadline=timedelta(seconds=6 * TIMEOUT),
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)

RunnerMachine.TestCase.settings = SETTINGS
RunnerWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(50))
AsyncRunnerMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(70))
AsyncRunnerWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(30))
TestRunnerModel = RunnerMachine.TestCase
TestRunnerModelWorkers = RunnerWorkersMachine.TestCase
TestAsyncRunnerModel = AsyncRunnerMachine.TestCase
TestAsyncRunnerModelWorkers = AsyncRunnerWorkersMachine.TestCase
CallerFairMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(90))
AsyncCallerFairMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(40))
CallerFairWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(30))
TestCallerFairModel = CallerFairMachine.TestCase
TestAsyncCallerFairModel = AsyncCallerFairMachine.TestCase
TestCallerFairModelWorkers = CallerFairWorkersMachine.TestCase
UpstreamMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(70))
AsyncUpstreamWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=examples(40))
TestUpstreamModel = UpstreamMachine.TestCase
TestAsyncUpstreamModelWorkers = AsyncUpstreamWorkersMachine.TestCase
