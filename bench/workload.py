"""The pieces scenarios build their workloads from: the no-op fetch, a scratch
store (``bench.engine``), a runner with a hook that counts, raw SQLite set up
like the store, and the timed drain of a batch of jobs."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import batch
import store
from bench.engine import copy_of, scratch
from store.engines import Synchronous

__all__ = [
    "BOUNDED",
    "CALLER",
    "PATIENCE",
    "STEPS",
    "WORKERS",
    "Shape",
    "Tally",
    "TargetRow",
    "advertise",
    "bounded",
    "check_done",
    "commit_result",
    "copy_of",
    "drain_rate",
    "echo",
    "open_runner",
    "open_store",
    "placed_rate",
    "raw_sqlite",
    "refs",
    "result_json",
    "runner_rate",
    "scratch",
    "submit",
    "targets_table",
    "timed_calls",
]

#: The workers of every runner and every thread pool measured: the runner's
#: default, and twice the cores of the machine the figures are taken on.
WORKERS = 4

#: Whoever submits the benchmark's jobs.
CALLER = batch.Caller("bench")

#: The longest any wait for a workload may take before the run gives up.
PATIENCE = 120.0


def echo(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> dict[str, str]:
    """The no-op fetch: a small dict, stored as about 20 bytes of JSON."""
    return {"ref": target.ref}


def result_json(ref: str) -> str:
    """The JSON the runner stores for :func:`echo` of ``ref``, byte for byte, so
    that a baseline writes rows of the same size."""
    return json.dumps({"ref": ref}, separators=(",", ":"), ensure_ascii=False)


def refs(job: int, n: int) -> list[str]:
    """The refs of the ``job``-th job of a workload: ``n`` distinct strings."""
    return [f"job{job}-{i}" for i in range(n)]


def raw_sqlite(path: str | Path) -> sqlite3.Connection:
    """A connection set up as the store sets up its own: WAL, synchronous=NORMAL,
    no implicit transactions, shareable between threads (under a lock), the
    schema's functions defined."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    # The schema's triggers read the time of the change, as the store's
    # own connections define it.
    conn.create_function("store_now", 0, time.time)
    return conn


