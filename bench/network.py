"""Scenario 14, a network round trip away: the scale-out of scenario 10
with every connection to the server through a proxy that delays each byte
half a millisecond each way (``bench.delay``), as between two hosts of one
data centre. What a round trip costs: the submit of a job of 20 targets,
in round trips (counted at the proxy) and in time (through the proxy and
straight to the server); the runner's rate with 1 and 4 processes, 32 workers
each, every fetch waiting 25 ms, 40 jobs of 50 targets a process, against
scenario 10's naive baseline (a thread pool, a connection per thread, one
INSERT and its commit per result) through the same proxy.

    python -m bench.network --engine postgres [--rounds N] [--quick] [--delay MS]
"""

from __future__ import annotations

import functools
import itertools
import threading
import uuid
from collections.abc import Callable

import batch
from bench import fleet
from bench.delay import DELAY, delayed
from bench.engine import engine, scratch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main
from bench.workload import CALLER, Shape, timed_calls
from store.ledger import Ledger

__all__ = ["SCENARIO"]

FULL = Shape(workers=32, latency=0.025, jobs=40, per_job=50)
QUICK = Shape(workers=32, latency=0.025, jobs=40, per_job=12)
#: Submits timed, and ``SELECT 1`` timed, per round.
SUBMITS = 200
#: Targets of each job submitted.
SUBMITTED = 20


def submits() -> tuple[float, float, float, float]:
    """What a submit of a job of 20 targets costs: the round trips the
    store's write of it makes, counted at the proxy; the median time of
    ``Runner.submit`` through the proxy and straight to the server (ms);
    and the round trip of a ``SELECT 1`` through the proxy (ms)."""
    import psycopg  # noqa: PLC0415 (only the PostgreSQL suite needs it)

    import store  # noqa: PLC0415

    refs = [f"t{i}" for i in range(SUBMITTED)]
    with scratch() as url, delayed(url) as far:
        with psycopg.connect(far, autocommit=True) as conn:
            trip = timed_calls(SUBMITS, lambda: conn.execute("SELECT 1").fetchone())
        with store.open(far) as db:
            ids = (uuid.uuid4().hex for _ in itertools.count())
            Ledger.of(db).create_jobs(CALLER.id, [(next(ids), refs)], "r", lease_for=60.0)
            before = far.trips
            for _ in range(SUBMITS):  # what Runner.submit writes
                Ledger.of(db).create_jobs(CALLER.id, [(next(ids), refs)], "r", lease_for=60.0)
            trips = (far.trips - before) / SUBMITS
        took = {where: _submit_seconds(where) for where in (far, url)}
    return trips, took[far] * 1000, took[url] * 1000, trip * 1000


def _submit_seconds(url: str) -> float:
    """The median ``Runner.submit`` of a job of 20 targets on ``url``, by
    a runner whose jobs stay live (its one worker held): nothing else is
    written meanwhile."""
    import store  # noqa: PLC0415

    refs = [f"t{i}" for i in range(SUBMITTED)]
    held = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        held.wait()

    with store.open(url) as db, batch.Runner(db, fetch, batch.Config(workers=1)) as runner:
        try:
            runner.submit(CALLER, refs)  # the pool's connection made
            return timed_calls(SUBMITS, lambda: runner.submit(CALLER, refs))
        finally:
            held.set()


def run(opts: Options) -> list[Row]:
    """Submit in round trips; runner against naive, 1 and 4 processes, and
    4 against 1, all a round trip away."""
    if engine() != "postgres":
        return [Skipped("14", "a network round trip away", "PostgreSQL only")]
    shape = QUICK if opts.quick else FULL
    costs = alternate(opts.rounds, {"submit": submits})["submit"]
    trips, far_ms, near_ms, trip_ms = (list(column) for column in zip(*costs, strict=True))
    measures: dict[str, Callable[[], float]] = {}
    for n in (1, 4):
        measures[f"runner{n}"] = functools.partial(
            fleet.processes_rate, fleet.RUNNER, n, shape, fleet.open_store, far=True
        )
        measures[f"naive{n}"] = functools.partial(
            fleet.processes_rate, fleet.NAIVE, n, shape, fleet.results_table, far=True
        )
    rate = alternate(opts.rounds, measures)
    rows: list[Row] = [
        Figure(
            "14",
            f"a round trip, {DELAY * 1000:g} ms each way added",
            "ms",
            Series("SELECT 1 through the proxy", trip_ms),
        ),
        Figure(
            "14",
            f"round trips of a submit of {SUBMITTED} targets",
            "rt",
            Series("counted at the proxy", trips),
            goal=Goal("median", "<=", 1.5),
        ),
        Figure(
            "14",
            f"Runner.submit of {SUBMITTED} targets, a round trip away",
            "ms",
            Series("through the proxy", far_ms),
            Series("straight to the server", near_ms),
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
        fleet.four_against_one("14", "4 runner processes vs 1, a round trip away", rate, 3.0)
    )
    return rows


SCENARIO: Scenario = join(Scenario("14", "a network round trip away", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
