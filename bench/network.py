"""Scenario 14, a network round trip away: the scale-out of scenario 10
with every connection to the server through a proxy that delays each byte
half a millisecond each way (``bench.delay``), as between two hosts of one
data centre. What a round trip costs: the submit of a job of 20 targets,
counted in round trips (its median time over a ``SELECT 1``'s, both
through the proxy); the runner's rate with 1 and 4 processes, 32 workers
each, every fetch waiting 25 ms, 40 jobs of 50 targets a process, against
scenario 10's naive baseline (a thread pool, a connection per thread, one
INSERT and its commit per result) through the same proxy.

    python -m bench.network --engine postgres [--rounds N] [--quick] [--delay MS]
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable

import batch
from bench.delay import DELAY, delayed
from bench.engine import engine, scratch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.scaleout import NAIVE, RUNNER, open_store, results_table
from bench.suite import join, main
from bench.workload import CALLER, Shape, together

__all__ = ["SCENARIO"]

FULL = Shape(workers=32, latency=0.025, jobs=40, per_job=50)
QUICK = Shape(workers=32, latency=0.025, jobs=40, per_job=12)
#: Submits timed, and ``SELECT 1`` timed, per round.
SUBMITS = 200
#: Targets of each job submitted.
SUBMITTED = 20


def _median_seconds(fn: Callable[[], object], times: int) -> float:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def submit_round_trips() -> tuple[float, float]:
    """The median submit of a job of 20 targets through the proxy, in
    round trips (a ``SELECT 1``'s median time there), and that round trip
    in milliseconds."""
    import psycopg  # noqa: PLC0415 (only the PostgreSQL suite needs it)

    import store  # noqa: PLC0415

    with scratch() as url, delayed(url) as far:
        with psycopg.connect(far, autocommit=True) as conn:
            trip = _median_seconds(lambda: conn.execute("SELECT 1").fetchone(), SUBMITS)
        refs = [f"t{i}" for i in range(SUBMITTED)]
        held = threading.Event()

        def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
            held.wait()  # the jobs stay live, leased to the runner: no other write

        with store.open(far) as db, batch.Runner(db, fetch, batch.Config(workers=1)) as runner:
            try:
                runner.submit(CALLER, refs)  # the pool's connection made
                took = _median_seconds(lambda: runner.submit(CALLER, refs), SUBMITS)
            finally:
                held.set()
        return took / trip, trip * 1000


def processes_rate(child: str, processes: int, shape: Shape, setup: Callable[[str], None]) -> float:
    """Targets per second of ``processes`` copies of ``child`` on one new
    database set up by ``setup``, every connection through the proxy."""
    with scratch() as url:
        setup(url)
        with delayed(url) as far:
            work = [str(shape.workers), str(shape.jobs), str(shape.per_job), str(shape.latency)]
            took = together(child, [[far, f"p{k}", *work] for k in range(processes)])
        return processes * shape.jobs * shape.per_job / took


def run(opts: Options) -> list[Row]:
    """Submit in round trips; runner against naive, 1 and 4 processes, and
    4 against 1, all a round trip away."""
    if engine() != "postgres":
        return [Skipped("14", "a network round trip away", "PostgreSQL only")]
    shape = QUICK if opts.quick else FULL
    submits = alternate(opts.rounds, {"submit": submit_round_trips})["submit"]
    trips, ms = [t for t, _ in submits], [m for _, m in submits]
    measures: dict[str, Callable[[], float]] = {}
    for n in (1, 4):
        measures[f"runner{n}"] = functools.partial(processes_rate, RUNNER, n, shape, open_store)
        measures[f"naive{n}"] = functools.partial(processes_rate, NAIVE, n, shape, results_table)
    rate = alternate(opts.rounds, measures)
    rows: list[Row] = [
        Figure(
            "14",
            f"a round trip, {DELAY * 1000:g} ms each way added",
            "ms",
            Series("SELECT 1 through the proxy", ms),
        ),
        Figure(
            "14",
            f"submit of a job of {SUBMITTED} targets, in round trips",
            "rt",
            Series("Runner.submit", trips),
            goal=Goal("median", "<=", 1.5),
        ),
    ]
    for n in (1, 4):
        rows.append(
            Figure(
                "14",
                f"{n} x {shape.workers} workers x {shape.latency * 1000:g} ms vs naive, a round"
                " trip away",
                "/s",
                Series(f"{n} runner process{'es' if n > 1 else ''}", rate[f"runner{n}"]),
                Series(f"{n} x ThreadPoolExecutor({shape.workers})", rate[f"naive{n}"]),
                Goal("ratio", ">=", 0.95),
            )
        )
    rows.append(
        Figure(
            "14",
            "4 runner processes vs 1, a round trip away",
            "/s",
            Series("4 runner processes", rate["runner4"]),
            Series("1 runner process", rate["runner1"]),
            Goal("ratio", ">=", 3.0),
        )
    )
    return rows


SCENARIO: Scenario = join(Scenario("14", "a network round trip away", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