class Tally(batch.Hooks):
    """Hooks that count stored targets and follow the live-job and in-flight
    counts, so the benchmark can wait for a workload to reach a point without
    polling.

    One thread waits at a time. The hooks run under the runner's lock, and
    take the tally's own only while a thread waits (its ``_until`` is set,
    under that lock, before it looks at the counts: a hook that misses it
    changed a count the waiter then reads). They notify only once the
    awaited point is reached, so a waiting benchmark does not wake on every
    target and take turns away from the workers; and the runner pays next
    to nothing for being counted.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._until: Callable[[], bool] | None = None
        self.stored = 0
        self.live_now = 0
        self.inflight_now = 0

    def depth(self, live: int) -> None:
        self.live_now = live
        self._check()

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        self.stored += 1  # the runner's lock is held: no two hooks at once
        self._check()

    def inflight(self, n: int) -> None:
        self.inflight_now = n
        self._check()

    def _check(self) -> None:
        # The awaited point is looked at without the tally's lock: the
        # waiter holds it from its own look until it waits, so a hook that
        # sees the point reached notifies once it waits.
        until = self._until
        if until is not None and until():
            with self._cond:
                self._cond.notify_all()

    def wait_until(self, reached: Callable[[], bool], timeout: float = PATIENCE) -> None:
        """Block until ``reached()`` (read under the tally's lock) is true;
        ``TimeoutError`` if ``timeout`` seconds pass first."""
        with self._cond:
            self._until = reached
            try:
                if not self._cond.wait_for(reached, timeout):
                    raise TimeoutError(f"the workload did not get there in {timeout:g} s")
            finally:
                self._until = None

    def wait_stored(self, n: int, timeout: float = PATIENCE) -> None:
        """Block until ``n`` targets in all have been stored."""
        self.wait_until(lambda: self.stored >= n, timeout)

    def wait_inflight(self, n: int) -> None:
        """Block until exactly ``n`` targets are in flight."""
        self.wait_until(lambda: self.inflight_now == n)

    def wait_ended(self) -> None:
        """Block until no job is live: every one has left the rotation."""
        self.wait_until(lambda: self.live_now == 0)


@contextlib.contextmanager
def open_runner(
    path: str,
    fetch: batch.Fetch[batch.Caller],
    synchronous: Synchronous = "NORMAL",
    **config: Any,
) -> Iterator[tuple[batch.Runner[batch.Caller], Tally]]:
    """A store at ``path`` and a runner on it with :data:`WORKERS` workers (or
    ``config``'s), counted by a :class:`Tally`; both closed afterwards."""
    tally = Tally()
    settings = dataclasses.replace(batch.Config(workers=WORKERS), **config)
    with (
        store.open(path, synchronous=synchronous) as db,
        batch.Runner(db, fetch, settings, hooks=tally) as runner,
    ):
        yield runner, tally


def drain_rate(
    runner: batch.Runner[batch.Caller],
    tally: Tally,
    jobs: Sequence[list[str]],
    budget: float = PATIENCE,
    *,
    many: bool = False,
) -> float:
    """Targets stored per second: from the first submit of ``jobs`` until the
    last of their targets is stored, or until ``budget`` seconds have passed
    (then over the targets stored by then). Submitting is part of the work:
    one ``submit`` per job, or (``many``) one ``submit_many`` for all."""
    want = tally.stored + sum(len(job) for job in jobs)
    before = tally.stored
    start = time.perf_counter()
    if many:
        runner.submit_many(CALLER, jobs)
    for job in () if many else jobs:
        runner.submit(CALLER, job)
    with contextlib.suppress(TimeoutError):  # too slow: measured over the budget
        tally.wait_stored(want, budget)
    elapsed = time.perf_counter() - start
    return (tally.stored - before) / elapsed


#: Seconds from launching processes to their common start
#: (:func:`together`): each has its store and runner up by then.
SETTLE = 2.0


def begin_at(when: float) -> None:
    """In a process of :func:`together`: wait until ``time.time()`` reaches
    ``when``, the moment every process begins."""
    while time.time() < when:
        time.sleep(0.001)  # allow-sleep: every process begins at one moment


def together(child: str, argvs: Sequence[Sequence[str]]) -> float:
    """Run a process of Python code ``child`` per argument list, all
    beginning their work at one moment (passed as their last argument, a
    ``time.time()``), each printing the time it finished; returns the
    seconds from that moment to the last finish."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from bench.measure import REPO  # noqa: PLC0415

    start_at = time.time() + SETTLE
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", child, *argv, str(start_at)],
            stdout=subprocess.PIPE,
            cwd=REPO,
            text=True,
        )
        for argv in argvs
    ]
    ends = [p.communicate(timeout=PATIENCE)[0].split() for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{sum(bool(p.returncode) for p in procs)} of {len(procs)} failed")
    return max(float(end[-1]) for end in ends) - start_at


# -- what several scenarios measure alike ---------------------------------------


def timed_calls(calls: int, call: Callable[[], object]) -> float:
    """Median seconds of one of ``calls`` calls of ``call``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: One row of the baselines' table: job id, position, ref.
TargetRow = tuple[str, int, str]


def runner_rate(
    jobs: int, per_job: int, synchronous: Synchronous = "NORMAL", *, many: bool = False
) -> float:
    """Targets per second of the runner: ``jobs`` jobs of ``per_job`` no-op
    targets, submitted at once (each by ``submit``, or all by one
    ``submit_many``) to an idle runner on a new store file."""
    work = [refs(j, per_job) for j in range(jobs)]
    with (
        scratch() as path,
        open_runner(path, echo, synchronous, max_targets=per_job) as (runner, tally),
    ):
        return drain_rate(runner, tally, work, many=many)


@contextlib.contextmanager
def targets_table(jobs: int, per_job: int) -> Iterator[tuple[sqlite3.Connection, list[TargetRow]]]:
    """A new file with a table shaped like the store's ``targets`` (job ids of
    the runner's length, the same refs, every row pending), and its rows."""
    rows = [(f"{j:032x}", i, ref) for j in range(jobs) for i, ref in enumerate(refs(j, per_job))]
    with scratch() as path:
        conn = raw_sqlite(path)
        try:
            conn.execute(
                "CREATE TABLE targets (job_id TEXT, pos INTEGER, ref TEXT,"
                " status TEXT NOT NULL DEFAULT 'pending', result TEXT,"
                " PRIMARY KEY (job_id, pos)) WITHOUT ROWID"
            )
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO targets (job_id, pos, ref) VALUES (?, ?, ?)", rows)
            conn.execute("COMMIT")
            yield conn, rows
        finally:
            conn.close()


def check_done(conn: sqlite3.Connection, rows: list[TargetRow]) -> None:
    """Make sure the baseline did all its work: every row is stored."""
    (done,) = conn.execute("SELECT count(*) FROM targets WHERE status = 'done'").fetchone()
    if done != len(rows):
        raise RuntimeError(f"the baseline stored {done} of {len(rows)} rows")


def commit_result(
    conn: sqlite3.Connection, lock: threading.Lock, row: TargetRow, result: str
) -> None:
    """Store one target's result as its own transaction, as the runner does."""
    job_id, pos, _ = row
    with lock:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "UPDATE targets SET status = 'done', result = ? WHERE job_id = ? AND pos = ?",
            (result, job_id, pos),
        )
        conn.execute("COMMIT")


#: Every run: one step any node can take, so each holds exactly one node.
STEPS = [store.Step("work", "exec", {"linux"})]


def open_store(path: str, synchronous: Synchronous = "NORMAL") -> store.Store:
    """The store as measured: one node per run."""
    return store.open(path, max_leases_per_run=1, synchronous=synchronous)


def advertise(db: store.Store, first: int, last: int) -> None:
    """Advertise nodes ``first`` to ``last - 1``, any of which can take any run."""
    for i in range(first, last):
        db.advertise(store.Advert(f"n{i:05d}", f"box-{i}", {"linux"}))


def submit(db: store.Store, runs: int, state: str) -> None:
    """Submit ``runs`` runs, each of which must end up in ``state``."""
    for _ in range(runs):
        view = db.submit_run(STEPS)
        if view.state != state:
            raise RuntimeError(f"a run went {view.state}, not {state}: the file is not as built")


def placed_rate(runs: int, synchronous: Synchronous = "NORMAL") -> dict[str, float]:
    """(e) in runs per second: ``submit_run`` placing each run at once on an
    idle node."""
    with scratch() as path, open_store(path, synchronous) as db:
        advertise(db, 0, runs)
        start = time.perf_counter()
        submit(db, runs, "RUNNING")
        return {"placed": runs / (time.perf_counter() - start)}


@dataclass(frozen=True, slots=True)
class Shape:
    """Workers, each fetch's latency in seconds, and the work."""

    workers: int
    latency: float
    jobs: int
    per_job: int

    @property
    def ideal(self) -> float:
        """Targets per second with every worker busy all the time."""
        return self.workers / self.latency

    @property
    def name(self) -> str:
        return f"{self.workers} workers x {self.latency * 1000:g} ms"


#: A runner holding ``max_live`` jobs while more wait in its store (a copy
#: of the one given), until it stored ``stored`` targets. Measured (the
#: last argument): ``resident``, the growth of the process's resident
#: memory from before the runner opened, then its rate over the targets;
#: or ``traced``, the most bytes of Python's allocations it held at once
#: on the way (tracing slows it, so no rate). Printed: bytes, rate.
BOUNDED = """
import sys, time, tracemalloc
import batch, store
from bench.workload import Tally, echo
path, max_live, stored, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

tally = Tally()
with store.open(path) as db:
    before = resident()
    if how == "traced":
        tracemalloc.start()
    config = batch.Config(max_live=max_live, resume=batch.Caller)
    with batch.Runner(db, echo, config, hooks=tally):
        start = time.perf_counter()
        tally.wait_stored(stored)
        rate = stored / (time.perf_counter() - start)
        if how == "traced":
            print(tracemalloc.get_traced_memory()[1], 0)
        else:
            print(resident() - before, rate)
"""


def bounded(base: str, max_live: int, stored: int, *, traced: bool = False) -> tuple[float, float]:
    """Resident bytes grown and rate of a runner under ``max_live`` on a
    copy of the store ``base``, in a process of its own (what it holds is
    all the runner's); ``traced``: the most bytes of Python's allocations
    it held at once instead, and no rate (0).

    The resident figure is what the process costs the machine, SQLite's
    page cache and the allocator's arenas included; between two identical
    runs it moves by a third (the arenas, mostly). The traced peak counts
    only what the runner's own structures held, and moves by a tenth: the
    one to compare two stores by. (What it holds at the end moves more:
    it depends on where in a refill the last target fell.)"""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from bench.measure import REPO  # noqa: PLC0415

    how = "traced" if traced else "resident"
    with copy_of(base) as path:
        out = subprocess.run(
            [sys.executable, "-c", BOUNDED, path, str(max_live), str(stored), how],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=PATIENCE,
        ).stdout.split()
    return float(out[0]), float(out[1])
