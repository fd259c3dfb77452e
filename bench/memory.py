"""Scenario 6, memory: what the runner holds per live target and per live
job, and whether it lets go of it all once the jobs end.

Counted with ``tracemalloc``: Python's allocations, after a ``gc.collect()``.
SQLite's own page cache is not among them (its size is bounded, whatever
the jobs).

- 100 jobs of 100 targets held live: every fetch blocks on an event, so 4
  targets are in flight and the rest pending. Bytes per live target. Then
  the jobs are cancelled and the fetches released.
- 2,000 jobs of 1 target held the same way: bytes per live job. Then the
  fetches are released and every job runs to its end.

Retained: what is still allocated once the jobs ended, against the start;
one job has run to its end before the start, so that what the first use of
each path caches once (compiled statements) is not counted as retained.

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
import threading
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import batch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.workload import CALLER, PATIENCE, WORKERS, echo, open_runner, refs, result_json, scratch

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
class Sizes:
    """The shape measured per live target, and the one per live job."""

    many_targets: Shape
    many_jobs: Shape


FULL = Sizes(many_targets=Shape(100, 100), many_jobs=Shape(2_000, 1))
QUICK = Sizes(many_targets=Shape(20, 50), many_jobs=Shape(200, 1))


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


def run(opts: Options) -> list[Row]:
    """Bytes per live target and per live job, and retained, against the pool's."""
    sizes = QUICK if opts.quick else FULL
    targets, jobs = sizes.many_targets, sizes.many_jobs
    held = alternate(
        opts.rounds,
        {
            "targets": lambda: runner_held(targets, cancel=True),
            "targets pool": lambda: pool_held(targets.targets),
            "jobs": lambda: runner_held(jobs, cancel=False),
            "jobs pool": lambda: pool_held(jobs.targets),
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

    return [
        figure(
            f"per live target, {targets.jobs} x {targets.per_job}",
            "targets",
            Goal("median", "<", 1024),
            retained=False,
        ),
        figure("  retained once cancelled", "targets", Goal("max", "<", RETAINED), retained=True),
        figure(f"per live job, {jobs.jobs:,} x {jobs.per_job}", "jobs", None, retained=False),
        figure("  retained once they ended", "jobs", Goal("max", "<", RETAINED), retained=True),
    ]


SCENARIO = Scenario("6", "memory", run)

if __name__ == "__main__":
    from bench.run import main

    raise SystemExit(main(suite=[SCENARIO]))
