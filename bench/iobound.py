"""Scenario 7, many I/O-bound workers: what users run. Each fetch waits on
the network (here: sleeps a fixed latency, releasing the interpreter as a
socket read does), with dozens to hundreds of worker threads, on jobs of 20
targets each.

Shapes:

- 256 workers, each fetch 50 ms, 1,000 jobs of 20;
- 64 workers, each fetch 10 ms, 500 jobs of 20;
- an ``async def`` fetch awaiting 50 ms, 1,000 in flight on the runner's
  event loop (``workers=1000``), 1,000 jobs of 20: what one process can keep
  in flight without a thread per fetch; on uvloop (where installed) and on
  asyncio's own loop, in the same rounds.

Against two references measured or computed in the same rounds:

- the thread pool: ``ThreadPoolExecutor(workers)``, one task per target,
  each waiting the same latency, then committing its JSON result to SQLite
  as scenario 1's naive baseline does (no fairness, no serial rule);
- the ideal: ``workers / latency`` targets per second, every worker busy
  all the time.

For the async runner, also the process's CPU time per target stored (each loop),
against ``1 s / ideal``: what one core (the interpreter's lock) can spend
per target at the ideal rate. Above it, the ideal is out of reach however
the fetches wait.

    python -m bench.iobound [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

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

#: The async runner's event loops (``Config.loop``), as the rows name them,
#: and the share of the ideal each is to reach.
Loop = Literal["uvloop", "asyncio"]
LOOPS: dict[Loop, str] = {"uvloop": "uvloop", "asyncio": "asyncio's loop"}
ASYNC_GOAL: dict[Loop, float] = {"uvloop": 0.8, "asyncio": 0.7}


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


def runner_costs(shape: Shape, loop: Loop | None = None) -> dict[str, float]:
    """Targets per second of a runner of ``shape.workers`` worker threads,
    or (given the ``Config.loop``) of that many fetches in flight on its
    event loop, as ``rate``; and the process's CPU time per target stored
    meanwhile, in microseconds, as ``cpu``."""
    work = [refs(j, shape.per_job) for j in range(shape.jobs)]
    fetch = (waiting if loop is None else waiting_async)(shape.latency)
    with (
        scratch() as path,
        open_runner(path, fetch, workers=shape.workers, loop=loop or "auto") as (runner, tally),
    ):
        cpu = time.process_time()
        rate = drain_rate(runner, tally, work, many=True)
        cpu = time.process_time() - cpu
        return {"rate": rate, "cpu": cpu / (shape.jobs * shape.per_job) * 1e6}


def cpu_row(what: str, costs: list[dict[str, float]], shape: Shape) -> Figure:
    """Why the ideal may be out of reach: the CPU the process spent per
    target, against what one core (the interpreter's lock) can give each
    target at the ideal rate."""
    return Figure(
        "7",
        what,
        "us",
        Series("process CPU time / targets stored", [c["cpu"] for c in costs]),
        Series("1 s / ideal rate", [1e6 / shape.ideal] * len(costs)),
    )


def pool_costs(shape: Shape) -> dict[str, float]:
    """Targets per second of ``ThreadPoolExecutor(shape.workers)`` as
    ``rate`` (as :func:`runner_costs` gives it): each task waits the
    latency, then commits its result."""
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
        return {"rate": rate}


def run(opts: Options) -> list[Row]:
    """Each shape's runner against the pool and against the ideal; the
    async runner against the same ideal and the first shape's pool."""
    rows: list[Row] = []
    shapes = QUICK if opts.quick else FULL
    pools = []
    for shape in shapes:
        measures: dict[str, Callable[[], dict[str, float]]] = {
            "runner": functools.partial(runner_costs, shape),
            "pool": functools.partial(pool_costs, shape),
        }
        got = alternate(opts.rounds, measures)
        spent, pool = got["runner"], [p["rate"] for p in got["pool"]]
        ours = Series(
            f"batch.Runner, {shape.jobs:,} jobs of {shape.per_job}", [c["rate"] for c in spent]
        )
        rows += [
            Figure(
                "7",
                f"{shape.name} vs thread pool",
                "/s",
                ours,
                Series(f"ThreadPoolExecutor({shape.workers}), a commit per task", pool),
                Goal("ratio", ">=", 0.95),
            ),
            Figure(
                "7",
                f"  {shape.name} vs ideal",
                "/s",
                ours,
                Series("workers / latency", [shape.ideal] * opts.rounds),
                Goal("ratio", ">=", 0.85),
            ),
            cpu_row(f"  {shape.name}, CPU per target vs ideal's", spent, shape),
        ]
        pools.append(pool)
    shape = ASYNC_QUICK if opts.quick else ASYNC
    loops: list[Loop] = ["uvloop", "asyncio"] if importlib.util.find_spec("uvloop") else ["asyncio"]
    costs = alternate(
        opts.rounds, {loop: functools.partial(runner_costs, shape, loop) for loop in loops}
    )
    ideal = Series("fetches in flight / latency", [shape.ideal] * opts.rounds)
    on = {
        loop: Series(
            f"async def fetch on {LOOPS[loop]}, {shape.jobs:,} jobs of {shape.per_job}",
            [c["rate"] for c in costs[loop]],
        )
        for loop in loops
    }
    for loop in loops:
        rows.append(
            Figure(
                "7",
                f"async on {LOOPS[loop]}, {shape.workers:,} in flight x 50 ms vs ideal",
                "/s",
                on[loop],
                ideal,
                Goal("ratio", ">=", ASYNC_GOAL[loop]),
            )
        )
    rows.append(
        Figure(
            "7",
            f"  async on {LOOPS[loops[0]]} vs thread pool, {shapes[0].workers} threads",
            "/s",
            on[loops[0]],
            Series(f"ThreadPoolExecutor({shapes[0].workers}), 50 ms", pools[0]),
        )
    )
    rows += [
        cpu_row(f"  async on {LOOPS[loop]}, CPU per target vs ideal's", costs[loop], shape)
        for loop in loops
    ]
    return rows


SCENARIO: Scenario = join(Scenario("7", "many I/O-bound workers", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
