"""The runner against a sequential model of its rules.

Every fetch waits on a gate of its own until the machine decides how it ends,
so the machine knows at each step which targets are in flight. With one
worker the model predicts the rotation exactly: which target is fetched next,
every job status, every hook call in order. With several workers the model
accepts any job that may start a target and checks what no ordering can
change: statuses, stored targets, hook counts, one target in flight per job.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
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

pytestmark = pytest.mark.slow

#: Text of the unexpected exception: it may reach the log, never the store.
SECRET = "secret-detail-2b9e"
CALLERS = (batch.Caller("alice"), batch.Caller("bob"), batch.Caller("carol"))


# -- how one fetch ends ---------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A target as the store should hold it. ``not_json``: failed with an
    error that says the result was not JSON, whatever its exact words."""

    status: str
    result: Any = None
    error: str | None = None
    hint: str | None = None
    not_json: bool = False

    def matches(self, got: batch.TargetStatus) -> bool:
        if self.not_json:
            return (got.status, got.result) == ("failed", None) and "json" in str(got.error).lower()
        return (got.status, got.result, got.error, got.hint) == (
            self.status,
            self.result,
            self.error,
            self.hint,
        )


PENDING = Stored("pending")


@dataclass(frozen=True)
class Act:
    """How one fetch ends. ``done`` returns ``value``; ``error`` raises
    ``TargetError(msg, hint)``; ``unexpected`` raises ``KeyError``;
    ``not_json`` returns a set; ``busy`` raises ``RetryLater``, directly or
    as the cause of another exception."""

    kind: str
    value: Any = None
    msg: str = ""
    hint: str | None = None
    chained: bool = False

    def perform(self) -> object:
        if self.kind == "busy":
            if self.chained:
                raise RuntimeError("upstream said so") from batch.RetryLater("upstream busy")
            raise batch.RetryLater("upstream busy")
        if self.kind == "error":
            raise batch.TargetError(self.msg, hint=self.hint)
        if self.kind == "unexpected":
            raise KeyError(SECRET)
        if self.kind == "not_json":
            return {1, 2}
        return self.value

    def stored(self) -> Stored | None:
        """What the store holds for the target afterwards; None: still pending."""
        if self.kind == "busy":
            return None
        if self.kind == "done":
            return Stored("done", result=self.value)
        if self.kind == "error":
            return Stored("failed", error=self.msg, hint=self.hint)
        if self.kind == "unexpected":
            return Stored("failed", error="internal error")
        return Stored("failed", not_json=True)

    @property
    def err(self) -> str:
        """The type of the error ``Hooks.target`` gets, by name."""
        return {
            "done": "None",
            "error": "TargetError",
            "unexpected": "KeyError",
            "not_json": "TypeError",
        }[self.kind]


JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3)
    ),
    max_leaves=5,
)

CALLER = st.integers(0, len(CALLERS) - 1)
SIZE = st.integers(1, 4)
ACTS: st.SearchStrategy[Act] = st.one_of(
    st.builds(Act, kind=st.just("done"), value=JSON_VALUES),
    st.builds(
        Act, kind=st.just("error"), msg=st.text(max_size=8), hint=st.none() | st.text(max_size=8)
    ),
    st.just(Act("unexpected")),
    st.just(Act("not_json")),
    st.builds(Act, kind=st.just("busy"), chained=st.booleans()),
)


# -- the gated fetch ------------------------------------------------------------


class Call:
    """One fetch, waiting for the machine to say how it ends."""

    def __init__(self, ref: str, caller: batch.Caller, ctx: batch.Context) -> None:
        self.ref = ref
        self.caller = caller
        self.ctx = ctx
        self._act = Act("unexpected")
        self._go = threading.Event()

    def finish(self, act: Act) -> None:
        """Decide how the fetch ends; the first decision stands."""
        if not self._go.is_set():
            self._act = act
            self._go.set()

    def wait(self) -> Act:
        """The act decided by the machine; ``unexpected`` if it never decides."""
        self._go.wait(TIMEOUT)
        return self._act


