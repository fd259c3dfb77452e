"""Thousands of jobs on eight workers, with cancels while they run: every job
ends as its targets imply, the hooks count exactly what the store holds, and
no caller object outlives its job."""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

import batch
import store

WORKERS = 8
JOBS = 2000
SEED = 20_240_601
#: How long all the jobs together may take to end.
BUDGET = 90.0
TIMEOUT = 10.0
RETRY_WAIT = 0.001
RETRY_FOR = 0.02
SECRET = "stress-secret-91d4"
ENDED = ("done", "failed", "partial", "cancelled")

#: What a target's fetch does: return a value; raise TargetError; come back
#: busy once, then return a value; come back busy every time; raise something
#: unexpected.
KINDS = ("done", "error", "busy_once", "busy_forever", "unexpected")
WEIGHTS = (50, 15, 15, 5, 15)
#: The error Hooks.target gets for a stored target of each kind, by type name.
HOOK_ERR = {
    "done": "None",
    "busy_once": "None",
    "error": "TargetError",
    "busy_forever": "RetryLater",
    "unexpected": "RuntimeError",
}


class Owner:
    """A caller object of its own for every job, so that each can be watched
    with a weak reference."""

    __slots__ = ("__weakref__", "id")

    def __init__(self, owner_id: str) -> None:
        self.id = owner_id


@dataclass(frozen=True)
class Plan:
    owner: str
    kinds: tuple[str, ...]

    def refs(self, k: int) -> list[str]:
        return [f"{k}/{i}/{kind}" for i, kind in enumerate(self.kinds)]

    @property
    def status(self) -> str:
        done = sum(kind in ("done", "busy_once") for kind in self.kinds)
        if done == len(self.kinds):
            return "done"
        return "failed" if done == 0 else "partial"


def expected(ref: str, kind: str, got: batch.TargetStatus) -> bool:
    """Whether a stored target is what a fetch of ``kind`` leaves."""
    seen = (got.status, got.result, got.error)
    if kind == "done":
        return seen == ("done", {"ref": ref}, None) and got.hint is None
    if kind == "busy_once":
        return seen == ("done", {"ref": ref, "try": 2}, None) and got.hint is None
    if kind == "error":
        return seen == ("failed", None, f"no {ref}") and got.hint == f"see {ref}"
    if kind == "busy_forever":
        return seen == ("failed", None, f"busy {ref}")
    return seen == ("failed", None, "internal error") and got.hint is None


class Fetch:
    """Does what each ref's kind says; counts attempts; records a violation
    when a job has two targets in flight, goes back to an earlier target or
    skips one, or when the caller handed in is not the job's own object."""

    def __init__(self, plans: list[Plan], owners: list[weakref.ref[Owner]]) -> None:
        self.plans = plans
        self.owners = owners
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()
        self.inflight: set[int] = set()
        self.last: dict[int, int] = {}
        self.violations: list[str] = []
        self.barrier = threading.Barrier(WORKERS)

    def __call__(self, ctx: batch.Context, caller: Owner, target: batch.Target) -> object:
        ref = target.ref
        if ref.startswith("barrier/"):
            # Returns only once every worker is inside a fetch.
            self.barrier.wait(TIMEOUT)
            return None
        k_text, i_text, kind = ref.split("/")
        k, i = int(k_text), int(i_text)
        with self.lock:
            if caller is not self.owners[k]():
                self.violations.append(f"{ref}: fetched with another caller object")
            if k in self.inflight:
                self.violations.append(f"{ref}: began with another target of job {k} in flight")
            last = self.last.get(k, 0)
            if not last <= i <= last + 1:
                self.violations.append(f"{ref}: began after target {last}")
            self.inflight.add(k)
            self.last[k] = i
            self.attempts[ref] += 1
            n = self.attempts[ref]
        try:
            return act(ref, kind, n)
        finally:
            with self.lock:
                self.inflight.discard(k)


def act(ref: str, kind: str, n: int) -> object:
    if kind == "error":
        raise batch.TargetError(f"no {ref}", hint=f"see {ref}")
    if kind == "busy_forever" or (kind == "busy_once" and n == 1):
        raise batch.RetryLater(f"busy {ref}")
    if kind == "unexpected":
        raise RuntimeError(SECRET)
    return {"ref": ref} if kind == "done" else {"ref": ref, "try": n}


