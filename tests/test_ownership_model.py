"""Several runners on one store file, in one process, against the ownership
rules of SPEC §2a.

Every runner has a clock of its own that only the machine steps
(``StepClock``), and the store's clock is the machine's too. A runner whose
clock the machine does not step is *stopped*: its keeper does not beat, so
once the store's clock passes its leases, a runner that can resume
(``Config(resume=batch.Caller)``) takes its jobs; when the machine steps its
clock again (catching up with the store's), it renews, and learns what it
lost. Every fetch waits on a gate until the machine says how it ends; when it
starts, it reads the store to check that its runner holds the job's lease.

The machine waits for each runner to settle without sleeping: the keeper
is idle once it waits on its clock after reading the time the machine set
(so a beat due then is done), and the workers are settled once every
target that can start has started (``statistics()``: in flight ==
min(workers, live)) and reached its gate.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import batch
import store
from tests.helpers import EXAMPLES, TIMEOUT, Clock, Recorder, StepClock, examples, within

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180 * max(1.0, EXAMPLES))]

#: The lease's length; the keeper beats every LAPSE / 3 = 1 second, and the
#: machine steps time by whole seconds, so every time is an exact float.
LAPSE = 3.0
WORKERS = 2
CALLERS = (batch.Caller("alice"), batch.Caller("bob"))
LIVE = ("queued", "running")
ACTS = st.sampled_from(["done", "error", "busy"])


def note(what: str) -> None:
    """``hypothesis.event``, also when a step is run by hand."""
    with contextlib.suppress(InvalidArgument):
        event(what)


class KeeperClock(StepClock):
    """A ``StepClock`` that tells when the runner's keeper is idle: it waits
    on the clock having read ``keeper_idle_at`` last, so whatever was due at
    that time (a beat, and what the beat took) is done."""

    def __init__(self) -> None:
        super().__init__()
        self._read = -1.0
        self.keeper_idle_at = -1.0

    @staticmethod
    def _keeper() -> bool:
        return threading.current_thread().name == "batch-keeper"

    def monotonic(self) -> float:
        now = self.now
        if self._keeper():
            self._read = now
        return now

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        if self._keeper():
            self.keeper_idle_at = self._read
        super().wait(cond, timeout)


@dataclass
class Call:
    """One fetch, started by runner ``runner`` (its index) for target ``pos``
    of job ``key``, while the store said the job was leased to ``owner`` with
    ``token``. It waits for the machine to say how it ends."""

    cid: int
    runner: int
    key: str
    pos: int
    owner: str | None
    token: int
    ctx: batch.Context = field(repr=False)
    act: str = ""
    go: threading.Event = field(default_factory=threading.Event, repr=False)

    def perform(self) -> object:
        # No timeout: a stopped runner's fetch waits for as long as the
        # machine keeps it stopped, which can be many steps (the teardown
        # releases every gate; pytest-timeout bounds a real hang).
        self.go.wait()
        if self.act == "busy":
            raise batch.RetryLater("upstream busy")
        if self.act == "error":
            raise batch.TargetError(f"c{self.cid}")
        return {"cid": self.cid}


@dataclass
class MRunner:
    """One runner as the machine sees it."""

    idx: int
    runner: batch.Runner[batch.Caller] = field(repr=False)
    db: store.Store = field(repr=False)
    clock: KeeperClock = field(repr=False)
    hooks: Recorder = field(repr=False)
    stopped_at: float | None = None  # the store's time when it was stopped
    closed: bool = False
    outstanding: dict[int, Call] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return f"r{self.idx}"

    @property
    def running(self) -> bool:
        return not self.closed and self.stopped_at is None


@dataclass
class MJob:
    key: str
    caller: int
    size: int
    id: str


class OwnershipMachine(RuleBasedStateMachine):
    """Runners that stop, resume, close and are replaced, sharing jobs."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "jobs.sqlite3"
        self.clock = Clock()
        self.patch = contextlib.ExitStack()
        self.runners: list[MRunner] = []
        self.ids: dict[int, str] = {}  # runner index -> runner id, once known
        self.known = threading.Condition()
        self.jobs: dict[str, MJob] = {}
        self.by_id: dict[str, MJob] = {}
        self.calls: dict[int, Call] = {}  # every call ever made
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.cids = itertools.count(1)
        self.owners: dict[str, str | None] = {}  # job id -> lease owner, last look
        self.expected: dict[int, tuple[str, bool]] = {}  # call id -> (act, kept)
        # Creates the schema before any reader.
        self.first = store.open(self.path, clock=self.clock.time)

    # -- the store, read as any other process would --------------------------

    def read(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=TIMEOUT)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def job_row(self, job_id: str) -> tuple[str, str | None, int, float | None]:
        ((status, owner, token, until),) = self.read(
            "SELECT status, lease_owner, lease_token, lease_until FROM jobs WHERE id = ?",
            (job_id,),
        )
        return status, owner, token, until

    def live_ids(self) -> list[str]:
        return [
            i for (i,) in self.read("SELECT id FROM jobs WHERE status IN ('queued', 'running')")
        ]

    # -- the fetch --------------------------------------------------------------

    def fetch_for(self, idx: int) -> batch.Fetch[batch.Caller]:
        def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
            key, _, pos_text = target.ref.partition("/t")
            pos = int(pos_text)
            with self.known:
                # A job submitted through this runner may start before
                # submit returns its id.
                assert self.known.wait_for(lambda: self.jobs[key].id != "", TIMEOUT)
            job = self.jobs[key]
            # What the store says as the target starts.
            now = self.clock.now
            status, owner, token, until = self.job_row(job.id)
            pending = self.read(
                "SELECT min(pos) FROM targets WHERE job_id = ? AND status = 'pending'", (job.id,)
            )[0][0]
            with self.known:
                assert self.known.wait_for(lambda: idx in self.ids, TIMEOUT)
                me = self.ids[idx]
            call = Call(next(self.cids), idx, key, pos, owner, token, ctx)
            problems = []
            if status not in LIVE:
                problems.append(f"the job is {status}")
            if owner != me:
                problems.append(f"its lease is {self.name_of(owner)}'s")
            elif until is None or until < now:
                problems.append(f"its lease lapsed at {until}, now {now}")
            if pending != pos:
                problems.append(f"target {pending} was the first pending")
            if caller != CALLERS[job.caller]:
                problems.append(f"fetched for caller {caller.id}")
            with self.lock:
                if problems:
                    self.violations.append(
                        f"r{idx} started {target.ref} (call {call.cid}): " + "; ".join(problems)
                    )
                self.calls[call.cid] = call
                self.runners[idx].outstanding[call.cid] = call
            return call.perform()

        return fetch

    def name_of(self, runner_id: str | None) -> str:
        for idx, rid in self.ids.items():
            if rid == runner_id:
                return f"r{idx}"
        return str(runner_id)

    # -- keeping in step ----------------------------------------------------------

    def open_runner(self) -> None:
        idx = len(self.runners)
        clock = KeeperClock()
        hooks = Recorder()
        db = store.open(self.path, clock=self.clock.time)
        config = batch.Config(
            workers=WORKERS,
            retry_wait=0,
            retry_for=3600.0,
            resume=batch.Caller,
            takeover_after=LAPSE,
        )
        # Listed before it exists: its first beat, in the constructor, may
        # take jobs whose fetches start at once.
        placeholder = MRunner(idx, None, db, clock, hooks)  # type: ignore[arg-type]
        with self.lock:
            self.runners.append(placeholder)
        runner = batch.Runner(db, self.fetch_for(idx), config, hooks, clock=clock)
        placeholder.runner = runner
        with self.known:
            self.ids[idx] = runner.id
            self.known.notify_all()

    def settled(self, r: MRunner) -> bool:
        st_ = r.runner.statistics()
        with self.lock:
            started = len(r.outstanding)
        return st_.inflight == min(WORKERS, st_.live) and started == st_.inflight

    def settle(self) -> None:
        """Wait until every open runner started what it can start."""
        for r in self.open:
            assert within(TIMEOUT, lambda r=r: self.settled(r)), (
                f"{r.name} never settled: {r.runner.statistics()}, {len(r.outstanding)} at gates"
            )

    def keepers_idle(self, rs: list[MRunner]) -> None:
        for r in rs:
            assert within(TIMEOUT, lambda r=r: r.clock.keeper_idle_at >= r.clock.now), (
                f"the keeper of {r.name} never got to {r.clock.now}"
            )

    @property
    def open(self) -> list[MRunner]:
        return [r for r in self.runners if not r.closed]

    def look_at_owners(self) -> None:
        """Every change of a live job's lease since the last look is away from
        a runner that is stopped or closed (or from no runner): a live runner
        never loses its jobs. With a runner running, no live job is left
        unleased or lapsed."""
        rows = self.read(
            "SELECT id, lease_owner, lease_until FROM jobs WHERE status IN ('queued', 'running')"
        )
        now = self.clock.now
        for job_id, owner, until in rows:
            before = self.owners.get(job_id)
            if before is not None and owner != before:
                idx = int(self.name_of(before)[1:])
                assert not self.runners[idx].running, (
                    f"{self.by_id[job_id].key} was taken from {self.name_of(before)}, running"
                )
                note("a job changed hands")
            self.owners[job_id] = owner
            if any(r.running for r in self.runners):
                assert owner is not None, f"{self.by_id[job_id].key} is left unleased"
                assert until >= now, f"{self.by_id[job_id].key}: lease lapsed, nobody took it"

    def release(self, call: Call, act: str) -> None:
        """Let ``call`` end as ``act`` says; the store must keep its outcome
        exactly when its runner still holds the job with the token it started
        it with (or the job was cancelled meanwhile, and nobody took it)."""
        r = self.runners[call.runner]
        job = self.jobs[call.key]
        status, owner, token, _ = self.job_row(job.id)
        cancelled = status == "cancelled" and self.cancelled_in_flight_is_stored()
        keep = token == call.token and (owner == call.owner or cancelled)
        with self.lock:
            del r.outstanding[call.cid]
        call.act = act
        call.go.set()
        self.expected[call.cid] = (act, keep)

    def cancelled_in_flight_is_stored(self) -> bool:
        """SPEC §2a: the owner of a job cancelled through another runner
        "stores the one in flight", whether or not it beat meanwhile."""
        return True

    def check_kept(self, call: Call) -> None:
        act, keep = self.expected[call.cid]
        if act == "busy":
            return
        job = self.jobs[call.key]
        ((result, error),) = self.read(
            "SELECT result, error FROM targets WHERE job_id = ? AND pos = ?", (job.id, call.pos)
        )
        mine = result == f'{{"cid":{call.cid}}}' or error == f"c{call.cid}"
        if keep:
            assert mine, f"call {call.cid} of r{call.runner} for {call.key}/t{call.pos} was lost"
        else:
            assert not mine, f"call {call.cid} of r{call.runner} was stored without the lease"

    # -- rules -----------------------------------------------------------------

    @initialize(n=st.integers(2, 3))
    def start(self, n: int) -> None:
        for _ in range(n):
            self.open_runner()

    def running_runners(self) -> list[MRunner]:
        return [r for r in self.runners if r.running]

    @precondition(lambda self: any(r.running for r in self.runners))
    @rule(data=st.data(), caller=st.integers(0, 1), size=st.integers(1, 3))
    def submit(self, data: st.DataObject, caller: int, size: int) -> None:
        r = self.runners[data.draw(st.sampled_from([r.idx for r in self.running_runners()]))]
        key = f"j{len(self.jobs)}"
        refs = [f"{key}/t{i}" for i in range(size)]
        # The job is known before its first fetch can ask for it.
        job = MJob(key, caller, size, "")
        self.jobs[key] = job
        job_id = r.runner.submit(CALLERS[caller], refs)
        with self.known:
            job.id = job_id
            self.by_id[job_id] = job
            self.known.notify_all()
        self.settle()

    @staticmethod
    def in_order(calls: list[Call]) -> list[Call]:
        """Calls in an order that does not depend on which of two workers
        started first (call ids do): so that Hypothesis can replay a case."""
        return sorted(calls, key=lambda c: (c.runner, c.key, c.pos, c.cid))

    def releasable(self) -> list[Call]:
        with self.lock:
            return [c for r in self.running_runners() for c in r.outstanding.values()]

    @precondition(lambda self: bool(self.releasable()))
    @rule(data=st.data(), act=ACTS)
    def finish(self, data: st.DataObject, act: str) -> None:
        """A fetch of a running runner ends: done, failed, or busy (tried again
        at once)."""
        call = data.draw(st.sampled_from(self.in_order(self.releasable())), label="call")
        self.release(call, act)
        self.settle()
        self.check_kept(call)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel through any open runner: True for a live job, at once, and
        False for a terminal one."""
        r = self.runners[data.draw(st.sampled_from([r.idx for r in self.open]), label="through")]
        job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)), label="job")]
        status = self.job_row(job.id)[0]
        got = r.runner.cancel(CALLERS[job.caller], job.id)
        assert got is (status in LIVE), f"cancel of a {status} job gave {got}"
        if got:
            assert self.job_row(job.id)[0] == "cancelled"
            note("cancelled a live job")
        assert r.runner.cancel(CALLERS[1 - job.caller], job.id) is False
        self.settle()

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        """wait through any open runner: a terminal job at once, whoever ran
        it; a live one times out."""
        r = self.runners[data.draw(st.sampled_from([r.idx for r in self.open]), label="through")]
        job = self.jobs[data.draw(st.sampled_from(sorted(self.jobs)), label="job")]
        status = self.job_row(job.id)[0]
        caller = CALLERS[job.caller]
        if status in LIVE:
            with pytest.raises(TimeoutError):
                r.runner.wait(caller, job.id, timeout=0)
        else:
            assert r.runner.wait(caller, job.id, timeout=0).status == status
            assert r.runner.status(caller, job.id).status == status
        with pytest.raises(batch.JobNotFound):
            r.runner.wait(CALLERS[1 - job.caller], job.id, timeout=0)

    @rule(seconds=st.integers(1, 5))
    def tick(self, seconds: int) -> None:
        """Time passes, a second at a time, for the store and every running
        runner (each beats once a second)."""
        for _ in range(seconds):
            self.clock.tick(1.0)
            # One keeper at a time, in a fixed order: which runner takes a
            # lapsed job is then the same whenever the steps are replayed.
            for r in self.running_runners():
                r.clock.tick(1.0)
                self.keepers_idle([r])
            self.settle()
            self.look_at_owners()

    @precondition(lambda self: any(r.running for r in self.runners))
    @rule(data=st.data())
    def stop(self, data: st.DataObject) -> None:
        """A runner stalls: its clock stops (it neither beats nor, since no
        fetch of it ends meanwhile, starts anything)."""
        r = self.runners[data.draw(st.sampled_from([r.idx for r in self.running_runners()]))]
        r.stopped_at = self.clock.now

    @precondition(lambda self: any(r.stopped_at is not None and not r.closed for r in self.runners))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        """A stalled runner goes on: its clock catches up with the store's; it
        starts nothing before it renews, and it learns what it lost."""
        stalled = [r for r in self.open if r.stopped_at is not None]
        r = self.runners[data.draw(st.sampled_from([r.idx for r in stalled]), label="runner")]
        assert r.stopped_at is not None
        gap = self.clock.now - r.stopped_at
        r.stopped_at = None
        if gap:
            if gap > LAPSE:
                note("resumed after a stall past the lease")
            r.clock.tick(gap)
            self.keepers_idle([r])
        self.settle()
        self.look_at_owners()

    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        """Close a runner (its fetches in flight see the context cancelled;
        what they return is stored as for any fetch) and open a new one."""
        r = self.runners[data.draw(st.sampled_from([r.idx for r in self.open]), label="runner")]
        with contextlib.suppress(TimeoutError):
            r.runner.close(timeout=0)
        with self.lock:
            calls = self.in_order(list(r.outstanding.values()))
        for call in calls:
            assert call.ctx.cancelled()
            self.release(call, data.draw(ACTS, label=f"act of {call.key}/t{call.pos}"))
        r.runner.close(timeout=TIMEOUT)
        r.closed = True
        r.db.close()
        for call in calls:
            self.check_kept(call)
        self.open_runner()
        self.settle()
        self.look_at_owners()

    # -- invariants --------------------------------------------------------------

    @invariant()
    def every_start_held_the_lease(self) -> None:
        with self.lock:
            assert self.violations == []

    @invariant()
    def no_worker_died(self) -> None:
        for r in self.open:
            assert r.runner.statistics().workers == WORKERS

    @invariant()
    def stored_once_by_its_holder(self) -> None:
        """Every stored outcome is that of one call that ended so, for that
        very target: never another runner's over it."""
        rows = self.read("SELECT job_id, pos, status, result, error FROM targets")
        seen: set[int] = set()
        for job_id, pos, status, result, error in rows:
            if status == "pending":
                continue
            job = self.by_id[job_id]
            if status == "done":
                assert result is not None and result.startswith('{"cid":')
                cid = int(result[7:-1])
                act = "done"
            else:
                assert error is not None and error.startswith("c"), error
                cid = int(error[1:])
                act = "error"
            assert cid not in seen
            seen.add(cid)
            call = self.calls[cid]
            assert (call.key, call.pos, call.act) == (job.key, pos, act)

    @invariant()
    def hooks_add_up(self) -> None:
        """Over every runner, closed ones too: a ``target`` hook per stored
        target, a ``job`` hook per terminal job with its status, a
        ``job_seconds`` per job that ended other than cancelled."""
        stored = self.read("SELECT count(*) FROM targets WHERE status != 'pending'")[0][0]
        ended = Counter(
            s for (s,) in self.read("SELECT status FROM jobs WHERE status NOT IN (?, ?)", LIVE)
        )
        targets = jobs = seconds = 0
        statuses: Counter[str] = Counter()
        for r in self.runners:
            with r.hooks._cond:
                targets += len(r.hooks.targets)
                statuses.update(r.hooks.jobs)
                jobs += len(r.hooks.jobs)
                seconds += len(r.hooks.seconds)
        assert targets == stored
        assert statuses == ended
        assert jobs == sum(ended.values())
        assert seconds == sum(ended.values()) - ended["cancelled"]

    # -- the end -----------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.runners and all(r.runner is not None for r in self.runners):
                self.finish_everything()
        finally:
            for r in self.runners:
                if r.runner is not None:
                    for call in list(r.outstanding.values()):
                        call.act = "done"
                        call.go.set()
                    with contextlib.suppress(Exception):
                        r.runner.close(timeout=TIMEOUT)
                    r.db.close()
            self.first.close()
            self.patch.close()
            self.tmp.cleanup()

    def finish_everything(self) -> None:
        """Every runner goes on, every fetch returns: every job ends, once."""
        for r in self.open:
            if r.stopped_at is not None:
                gap = self.clock.now - r.stopped_at
                r.stopped_at = None
                r.clock.tick(gap)
                self.keepers_idle([r])
        self.settle()
        for _ in range(200):
            if not self.live_ids():
                break
            for call in sorted(self.releasable(), key=lambda c: c.cid):
                self.release(call, "done")
            self.settle()
            self.tick(1)
        assert not self.live_ids(), "jobs left live at the end"
        self.every_start_held_the_lease()
        self.stored_once_by_its_holder()
        self.hooks_add_up()
        for cid in self.expected:
            self.check_kept(self.calls[cid])


