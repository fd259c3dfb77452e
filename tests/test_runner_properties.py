"""Property tests of the runner: every job ends as its targets imply, jobs stay
serial, hooks count what happened, and cancel stops a job for good."""

from __future__ import annotations

import contextlib
import itertools
import queue
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batch
import store

pytestmark = pytest.mark.slow

TIMEOUT = 10.0
#: Text of the unexpected exception: it must reach the log only, never the store.
SECRET = "secret-detail-7f3a"
TERMINAL_BY_TARGETS = {"done", "failed", "partial"}

# -- what a fetch does, drawn by Hypothesis ---------------------------------

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
    ),
    max_leaves=6,
)


@dataclass(frozen=True)
class Outcome:
    """One target's fetch. ``kind``: ``ok`` returns ``value``; ``error`` raises
    ``TargetError(msg, hint)``; ``unexpected`` raises ``KeyError``;
    ``not_json`` returns a set; ``busy_once`` raises ``RetryLater`` (directly
    or as the cause of another exception when ``chained``), then returns
    ``value``."""

    kind: str
    value: Any = None
    msg: str = ""
    hint: str | None = None
    chained: bool = False

    @property
    def done(self) -> bool:
        return self.kind in ("ok", "busy_once")


OUTCOMES: st.SearchStrategy[Outcome] = st.one_of(
    st.builds(Outcome, kind=st.just("ok"), value=JSON_VALUES),
    st.builds(
        Outcome,
        kind=st.just("error"),
        msg=st.text(max_size=12),
        hint=st.none() | st.text(max_size=12),
    ),
    st.just(Outcome("unexpected")),
    st.just(Outcome("not_json")),
    st.builds(Outcome, kind=st.just("busy_once"), value=JSON_VALUES, chained=st.booleans()),
)


@dataclass(frozen=True)
class Plan:
    """One job: whose it is, what each target's fetch does, and whether the
    first fetch of its first target blocks until the test releases it."""

    caller: int
    outcomes: tuple[Outcome, ...]
    blocks: bool = False

    @property
    def status(self) -> str:
        done = sum(o.done for o in self.outcomes)
        if done == len(self.outcomes):
            return "done"
        return "failed" if done == 0 else "partial"


def plans(*, blocks: st.SearchStrategy[bool]) -> st.SearchStrategy[list[Plan]]:
    return st.lists(
        st.builds(
            Plan,
            caller=st.integers(0, 1),
            outcomes=st.lists(OUTCOMES, min_size=1, max_size=6).map(tuple),
            blocks=blocks,
        ),
        min_size=1,
        max_size=6,
    )


@st.composite
def cancel_scenarios(draw: st.DrawFn) -> tuple[list[Plan], list[int]]:
    """Jobs, some blocking on their first target, and which to cancel, in order."""
    jobs = draw(plans(blocks=st.booleans()))
    order = draw(st.permutations(range(len(jobs))))
    return jobs, list(order[: draw(st.integers(1, len(jobs)))])


# -- the doubles --------------------------------------------------------------