class Tally(batch.Hooks):
    """Counts hook calls. Keeps no exception: one holds its traceback, and that
    the frames of the fetch, caller and all."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.depth_last = 0
        self.inflight_last = 0
        self.jobs: Counter[str] = Counter()
        self.seconds = 0
        self.targets: Counter[str] = Counter()
        self.bad: list[str] = []

    def depth(self, live: int) -> None:
        with self.cond:
            if abs(live - self.depth_last) != 1:
                self.bad.append(f"depth {self.depth_last} -> {live}")
            self.depth_last = live
            self.cond.notify_all()

    def inflight(self, n: int) -> None:
        with self.cond:
            if abs(n - self.inflight_last) != 1 or not 0 <= n <= WORKERS:
                self.bad.append(f"inflight {self.inflight_last} -> {n}")
            self.inflight_last = n

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        with self.cond:
            self.targets["None" if err is None else type(err).__name__] += 1
            if seconds < 0 or (nbytes > 0) != (err is None):
                self.bad.append(f"target {type(err).__name__} {seconds} {nbytes}")

    def job(self, status: str) -> None:
        with self.cond:
            self.jobs[status] += 1

    def job_seconds(self, seconds: float) -> None:
        with self.cond:
            self.seconds += 1
            if seconds < 0:
                self.bad.append(f"job_seconds {seconds}")


class LogTally(logging.Handler):
    """Counts the runner's log records and keeps their messages only (a record
    keeps its exception, and so the caller the fetch was given)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.fetch_errors = 0
        self.others: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("fetch of ") and record.exc_info is not None:
            self.fetch_errors += 1
        else:
            self.others.append(message)


def check_job(
    k: int, plan: Plan, job: batch.Job, cancelled: bool, attempts: Counter[str]
) -> Counter[str]:
    """Job ``k`` as stored: ended as planned, or cancelled with a stored prefix
    of its targets as planned and the rest pending. Returns the kinds stored."""
    refs = plan.refs(k)
    assert [t.target.ref for t in job.targets] == refs
    statuses = [t.status for t in job.targets]
    if cancelled:
        assert job.status == "cancelled", f"job {k}: {job.status}"
        m = statuses.count("pending")
        assert statuses[len(statuses) - m :] == ["pending"] * m, f"job {k}: {statuses}"
    else:
        assert job.status == plan.status, f"job {k}: {job.status}; planned {plan.status}"
        assert "pending" not in statuses
    stored: Counter[str] = Counter()
    first_pending = True
    for ref, kind, got in zip(refs, plan.kinds, job.targets, strict=True):
        tries = attempts[ref]
        assert SECRET not in f"{got.error} {got.hint}"
        if got.status == "pending":
            assert (got.result, got.error, got.hint) == (None, None, None), ref
            # Only the target in flight when its job was cancelled was tried,
            # and only a busy one stays pending after a try.
            allowed = {"busy_once": 1, "busy_forever": tries}.get(kind, 0)
            assert tries <= (allowed if first_pending else 0), f"{ref}: {tries} tries"
            first_pending = False
            continue
        assert expected(ref, kind, got), f"{ref}: {got}"
        stored[kind] += 1
        want = {"busy_once": 2, "busy_forever": max(tries, 2)}.get(kind, 1)
        assert tries == want, f"{ref}: {tries} tries"
    return stored