# -- the two cases the machine found, step by step --------------------------------


def keeper_at(clock: KeeperClock, seconds: float) -> None:
    """Step a runner's clock and wait until its keeper did what fell due."""
    clock.tick(seconds)
    assert within(TIMEOUT, lambda: clock.keeper_idle_at >= clock.now)


def test_outcome_in_flight_of_a_job_cancelled_elsewhere_survives_a_beat(
    tmp_path: Path, clock: Clock
) -> None:
    """SPEC 2a: the owner of a job cancelled through another runner stores
    the outcome in flight, even when it beats before the fetch returns."""
    go, started = threading.Event(), threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        started.set()
        assert go.wait(TIMEOUT)
        return "v"

    path = tmp_path / "jobs.sqlite3"
    config = batch.Config(workers=1, takeover_after=LAPSE)
    ka = KeeperClock()
    with store.open(path, clock=clock.time) as da, store.open(path, clock=clock.time) as db:
        a = batch.Runner(da, fetch, config, clock=ka)
        b = batch.Runner(db, fetch, config, clock=KeeperClock())
        try:
            job_id = a.submit(CALLERS[0], ["t0", "t1"])
            assert started.wait(TIMEOUT)
            assert b.cancel(CALLERS[0], job_id) is True
            clock.tick(1)
            keeper_at(ka, 1)  # a beats, t0 still in flight
            go.set()
        finally:
            a.close(timeout=TIMEOUT)
            b.close(timeout=TIMEOUT)
        job = db.get_job(job_id, CALLERS[0].id)
    assert job is not None
    assert (job.status, [(t.status, t.result) for t in job.targets]) == (
        "cancelled",
        [("done", '"v"'), ("pending", None)],
    )


