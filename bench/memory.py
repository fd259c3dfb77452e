"""Scenario 6, memory: what the runner holds per live target and per live
job, and whether it lets go of it all once the jobs end.

Counted with ``tracemalloc``: Python's allocations, after a ``gc.collect()``.
SQLite's own page cache is not among them (its size is bounded, whatever
the jobs).

- 100 jobs of 100 targets held live: every fetch blocks on an event, so 4
  targets are in flight and the rest pending. Bytes per live target. Then
  the jobs are cancelled and the fetches released. The same for one job of
  100,000 targets (``Config.max_targets``' default): bytes per target
  waiting its turn.
- 2,000 jobs of 1 target held the same way: bytes per live job. Then the
  fetches are released and every job runs to its end.

Retained: what is still allocated once the jobs ended, against the start;
one job has run to its end before the start, so that what the first use of
each path caches once (compiled statements) is not counted as retained.

A runner under ``Config(max_live=1000)`` while 1,000,000 jobs wait in its
store (any runner with room may take them, in submit order): the growth
of its process's resident memory (a process of its own), and its rate
against the same with 30,000 waiting: what it holds, and the cost of a
pick, depend on the jobs it holds, not on those waiting.

Baseline: a ``ThreadPoolExecutor(4)``, its threads started beforehand as the
runner's are, given one task per target, each blocking the same way: what a
plain pool holds per queued task (a future and a work item), and keeps
after. On both sides the refs exist before counting starts (they are the
caller's), and the list of handles the caller keeps (job ids, futures) is
not counted; what the handles point to is.

    python -m bench.memory [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import gc
import sys
import tempfile
import threading
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import batch
import store
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import (
    CALLER,
    PATIENCE,
    WORKERS,
    bounded,
    echo,
    open_runner,
    raw_sqlite,
    refs,
    result_json,
    scratch,
)

__all__ = ["SCENARIO"]


#: Bytes still allocated after the jobs ended that count as nothing. The
#: sqlite3 module keeps a weak reference (80 B) to each cursor it made and
#: sweeps the dead ones only every 200 cursors: up to 16 KB that come and go
#: whatever the jobs. What grows with the jobs that were live shows above it.
RETAINED = 32 * 1024


@dataclass(frozen=True, slots=True)
class Shape:
    """Jobs held live at once, and their targets each."""

    jobs: int
    per_job: int

    @property
    def targets(self) -> int:
        """Targets held live in all."""
        return self.jobs * self.per_job


@dataclass(frozen=True, slots=True)
class Bound:
    """A runner under ``max_live`` with ``waiting`` jobs of one target
    waiting in its store (against ``few``), measured over ``stored``."""

    max_live: int
    waiting: int
    few: int
    stored: int


@dataclass(frozen=True, slots=True)
class Sizes:
    """The shape measured per live target, one job as long as
    ``Config.max_targets`` allows by default, the one per live job, and the
    runner under max_live."""

    many_targets: Shape
    long_job: Shape
    many_jobs: Shape
    bound: Bound


FULL = Sizes(
    many_targets=Shape(100, 100),
    long_job=Shape(1, batch.Config().max_targets),
    many_jobs=Shape(2_000, 1),
    bound=Bound(max_live=1_000, waiting=1_000_000, few=30_000, stored=20_000),
)
QUICK = Sizes(
    many_targets=Shape(20, 50),
    long_job=Shape(1, 10_000),
    many_jobs=Shape(200, 1),
    bound=Bound(max_live=100, waiting=20_000, few=3_000, stored=2_000),
)


@dataclass(frozen=True, slots=True)
class Held:
    """Bytes held per target while live, and bytes left once all ended."""

    per_target: float
    retained: float


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """Trace Python's allocations for the duration."""
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def traced() -> int:
    """Bytes Python has allocated and not freed since tracing started."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def runner_held(shape: Shape, cancel: bool) -> Held:
    """What a runner holds for ``shape`` live; then either cancel every job
    (``cancel``) or let every target be fetched, and what is left."""
    release = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        if not target.ref.startswith("warm"):
            release.wait(PATIENCE)
        return echo(ctx, caller, target)

    work = [refs(j, shape.per_job) for j in range(shape.jobs)]
    with (
        tracing(),
        scratch() as path,
        open_runner(path, fetch, max_targets=shape.per_job) as (runner, tally),
    ):
        runner.wait(CALLER, runner.submit(CALLER, ["warm"]), timeout=PATIENCE)
        start = traced()
        ids = [runner.submit(CALLER, job) for job in work]
        tally.wait_inflight(min(WORKERS, shape.jobs))
        live = traced() - start - sys.getsizeof(ids)
        if cancel:
            for job_id in ids:
                runner.cancel(CALLER, job_id)
        del ids
        release.set()
        tally.wait_ended()
        runner.statistics()  # under the runner's lock: its last worker let go of the jobs
        return Held(live / shape.targets, traced() - start)


def pool_held(tasks: int) -> Held:
    """What a thread pool holds for ``tasks`` blocked tasks, and keeps once
    they all returned."""
    release = threading.Event()
    running = threading.Semaphore(0)
    all_threads = threading.Barrier(WORKERS)

    def task(ref: str) -> str:
        running.release()
        release.wait(PATIENCE)
        return result_json(ref)

    work = refs(0, tasks)
    with tracing(), ThreadPoolExecutor(WORKERS) as pool:
        wait([pool.submit(all_threads.wait, PATIENCE) for _ in range(WORKERS)])
        start = traced()
        futures: list[Future[str]] = [pool.submit(task, ref) for ref in work]
        if not all(running.acquire(timeout=PATIENCE) for _ in range(min(WORKERS, tasks))):
            raise TimeoutError("the pool did not start its tasks")
        live = traced() - start - sys.getsizeof(futures)
        release.set()
        if wait(futures, timeout=PATIENCE).not_done:
            raise TimeoutError("the pool did not finish its tasks")
        del futures
        return Held(live / tasks, traced() - start)


def waiting_store(path: Path, jobs: int) -> None:
    """A store file where ``jobs`` jobs of one target wait for any runner
    with room (submitted through no runner), written with raw SQL."""
    store.open(path).close()
    conn = raw_sqlite(path)
    try:
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, ntargets)"
            " VALUES (?, ?, 'queued', 1, 1, 1, 1)",
            ((f"{i:032x}", CALLER.id) for i in range(jobs)),
        )
        conn.executemany(
            "INSERT INTO targets (job_id, pos, ref) VALUES (?, 0, ?)",
            ((f"{i:032x}", f"job{i}-0") for i in range(jobs)),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def run(opts: Options) -> list[Row]:
    """Bytes per live target and per live job, and retained, against the
    pool's; a runner under max_live with many jobs waiting."""
    sizes = QUICK if opts.quick else FULL
    targets, jobs, bound = sizes.many_targets, sizes.many_jobs, sizes.bound
    with tempfile.TemporaryDirectory(prefix="bench-") as d:
        many, few = Path(d, "many.sqlite3"), Path(d, "few.sqlite3")
        waiting_store(many, bound.waiting)
        waiting_store(few, bound.few)
        held: dict[str, list[Any]] = alternate(
            opts.rounds,
            {
                "targets": lambda: runner_held(targets, cancel=True),
                "targets pool": lambda: pool_held(targets.targets),
                "long": lambda: runner_held(sizes.long_job, cancel=True),
                "jobs": lambda: runner_held(jobs, cancel=False),
                "jobs pool": lambda: pool_held(jobs.targets),
                "many": lambda: bounded(str(many), bound.max_live, bound.stored),
                "few": lambda: bounded(str(few), bound.max_live, bound.stored),
            },
        )

    def figure(what: str, key: str, goal: Goal | None, *, retained: bool) -> Figure:
        def bytes_of(k: str) -> list[float]:
            return [h.retained if retained else h.per_target for h in held[k]]

        name = "retained" if retained else "per live target"
        pool = f"ThreadPoolExecutor(4), {name}"
        return Figure(
            "6",
            what,
            "B",
            Series(f"Runner, {name}", bytes_of(key)),
            Series(pool, bytes_of(f"{key} pool")),
            goal,
        )

    waiting = f"{bound.waiting:,} waiting"
    return [
        Figure(
            "6",
            f"{waiting}, max_live={bound.max_live:,}",
            "B",
            Series(
                f"resident memory grown, runner under max_live={bound.max_live:,}",
                [rss for rss, _ in held["many"]],
            ),
            goal=Goal("median", "<", 100 * 1024 * 1024),
        ),
        Figure(
            "6",
            f"  rate, {waiting} vs {bound.few:,}",
            "/s",
            Series(f"{waiting}", [rate for _, rate in held["many"]]),
            Series(f"{bound.few:,} waiting", [rate for _, rate in held["few"]]),
            Goal("ratio", ">=", 0.8),
        ),
        figure(
            f"per live target, {targets.jobs} x {targets.per_job}",
            "targets",
            Goal("median", "<", 1024),
            retained=False,
        ),
        figure("  retained once cancelled", "targets", Goal("max", "<", RETAINED), retained=True),
        Figure(
            "6",
            f"per waiting target, 1 job of {sizes.long_job.per_job:,}",
            "B",
            Series("Runner, per target of one long job", [h.per_target for h in held["long"]]),
            goal=Goal("median", "<", 1024),
        ),
        figure(f"per live job, {jobs.jobs:,} x {jobs.per_job}", "jobs", None, retained=False),
        figure("  retained once they ended", "jobs", Goal("max", "<", RETAINED), retained=True),
    ]


SCENARIO: Scenario = join(Scenario("6", "memory", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