class Recorder(batch.Hooks):
    """Records every hook call. A ``job`` call made on the test's own thread is
    labelled with the job the test is cancelling at the time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.test_thread = threading.get_ident()
        self.cancelling: int | None = None
        self.depths: list[int] = []
        self.inflights: list[int] = []
        self.targets: list[tuple[BaseException | None, float, int]] = []
        self.jobs: list[tuple[str, int | None]] = []
        self.seconds: list[float] = []

    def depth(self, live: int) -> None:
        with self.lock:
            self.depths.append(live)

    def inflight(self, n: int) -> None:
        with self.lock:
            self.inflights.append(n)

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        with self.lock:
            self.targets.append((err, seconds, nbytes))

    def job(self, status: str) -> None:
        with self.lock:
            mine = threading.get_ident() == self.test_thread
            self.jobs.append((status, self.cancelling if mine else None))

    def job_seconds(self, seconds: float) -> None:
        with self.lock:
            self.seconds.append(seconds)


class Tracker:
    """The fetch, and what it saw. ``cond`` guards every field; a fetch takes it
    on entry and on exit only, so holding it freezes which fetches have begun
    and ended."""

    def __init__(self, jobs: list[Plan], db: store.Store) -> None:
        self.plans = jobs
        self.db = db
        self.callers = [batch.Caller("alice"), batch.Caller("bob")]
        self.cond = threading.Condition()
        self.release = threading.Event()
        self.refs = {
            f"c{p.caller}-j{j}-t{i}": (j, i)
            for j, p in enumerate(jobs)
            for i in range(len(p.outcomes))
        }
        self.ids: list[str] = ["" for _ in jobs]
        self.known = [threading.Event() for _ in jobs]
        self.inflight: dict[int, int] = {}
        self.next = [0 for _ in jobs]
        self.entries = [0 for _ in jobs]
        self.attempts: Counter[tuple[int, int]] = Counter()
        self.fetched: list[set[int]] = [set() for _ in jobs]
        self.blocked = 0
        self.violations: list[str] = []

    def caller(self, j: int) -> batch.Caller:
        return self.callers[self.plans[j].caller]

    def submit_all(self, runner: batch.Runner[batch.Caller]) -> None:
        for j, p in enumerate(self.plans):
            refs = [f"c{p.caller}-j{j}-t{i}" for i in range(len(p.outcomes))]
            self.ids[j] = runner.submit(self.caller(j), [refs[0], *map(batch.Target, refs[1:])])
            self.known[j].set()

    def fetch(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        j, i = self.refs[target.ref]
        outcome = self.plans[j].outcomes[i]
        with self.cond:
            if caller is not self.caller(j):
                self.violations.append(f"job {j}: fetch got the wrong caller {caller!r}")
            if j in self.inflight:
                self.violations.append(
                    f"job {j}: target {i} began with {self.inflight[j]} in flight"
                )
            if i != self.next[j]:
                self.violations.append(f"job {j}: target {i} began; {self.next[j]} was due")
            self.inflight[j] = i
            self.entries[j] += 1
            self.attempts[j, i] += 1
            first = self.attempts[j, i] == 1
            block = self.plans[j].blocks and i == 0 and first
            if block:
                self.blocked += 1
                self.cond.notify_all()
        busy = outcome.kind == "busy_once" and first
        try:
            if i > 0:
                self._check_store(j, i)
            if block and not self.release.wait(TIMEOUT):
                with self.cond:
                    self.violations.append(f"job {j}: never released")
            return _act(outcome, busy=busy)
        finally:
            with self.cond:
                del self.inflight[j]
                if not busy:
                    self.next[j] = i + 1
                    self.fetched[j].add(i)

    def _check_store(self, j: int, i: int) -> None:
        """Target ``i`` begins: the ones before it are stored, it and the rest are not."""
        if not self.known[j].wait(TIMEOUT):
            with self.cond:
                self.violations.append(f"job {j}: submit never returned")
            return
        row = self.db.get_job(self.ids[j], self.caller(j).id)
        assert row is not None
        seen = [t.status for t in row.targets]
        if "pending" in seen[:i] or any(s != "pending" for s in seen[i:]):
            with self.cond:
                self.violations.append(f"job {j}: target {i} began with targets {seen}")
        if row.status not in ("running", "cancelled"):
            with self.cond:
                self.violations.append(f"job {j}: target {i} began with the job {row.status}")


def _act(outcome: Outcome, *, busy: bool) -> object:
    if busy:
        if outcome.chained:
            raise RuntimeError("upstream said so") from batch.RetryLater("upstream busy")
        raise batch.RetryLater("upstream busy")
    if outcome.kind == "error":
        raise batch.TargetError(outcome.msg, hint=outcome.hint)
    if outcome.kind == "unexpected":
        raise KeyError(SECRET)
    if outcome.kind == "not_json":
        return {1, 2}
    return outcome.value


@contextlib.contextmanager
def running(
    jobs: list[Plan], workers: int, hooks: Recorder
) -> Iterator[tuple[batch.Runner[batch.Caller], Tracker]]:
    """A fresh store and runner; the blocked fetches are released before the
    runner closes, and the store closes after it."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        db = stack.enter_context(store.open(Path(tmp) / "jobs.sqlite3"))
        tracker = Tracker(jobs, db)
        config = batch.Config(workers=workers, retry_wait=0.001, retry_for=600.0)
        runner = stack.enter_context(batch.Runner(db, tracker.fetch, config, hooks=hooks))
        stack.callback(tracker.release.set)
        yield runner, tracker