def make_plans(rng: random.Random) -> list[Plan]:
    return [
        Plan(f"c{rng.randrange(16)}", tuple(rng.choices(KINDS, WEIGHTS, k=rng.randint(1, 20))))
        for _ in range(JOBS)
    ]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_many_jobs_end_as_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.monotonic()
    rng = random.Random(SEED)
    plans = make_plans(rng)
    owners: list[weakref.ref[Owner]] = []
    fetch = Fetch(plans, owners)
    hooks = Tally()
    logs = LogTally()
    logger = logging.getLogger("batch")
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(logs)
    config = batch.Config(workers=WORKERS, retry_wait=RETRY_WAIT, retry_for=RETRY_FOR)
    ids: list[str] = []
    cancels: dict[int, list[bool]] = {}
    try:
        with (
            store.open(tmp_path / "jobs.sqlite3") as db,
            batch.Runner(db, fetch, config, hooks=hooks) as runner,
        ):

            def cancel_some(count: int, recent: int) -> None:
                """Cancel ``count`` jobs among the ``recent`` last submitted,
                most of them still live."""
                for _ in range(count):
                    k = rng.randrange(max(0, len(ids) - recent), len(ids))
                    ok = runner.cancel(Owner(plans[k].owner), ids[k])
                    cancels.setdefault(k, []).append(ok)
                    # Refused: the job had ended, and the store says so.
                    after = runner.status(Owner(plans[k].owner), ids[k]).status
                    assert (after == "cancelled") if ok else (after in ENDED), f"job {k}: {after}"

            for k, plan in enumerate(plans):
                owner = Owner(plan.owner)
                owners.append(weakref.ref(owner))
                ids.append(runner.submit(owner, plan.refs(k)))
                del owner
                if rng.random() < 0.1:
                    cancel_some(1, recent=30)
            cancel_some(JOBS // 20, recent=JOBS // 10)
            submitted = time.monotonic()

            deadline = time.monotonic() + BUDGET
            for k, plan in enumerate(plans):
                left = max(0.0, deadline - time.monotonic())
                job = runner.wait(Owner(plan.owner), ids[k], timeout=left)
                assert job.terminal, f"job {k}: {job.status}"
            ended = time.monotonic()
            # The last job out of the rotation: every target is stored and
            # every hook has been called.
            with hooks.cond:
                empty = hooks.cond.wait_for(lambda: hooks.depth_last == 0, TIMEOUT)
                assert empty, f"{hooks.depth_last} jobs still live after all ended"
                seen_jobs, seen_seconds = Counter(hooks.jobs), hooks.seconds
                seen_targets = Counter(hooks.targets)
            assert fetch.violations == []
            assert hooks.bad == []
            final = [runner.status(Owner(p.owner), ids[k]) for k, p in enumerate(plans)]

            # One fetch on every worker at once: each has left the turn that
            # held its last job, so nothing of those jobs is left on a stack.
            keeper = Owner("keeper")
            extra = [runner.submit(keeper, [f"barrier/{w}"]) for w in range(WORKERS)]
            for job_id in extra:
                assert runner.wait(keeper, job_id, timeout=TIMEOUT).status == "done"
            gc.collect()
            alive = sum(ref() is not None for ref in owners)
            assert alive == 0, f"{alive} caller objects outlived their jobs"
            stats = runner.statistics()
    finally:
        logger.removeHandler(logs)
    elapsed = time.monotonic() - start
    print(
        f"{JOBS} jobs, {sum(len(p.kinds) for p in plans)} targets, {WORKERS} workers:"
        f" submitted in {submitted - start:.1f}s, all ended at {ended - start:.1f}s,"
        f" {elapsed:.1f}s in all"
    )

    assert fetch.violations == []
    assert hooks.bad == []
    assert (stats.live, stats.inflight, stats.waiting_retry) == (0, 0, 0)
    assert (hooks.depth_last, hooks.inflight_last) == (0, 0)

    cancelled: set[int] = set()
    for k, results in cancels.items():
        assert results.count(True) <= 1, f"job {k}: cancelled twice"
        if True in results:
            cancelled.add(k)
    stored: Counter[str] = Counter()
    for k, (plan, job) in enumerate(zip(plans, final, strict=True)):
        stored += check_job(k, plan, job, k in cancelled, fetch.attempts)

    midway = sum(
        0 < [t.status for t in final[k].targets].count("pending") < len(plans[k].kinds)
        for k in cancelled
    )
    print(
        f"cancel: {sum(map(len, cancels.values()))} calls, {len(cancelled)} jobs cancelled,"
        f" {midway} of them midway; {sum(stored.values())} targets stored"
    )

    assert seen_jobs == Counter(job.status for job in final)
    assert seen_seconds == JOBS - len(cancelled)
    want_targets: Counter[str] = Counter()
    for kind, n in stored.items():
        want_targets[HOOK_ERR[kind]] += n
    assert seen_targets == want_targets
    assert hooks.jobs["done"] == seen_jobs["done"] + WORKERS
    assert logs.fetch_errors == stored["unexpected"]
    assert logs.others == []
