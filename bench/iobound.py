"""Scenario 7, many I/O-bound workers: what users run. Each fetch waits on
the network (here: sleeps a fixed latency, releasing the interpreter as a
socket read does), with dozens to hundreds of worker threads, on jobs of 20
targets each.

Shapes:

- 256 workers, each fetch 50 ms, 1,000 jobs of 20;
- 64 workers, each fetch 10 ms, 500 jobs of 20;
- an ``async def`` fetch awaiting 50 ms, 1,000 in flight on the runner's
  event loop (``workers=1000``), 1,000 jobs of 20: what one process can keep
  in flight without a thread per fetch.

Against two references measured or computed in the same rounds:

- the thread pool: ``ThreadPoolExecutor(workers)``, one task per target,
  each waiting the same latency, then committing its JSON result to SQLite
  as scenario 1's naive baseline does (no fairness, no serial rule);
- the ideal: ``workers / latency`` targets per second, every worker busy
  all the time.

For the async runner, also the process's CPU time per target stored,
against ``1 s / ideal``: what one core (the interpreter's lock) can spend
per target at the ideal rate. Above it, the ideal is out of reach however
the fetches wait.

    python -m bench.iobound [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import batch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import (
    Shape,
    TargetRow,
    check_done,
    commit_result,
    drain_rate,
    open_runner,
    refs,
    result_json,
    scratch,
    targets_table,
)

__all__ = ["SCENARIO"]


FULL = (Shape(256, 0.05, 1_000, 20), Shape(64, 0.01, 500, 20))
QUICK = (Shape(256, 0.05, 200, 10), Shape(64, 0.01, 100, 10))
#: The async runner: 1,000 fetches in flight, each awaiting 50 ms.
ASYNC = Shape(1_000, 0.05, 1_000, 20)
ASYNC_QUICK = Shape(1_000, 0.05, 1_000, 4)


def waiting(latency: float) -> batch.Fetch[batch.Caller]:
    """A fetch that waits ``latency`` seconds, as on the network, and returns
    what scenario 1's no-op fetch returns."""

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        time.sleep(latency)  # allow-sleep: the upstream's latency is the workload
        return {"ref": target.ref}

    return fetch


def waiting_async(latency: float) -> batch.Fetch[batch.Caller]:
    """:func:`waiting` as an ``async def``: it awaits the latency."""

    async def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        await asyncio.sleep(latency)
        return {"ref": target.ref}

    return fetch


def runner_rate(shape: Shape, *, run_async: bool = False) -> float:
    """Targets per second of a runner of ``shape.workers`` workers (or, with
    an async fetch, that many fetches in flight on its event loop)."""
    return runner_costs(shape, run_async=run_async)["rate"]


def runner_costs(shape: Shape, *, run_async: bool = False) -> dict[str, float]:
    """:func:`runner_rate` as ``rate``, and the process's CPU time per target
    stored meanwhile, in microseconds, as ``cpu``."""
    work = [refs(j, shape.per_job) for j in range(shape.jobs)]
    fetch = (waiting_async if run_async else waiting)(shape.latency)
    with (
        scratch() as path,
        open_runner(path, fetch, workers=shape.workers) as (runner, tally),
    ):
        cpu = time.process_time()
        rate = drain_rate(runner, tally, work, many=True)
        cpu = time.process_time() - cpu
        return {"rate": rate, "cpu": cpu / (shape.jobs * shape.per_job) * 1e6}


def pool_rate(shape: Shape) -> float:
    """Targets per second of ``ThreadPoolExecutor(shape.workers)``: each task
    waits the latency, then commits its result."""
    with targets_table(shape.jobs, shape.per_job) as (conn, rows):
        lock = threading.Lock()

        def task(row: TargetRow) -> None:
            time.sleep(shape.latency)  # allow-sleep: the same latency as the runner's fetch
            commit_result(conn, lock, row, result_json(row[2]))

        start = time.perf_counter()
        with ThreadPoolExecutor(shape.workers) as pool:
            for row in rows:
                pool.submit(task, row)
        rate = len(rows) / (time.perf_counter() - start)
        check_done(conn, rows)
        return rate


def run(opts: Options) -> list[Row]:
    """Each shape's runner against the pool and against the ideal; the
    async runner against the same ideal and the first shape's pool."""
    rows: list[Row] = []
    shapes = QUICK if opts.quick else FULL
    pools = []
    for shape in shapes:
        rates = alternate(
            opts.rounds,
            {
                "runner": functools.partial(runner_rate, shape),
                "pool": functools.partial(pool_rate, shape),
            },
        )
        ours = Series(f"batch.Runner, {shape.jobs:,} jobs of {shape.per_job}", rates["runner"])
        rows += [
            Figure(
                "7",
                f"{shape.name} vs thread pool",
                "/s",
                ours,
                Series(f"ThreadPoolExecutor({shape.workers}), a commit per task", rates["pool"]),
                Goal("ratio", ">=", 0.95),
            ),
            Figure(
                "7",
                f"  {shape.name} vs ideal",
                "/s",
                ours,
                Series("workers / latency", [shape.ideal] * len(rates["runner"])),
                Goal("ratio", ">=", 0.85),
            ),
        ]
        pools.append(rates["pool"])
    shape = ASYNC_QUICK if opts.quick else ASYNC
    costs = alternate(
        opts.rounds, {"async": functools.partial(runner_costs, shape, run_async=True)}
    )["async"]
    rates = {"async": [c["rate"] for c in costs]}
    ours = Series(f"async def fetch, {shape.jobs:,} jobs of {shape.per_job}", rates["async"])
    rows += [
        Figure(
            "7",
            f"async, {shape.workers:,} in flight x 50 ms vs ideal",
            "/s",
            ours,
            Series("fetches in flight / latency", [shape.ideal] * len(rates["async"])),
            Goal("ratio", ">=", 0.8),
        ),
        Figure(
            "7",
            f"  async vs thread pool, {shapes[0].workers} threads",
            "/s",
            ours,
            Series(f"ThreadPoolExecutor({shapes[0].workers}), 50 ms", pools[0]),
        ),
        # Why the ideal is out of reach: the CPU the process spends per
        # target, against what one core (the interpreter's lock) can give
        # each target at the ideal rate.
        Figure(
            "7",
            "  async, CPU per target vs ideal's",
            "us",
            Series("process CPU time / targets stored", [c["cpu"] for c in costs]),
            Series("1 s / ideal rate", [1e6 / shape.ideal] * len(costs)),
        ),
    ]
    return rows


SCENARIO: Scenario = join(Scenario("7", "many I/O-bound workers", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