# -- checks ---------------------------------------------------------------------


def check_target(where: str, got: batch.TargetStatus, outcome: Outcome) -> None:
    """A target stored as its fetch implies."""
    assert SECRET not in f"{got.error} {got.hint}", where
    if outcome.done:
        assert (got.status, got.error, got.hint) == ("done", None, None), where
        assert got.result == outcome.value, where
        return
    assert (got.status, got.result) == ("failed", None), where
    if outcome.kind == "error":
        assert (got.error, got.hint) == (outcome.msg, outcome.hint), where
    elif outcome.kind == "unexpected":
        assert (got.error, got.hint) == ("internal error", None), where
    else:
        assert got.error is not None, where
        assert "json" in got.error.lower(), where


def check_finished(j: int, job: batch.Job, plan: Plan) -> None:
    """A job that was not cancelled: its status and every target as implied."""
    assert job.status == plan.status, f"job {j}: {job}"
    assert len(job.targets) == len(plan.outcomes)
    for i, (got, outcome) in enumerate(zip(job.targets, plan.outcomes, strict=True)):
        assert got.target == batch.Target(f"c{plan.caller}-j{j}-t{i}")
        check_target(f"job {j} target {i}: {got} for {outcome}", got, outcome)


def err_kind(err: BaseException | None) -> str:
    if err is None:
        return "none"
    if isinstance(err, batch.TargetError):
        return "target"
    return "unexpected" if isinstance(err, KeyError) else "other"


OUTCOME_ERR = {"ok": "none", "busy_once": "none", "error": "target", "unexpected": "unexpected"}


def check_gauges(hooks: Recorder, workers: int, jobs: int) -> None:
    """depth and inflight moved one step at a time, within bounds, back to 0."""
    assert hooks.depths, "depth never called"
    for values, top in ((hooks.depths, jobs), (hooks.inflights, workers)):
        # inflight stays uncalled when every job was cancelled before a fetch.
        if values:
            assert (values[0], values[-1]) == (1, 0), values
        assert all(0 <= v <= top for v in values), values
        assert all(abs(b - a) == 1 for a, b in itertools.pairwise(values)), values


def check_target_hooks(hooks: Recorder, stored: list[Outcome]) -> None:
    """One target call per stored target, with the error its fetch raised."""
    assert Counter(err_kind(err) for err, _, _ in hooks.targets) == Counter(
        OUTCOME_ERR.get(o.kind, "other") for o in stored
    )
    for err, seconds, nbytes in hooks.targets:
        assert seconds >= 0
        assert nbytes > 0 if err is None else nbytes == 0


def wait_until(cond: threading.Condition, pred: Callable[[], bool]) -> None:
    with cond:
        assert cond.wait_for(pred, TIMEOUT), "timed out"


# -- the properties ---------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(jobs=plans(blocks=st.just(False)), workers=st.integers(1, 4))
def test_every_job_ends_as_its_targets_imply(jobs: list[Plan], workers: int) -> None:
    hooks = Recorder()
    with running(jobs, workers, hooks) as (runner, tracker):
        tracker.submit_all(runner)
        ended = [
            runner.wait(tracker.caller(j), tracker.ids[j], timeout=TIMEOUT)
            for j in range(len(jobs))
        ]
        stats = runner.statistics()
    assert (stats.live, stats.inflight, stats.waiting_retry) == (0, 0, 0)

    assert tracker.violations == []
    for j, (job, plan) in enumerate(zip(ended, jobs, strict=True)):
        assert job.id == tracker.ids[j]
        check_finished(j, job, plan)
        for i, outcome in enumerate(plan.outcomes):
            assert tracker.attempts[j, i] == (2 if outcome.kind == "busy_once" else 1)

    with hooks.lock:
        assert Counter(s for s, _ in hooks.jobs) == Counter(p.status for p in jobs)
        assert len(hooks.seconds) == len(jobs)
        assert all(s >= 0 for s in hooks.seconds)
        check_target_hooks(hooks, [o for p in jobs for o in p.outcomes])
        check_gauges(hooks, workers, len(jobs))


