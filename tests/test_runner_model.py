"""The runner against a sequential model of its rules.

Every fetch waits on a gate of its own until the machine decides how it ends,
so the machine knows at each step which targets are in flight. With one
worker the model predicts the rotation exactly: which target is fetched next,
every job status, every hook call in order. With several workers the model
accepts any job that may start a target and checks what no ordering can
change: statuses, stored targets, hook counts, one target in flight per job.
The model and the gated fetch are ``tests/runner_model.py``.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import uuid
from collections import Counter
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
from tests.helpers import TIMEOUT, Recorder, as_async
from tests.runner_model import (
    ACTS,
    CALLER,
    CALLERS,
    SECRET,
    SIZE,
    Act,
    Call,
    GatedFetch,
    MJob,
    Model,
    err_name,
    job_key,
    target_index,
)

pytestmark = pytest.mark.slow


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

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.db = store.open(Path(self.tmp.name) / "jobs.sqlite3")
        self.hooks = Recorder()
        self.fetch = GatedFetch()
        self.model = Model(self.fair, self.weights)
        self.calls: dict[str, Call] = {}
        self.over: set[str] = set()
        self.checks = 0
        config = batch.Config(
            workers=self.workers,
            retry_wait=0,
            retry_for=3600.0,
            fair=self.fair,  # type: ignore[arg-type]
            weights=self.weights,
        )
        fetch = as_async(self.fetch) if self.run_async else self.fetch
        self.runner: batch.Runner[batch.Caller] = batch.Runner(
            self.db, fetch, config, hooks=self.hooks
        )

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
        a job is ready), checking that each is one the model allows."""
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

    def jobs_where(self, pred: Any) -> list[MJob]:
        return [j for j in self.model.jobs.values() if pred(j)]

    # -- rules

    @initialize(jobs=st.lists(st.tuples(CALLER, SIZE, st.booleans()), min_size=1, max_size=3))
    def some_jobs(self, jobs: list[tuple[int, int, bool]]) -> None:
        for caller, size, plain in jobs:
            self.submit(caller, size, plain)

    @rule(caller=CALLER, size=SIZE, plain=st.booleans())
    def submit(self, caller: int, size: int, plain: bool) -> None:
        if self.model.closed:
            with pytest.raises(batch.RunnerClosed):
                self.runner.submit(CALLERS[caller], ["late"])
            return
        job = self.model.submit(caller, size)
        targets: list[str | batch.Target] = list(job.refs)
        if not plain:
            targets = [batch.Target(ref) for ref in job.refs]
        job.id = self.runner.submit(CALLERS[caller], targets)
        self.settle()

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data(), act=ACTS)
    def step(self, data: st.DataObject, act: Act) -> None:
        """One fetch in flight returns as ``act`` says."""
        key = data.draw(st.sampled_from(sorted(self.calls)), label="job")
        if act.kind == "busy":
            event("a busy target")
        self.end(key, act)
        self.settle()

    @precondition(lambda self: bool(self.calls))
    @rule(data=st.data(), acts=st.lists(ACTS, min_size=2, max_size=6))
    def steps(self, data: st.DataObject, acts: list[Act]) -> None:
        """Several fetches return, one after the other, while any is in flight."""
        for act in acts:
            if not self.calls:
                break
            self.step(data, act)

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
                self.end(key, data.draw(ACTS, label=f"act {key}"))
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
    def statistics_match(self) -> None:
        stats = self.runner.statistics()
        assert stats.live == len(self.model.live)
        assert stats.inflight == len(self.model.inflight) <= self.workers
        assert stats.waiting_retry == 0
        assert stats.closed is self.model.closed
        assert stats.workers == (0 if self.model.closed else self.workers)


class RunnerWorkersMachine(RunnerMachine):
    """Several workers; the model accepts any pick the rules allow."""

    workers = 3
    exact = False


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


class AsyncCallerFairMachine(CallerFairMachine):
    """The same, one fetch at a time on an async runner."""

    run_async = True


class CallerFairWorkersMachine(RunnerWorkersMachine):
    """``fair="caller"`` with three workers: any pick the rules allow."""

    fair = "caller"
    weights = {"bob": 3}  # noqa: RUF012 - read, never changed


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

RunnerMachine.TestCase.settings = SETTINGS
RunnerWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=70)
AsyncRunnerMachine.TestCase.settings = settings(SETTINGS, max_examples=100)
AsyncRunnerWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=40)
TestRunnerModel = RunnerMachine.TestCase
TestRunnerModelWorkers = RunnerWorkersMachine.TestCase
TestAsyncRunnerModel = AsyncRunnerMachine.TestCase
TestAsyncRunnerModelWorkers = AsyncRunnerWorkersMachine.TestCase
CallerFairMachine.TestCase.settings = settings(SETTINGS, max_examples=150)
AsyncCallerFairMachine.TestCase.settings = settings(SETTINGS, max_examples=60)
CallerFairWorkersMachine.TestCase.settings = settings(SETTINGS, max_examples=40)
TestCallerFairModel = CallerFairMachine.TestCase
TestAsyncCallerFairModel = AsyncCallerFairMachine.TestCase
TestCallerFairModelWorkers = CallerFairWorkersMachine.TestCase