class GatedFetch:
    """The runner's fetch: every call goes on ``calls`` and waits on its gate.
    Records a violation if a job ever has two targets in flight."""

    def __init__(self) -> None:
        self.calls: queue.Queue[Call] = queue.Queue()
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._every: list[Call] = []
        self._open = False

    def __call__(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        key = job_key(target.ref)
        call = Call(target.ref, caller, ctx)
        with self._lock:
            if key in self._inflight:
                self.violations.append(f"{target.ref} began with a target of {key} in flight")
            self._inflight.add(key)
            self._every.append(call)
            if self._open:
                call.finish(Act("done"))
        try:
            self.calls.put(call)
            act = call.wait()
        finally:
            with self._lock:
                self._inflight.discard(key)
        return act.perform()

    def open_all(self) -> None:
        """Let every fetch, begun or to come, return at once."""
        with self._lock:
            self._open = True
            for call in self._every:
                call.finish(Act("done"))


def job_key(ref: str) -> str:
    """The model's name for the job of a target ref ``j<n>/t<i>``."""
    return ref.partition("/")[0]


def target_index(ref: str) -> int:
    return int(ref.partition("/t")[2])


# -- the model ------------------------------------------------------------------


@dataclass
class MJob:
    """A job as the model sees it."""

    key: str
    caller: int
    size: int
    id: str = ""
    status: str = "queued"
    next: int = 0
    running: bool = False
    taken: bool = False  # a worker took it up: running from then on
    cancelled: bool = False
    stored: list[Stored] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stored = [PENDING] * self.size

    @property
    def refs(self) -> list[str]:
        return [f"{self.key}/t{i}" for i in range(self.size)]

    @property
    def terminal(self) -> bool:
        return self.status not in ("queued", "running")


class Model:
    """Rules 1-5, sequentially: the rotation in submit order, the cursor at the
    index after the last picked job, and every hook call the runner makes.

    With ``fair="caller"`` the turns go round the callers instead: those
    with a live job in the order they came (one whose last job left comes
    back last), from the index after the last caller picked, wrapping
    once; the caller picked takes up to its weight of turns in a row, each
    from its next ready job after the one it last picked (wrapping)."""

    def __init__(self, fair: str = "job", weights: dict[str, int] | None = None) -> None:
        self.fair = fair
        self.weights = weights or {}
        self.callers: list[int] = []
        self.caller_cursor = 0
        self.current: int | None = None
        self.left = 0
        self.last_job: dict[int, int] = {}
        #: On an async runner, the job whose fetch just returned: the worker
        #: that fetched it picks again before its outcome is recorded, so
        #: that pick passes it over (and takes it only if nothing else can).
        self.unrecorded: MJob | None = None
        self.jobs: dict[str, MJob] = {}
        self.live: list[MJob] = []
        self.cursor = 0
        self.closed = False
        self.depths: list[int] = []
        self.inflights: list[int] = []
        self.ended: Counter[str] = Counter()
        self.seconds = 0
        self.targets: list[str] = []
        self.retries = 0
        #: Jobs submitted while the cursor was past the last live job.
        self.newcomers: set[str] = set()

    @property
    def inflight(self) -> list[MJob]:
        return [j for j in self.live if j.running]

    @staticmethod
    def ready(job: MJob) -> bool:
        return not job.running and not job.cancelled and job.next < job.size

    def any_ready(self) -> bool:
        return any(self.ready(j) for j in self.live)

    def submit(self, caller: int, size: int) -> MJob:
        job = MJob(f"j{len(self.jobs)}", caller, size)
        if self.live and self.cursor == len(self.live):
            self.newcomers.add(job.key)
        self.jobs[job.key] = job
        self.live.append(job)
        if caller not in self.callers:
            self.callers.append(caller)
        self.depths.append(len(self.live))
        return job

    def pick(self) -> MJob | None:
        """The job the rotation gives a free worker: the first ready one from
        the cursor on, wrapping once; the cursor moves to the index after it."""
        job = self.pick_once()
        if job is None and self.unrecorded is not None:
            self.unrecorded = None  # recorded now: the worker woken for it picks
            job = self.pick_once()
        self.unrecorded = None
        return job

    def can_start(self, job: MJob) -> bool:
        return self.ready(job) and job is not self.unrecorded

    def pick_once(self) -> MJob | None:
        if self.fair == "caller":
            return self.pick_by_caller()
        n = len(self.live)
        for k in range(n):
            i = (self.cursor + k) % n
            if self.can_start(self.live[i]):
                self.cursor = i + 1
                return self.start(self.live[i])
        return None

    def pick_by_caller(self) -> MJob | None:
        if self.current is not None and self.left > 0:
            job = self.next_job_of(self.current)
            if job is not None:
                self.left -= 1
                return self.start(job)
        n = len(self.callers)
        for k in range(n):
            i = (self.caller_cursor + k) % n
            caller = self.callers[i]
            job = self.next_job_of(caller)
            if job is not None:
                self.caller_cursor = i + 1
                self.current = caller
                self.left = self.weights.get(CALLERS[caller].id, 1) - 1
                return self.start(job)
        return None

    def next_job_of(self, caller: int) -> MJob | None:
        """The caller's first ready job after the one it last picked, wrapping."""
        ready = [j for j in self.live if j.caller == caller and self.can_start(j)]
        last = self.last_job.get(caller, -1)
        job = next((j for j in ready if number(j) > last), ready[0] if ready else None)
        if job is not None:
            self.last_job[caller] = number(job)
        return job

    def start(self, job: MJob) -> MJob:
        assert self.ready(job), f"{job.key} cannot start a target"
        job.running = True
        job.taken = True
        if job.status == "queued":
            job.status = "running"  # through its runner at once (SPEC 2)
        self.inflights.append(len(self.inflight))
        return job

    def leave(self, job: MJob) -> None:
        """Out of the rotation; the cursor stays on the job that was to come next."""
        i = self.live.index(job)
        del self.live[i]
        if i < self.cursor:
            self.cursor -= 1
        if not any(j.caller == job.caller for j in self.live):
            c = self.callers.index(job.caller)
            del self.callers[c]
            if c < self.caller_cursor:
                self.caller_cursor -= 1
            if self.current == job.caller:
                self.current, self.left = None, 0
            self.last_job.pop(job.caller, None)
        self.depths.append(len(self.live))

    def cancel(self, job: MJob) -> bool:
        if job not in self.live or job.cancelled:
            return False
        job.cancelled = True
        job.status = "cancelled"
        self.ended["cancelled"] += 1
        if not job.running:
            self.leave(job)
        return True

    def finish(self, job: MJob, act: Act) -> None:
        """The fetch in flight for ``job`` ended as ``act`` says."""
        assert job.running
        job.running = False
        self.inflights.append(len(self.inflight))
        stored = act.stored()
        if stored is None:
            # Busy: pending still, and with retry_wait=0 ready again at once.
            if job.cancelled:
                self.leave(job)
            else:
                self.retries += 1
            return
        job.stored[job.next] = stored
        job.next += 1
        self.targets.append(act.err)
        if job.cancelled:
            self.leave(job)
        elif job.next == job.size:
            kinds = {s.status for s in job.stored}
            job.status = "partial" if len(kinds) == 2 else kinds.pop()
            self.ended[job.status] += 1
            self.seconds += 1
            self.leave(job)


def number(job: MJob) -> int:
    """The job's place in submit order."""
    return int(job.key[1:])


def err_name(err: BaseException | None) -> str:
    return "None" if err is None else type(err).__name__


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