@dataclass(frozen=True)
class Cancel:
    """What the test saw around one cancel: what it returned, how many fetches
    of the job had begun and whether one was in flight (both frozen while
    cancel ran), and the job's status right after."""

    ok: bool
    entries: int
    in_flight: bool
    status: str


def cancel_all(
    runner: batch.Runner[batch.Caller], tracker: Tracker, hooks: Recorder, order: list[int]
) -> dict[int, Cancel]:
    seen: dict[int, Cancel] = {}
    for j in order:
        caller = tracker.caller(j)
        # Holding tracker.cond: no fetch begins or ends while cancel runs.
        with tracker.cond:
            entries, in_flight = tracker.entries[j], j in tracker.inflight
            with hooks.lock:
                hooks.cancelling = j
            ok = runner.cancel(caller, tracker.ids[j])
            with hooks.lock:
                hooks.cancelling = None
        seen[j] = Cancel(ok, entries, in_flight, runner.status(caller, tracker.ids[j]).status)
    return seen


def check_cancelled(j: int, job: batch.Job, plan: Plan, tracker: Tracker, seen: Cancel) -> None:
    """A cancelled job: what was fetched is stored, the rest stays pending, and
    nothing began after cancel returned but a target already picked."""
    assert seen.status == "cancelled", f"job {j}"
    assert job.status == "cancelled", f"job {j}: {job}"
    assert tracker.entries[j] <= seen.entries + (0 if seen.in_flight else 1), f"job {j}"
    fetched = tracker.fetched[j]
    assert fetched == set(range(len(fetched))), f"job {j}: {fetched}"
    for i, (got, outcome) in enumerate(zip(job.targets, plan.outcomes, strict=True)):
        where = f"job {j} target {i}: {got} for {outcome}"
        if i in fetched:
            check_target(where, got, outcome)
        else:
            assert (got.status, got.result, got.error, got.hint) == ("pending", None, None, None)


@settings(max_examples=100, deadline=None)
@given(scenario=cancel_scenarios(), workers=st.integers(1, 4))
def test_cancel_stops_a_job_for_good(scenario: tuple[list[Plan], list[int]], workers: int) -> None:
    jobs, order = scenario
    hooks = Recorder()
    with running(jobs, workers, hooks) as (runner, tracker):
        tracker.submit_all(runner)
        held = min(workers, sum(p.blocks for p in jobs))
        wait_until(tracker.cond, lambda: tracker.blocked >= held)
        seen = cancel_all(runner, tracker, hooks, order)
        tracker.release.set()
        waited = {
            j: runner.wait(tracker.caller(j), tracker.ids[j], timeout=TIMEOUT).status
            for j in range(len(jobs))
        }
        runner.close()
        stats = runner.statistics()
        final = [runner.status(tracker.caller(j), tracker.ids[j]) for j in range(len(jobs))]
    assert (stats.live, stats.inflight, stats.waiting_retry) == (0, 0, 0)
    assert tracker.violations == []

    cancelled = {j for j, c in seen.items() if c.ok}
    for j, c in seen.items():
        # A blocked job cannot end before it is released, nor one in flight.
        if jobs[j].blocks or c.in_flight:
            assert c.ok, f"job {j}: cancel returned False while it was live"
        if not c.ok:
            assert c.status in TERMINAL_BY_TARGETS, f"job {j}: {c}"
    for j, (job, plan) in enumerate(zip(final, jobs, strict=True)):
        if j in cancelled:
            assert waited[j] == "cancelled"
            check_cancelled(j, job, plan, tracker, seen[j])
        else:
            assert waited[j] == job.status
            check_finished(j, job, plan)

    stored = [
        o
        for job, plan in zip(final, jobs, strict=True)
        for t, o in zip(job.targets, plan.outcomes, strict=True)
        if t.status != "pending"
    ]
    with hooks.lock:
        assert Counter(j for s, j in hooks.jobs if s == "cancelled") == Counter(cancelled)
        assert Counter(s for s, _ in hooks.jobs if s != "cancelled") == Counter(
            job.status for j, job in enumerate(final) if j not in cancelled
        )
        assert len(hooks.seconds) == len(jobs) - len(cancelled)
        check_target_hooks(hooks, stored)
        check_gauges(hooks, workers, len(jobs))