def test_a_busy_answer_after_the_lease_was_taken_starts_nothing(
    tmp_path: Path, clock: Clock
) -> None:
    """A runner stalls with a fetch in flight; another takes the job; the
    first goes on (it renews, the job in flight is not renewed) and its
    fetch comes back busy: it must not try the target again, the job is the
    other runner's."""
    starts: list[str] = []
    gates = {"a": threading.Event(), "b": threading.Event()}
    lock = threading.Lock()

    def fetch_of(name: str) -> batch.Fetch[batch.Caller]:
        def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
            with lock:
                starts.append(name)
            assert gates[name].wait(TIMEOUT)
            raise batch.RetryLater("busy")

        return fetch

    path = tmp_path / "jobs.sqlite3"
    config = batch.Config(workers=1, retry_wait=0, resume=batch.Caller, takeover_after=LAPSE)
    ka, kb = KeeperClock(), KeeperClock()
    with store.open(path, clock=clock.time) as da, store.open(path, clock=clock.time) as db:
        a = batch.Runner(da, fetch_of("a"), config, clock=ka)
        b = batch.Runner(db, fetch_of("b"), config, clock=kb)
        try:
            job_id = a.submit(CALLERS[0], ["t0"])
            assert within(TIMEOUT, lambda: starts == ["a"])
            for _ in range(5):  # a stalls; the store and b go on
                clock.tick(1)
                keeper_at(kb, 1)
            assert within(TIMEOUT, lambda: starts == ["a", "b"])
            with contextlib.closing(sqlite3.connect(path)) as conn:
                ((owner,),) = conn.execute("SELECT lease_owner FROM jobs WHERE id = ?", (job_id,))
            assert owner == b.id
            keeper_at(ka, 5)  # a goes on and renews
            gates["a"].set()  # its fetch comes back busy
            assert within(TIMEOUT, lambda: a.statistics().live == 0), a.statistics()
            assert starts == ["a", "b"]
        finally:
            for g in gates.values():
                g.set()
            a.close(timeout=TIMEOUT)
            b.close(timeout=TIMEOUT)


OwnershipMachine.TestCase.settings = settings(
    max_examples=examples(30),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No explain phase: it replays a failure under a tracer, slowly enough,
    # with the runners' threads about, to turn a failure into a timeout.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
TestOwnershipModel = OwnershipMachine.TestCase
