"""Scenario 10, scale-out: runner processes sharing one database, as users
grow past one machine. Each process opens the store itself and runs its own
``batch.Runner`` with 32 workers, each fetch waiting 25 ms (a network
call); each has 64 jobs of 40 targets, and every process starts at one
moment. Measured with 1, 2 and 4 processes, against two references in the
same rounds:

- the ideal: every worker of every process busy all the time,
  ``processes * 32 / 25 ms``;
- the naive baseline: as many processes, each a ``ThreadPoolExecutor(32)``
  doing the same wait per target, then one INSERT and its commit per result
  on a connection of the thread's own. What one writes without a runner:
  no fairness, no serial rule, no lease.

The rate runs from the common start to the last target stored by any
process.

    python -m bench.scaleout --engine postgres [--rounds N] [--quick]
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from bench.engine import engine
from bench.fleet import (
    NAIVE,
    RUNNER,
    four_against_one,
    open_store,
    processes_rate,
    results_table,
)
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main
from bench.workload import Shape

__all__ = ["SCENARIO"]


#: As many jobs as workers at least: each job runs one target at a time.
FULL = Shape(workers=32, latency=0.025, jobs=64, per_job=40)
QUICK = Shape(workers=32, latency=0.025, jobs=64, per_job=10)


def run(opts: Options) -> list[Row]:
    """The runner's rate with 1, 2 and 4 processes, against the ideal and
    the naive baseline."""
    if engine() != "postgres":
        return [Skipped("10", "runner processes on one database", "PostgreSQL only")]
    shape = QUICK if opts.quick else FULL
    counts = (1, 2, 4)
    measures: dict[str, Callable[[], float]] = {}
    for n in counts:
        measures[f"runner{n}"] = functools.partial(processes_rate, RUNNER, n, shape, open_store)
        measures[f"naive{n}"] = functools.partial(processes_rate, NAIVE, n, shape, results_table)
    rates = alternate(opts.rounds, measures)
    rows: list[Row] = []
    for n in counts:
        ours = Series(f"{n} runner process{'es' if n > 1 else ''}", rates[f"runner{n}"])
        ideal = n * shape.ideal
        rows.append(
            Figure(
                "10",
                f"{n} x {shape.workers} workers x {shape.latency * 1000:g} ms vs ideal",
                "/s",
                ours,
                Series(f"ideal, {ideal:,.0f}/s", [ideal] * len(rates[f"runner{n}"])),
                Goal("ratio", ">=", 0.9) if n == 2 else None,
            )
        )
        rows.append(
            Figure(
                "10",
                f"{n} x {shape.workers} workers vs naive TPE+psycopg",
                "/s",
                ours,
                Series(f"{n} x ThreadPoolExecutor({shape.workers})", rates[f"naive{n}"]),
                Goal("ratio", ">=", 0.95) if n == 4 else None,
            )
        )
    rows.append(
        four_against_one("10", f"4 runner processes vs 1, {shape.workers} workers each", rates, 2.5)
    )
    return rows


SCENARIO: Scenario = join(Scenario("10", "runner processes on one database", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