LONE_SURROGATE = "bad \udc00 text"


def _surrogate_fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    if target.ref == "result":
        return {"text": LONE_SURROGATE}
    if target.ref == "error":
        raise batch.TargetError(LONE_SURROGATE)
    raise batch.TargetError("no such document", hint=LONE_SURROGATE)


def test_text_sqlite_cannot_encode_still_ends_the_job() -> None:
    caller = batch.Caller("alice")
    refs = ["result", "error", "hint"]
    config = batch.Config(workers=len(refs), retry_wait=0.001)
    with (
        tempfile.TemporaryDirectory() as tmp,
        store.open(Path(tmp) / "jobs.sqlite3") as db,
        batch.Runner(db, _surrogate_fetch, config) as runner,
    ):
        ids = [runner.submit(caller, [ref, "after"]) for ref in refs]
        # A correct runner ends these jobs in milliseconds; the bound only keeps
        # dead workers from holding the test for long.
        deadline = time.monotonic() + 2.0
        jobs = [runner.wait(caller, i, timeout=deadline - time.monotonic()) for i in ids]
    for job in jobs:
        assert job.terminal
        assert job.targets[0].status in ("done", "failed")


# -- fair="caller": each caller's share of the turns --------------------------

SHARE_WORKERS = 4
SHARE_ROUNDS = 30


@settings(max_examples=12, deadline=None)
@given(
    weights=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    njobs=st.lists(st.integers(SHARE_WORKERS, 9), min_size=3, max_size=3),
)
def test_each_caller_gets_its_weight_of_turns_whatever_its_number_of_jobs(
    weights: list[int], njobs: list[int]
) -> None:
    """With several workers, over ``SHARE_ROUNDS`` rounds of turns each
    caller takes ``SHARE_ROUNDS`` times its weight, within one round, however
    many jobs each has.

    Every worker holds a fetch; the test lets the oldest return, and the
    worker it frees (the only one free) records it and takes the next turn:
    the order of the fetches is the order of the turns. Each caller has at
    least as many jobs as there are workers, so one of its jobs is always
    ready: at most the other workers' three are in flight."""
    callers = [batch.Caller(name) for name in ("alice", "bob", "carol")]
    per_round = sum(weights)
    calls: queue.Queue[tuple[str, threading.Event]] = queue.Queue()
    ending = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        if ending.is_set():
            return
        go = threading.Event()
        calls.put((caller.id, go))
        go.wait(TIMEOUT)

    config = batch.Config(
        workers=SHARE_WORKERS,
        fair="caller",
        weights={c.id: w for c, w in zip(callers, weights, strict=True)},
    )
    turns: Counter[str] = Counter()
    with (
        tempfile.TemporaryDirectory() as tmp,
        store.open(Path(tmp) / "jobs.sqlite3") as db,
        batch.Runner(db, fetch, config) as runner,
    ):
        size = (SHARE_ROUNDS + 2) * max(weights)  # more than any caller's turns
        for caller, n in zip(callers, njobs, strict=True):
            for _ in range(n):
                runner.submit(caller, [f"t{i}" for i in range(size)])
        held = [calls.get(timeout=TIMEOUT) for _ in range(SHARE_WORKERS)]
        try:
            for _ in range(SHARE_ROUNDS * per_round):
                held.pop(0)[1].set()
                held.append(calls.get(timeout=TIMEOUT))
                turns[held[-1][0]] += 1
        finally:
            ending.set()  # from now on a fetch returns at once
            for _, go in held:
                go.set()
    for caller, weight in zip(callers, weights, strict=True):
        assert abs(turns[caller.id] - SHARE_ROUNDS * weight) <= per_round, (turns, weights)
