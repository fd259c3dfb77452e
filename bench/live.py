"""Scenario 2, many live jobs: whether the runner keeps its throughput while
it holds many jobs at once.

Each shape stores 20,000 no-op targets on 4 workers, and is set against
scenario 1's shape (10 jobs of 2,000) measured again in the same rounds:

- 10,000 jobs of 2 targets (their submits are part of the work), submitted
  one by one (a transaction each: shown without a goal), and all at once by
  ``submit_many`` (held to 0.8x);
- the 10 jobs of 2,000 alongside 5,000 live jobs waiting on a busy retry
  (``retry_wait`` 60 s: none comes back while the clock runs): what holding
  them costs, which is what the 0.8x goal is about;
- the same with ``retry_wait`` 0.05 s, shown without a goal: then the 5,000
  jobs do not wait, they ask for 100,000 tries a second, and rule 1 gives
  each of them its turn like any other job, so the 10 get 10 turns in
  5,010. The table reports the tries they take.

The busy jobs are submitted and have had their first tries (as many tries
as there are busy jobs) before the clock starts; they are cancelled after
it stops, and ``retry_for`` keeps them live meanwhile. A shape too slow to
finish is measured over the targets stored within a time budget.

    python -m bench.live [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import batch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import (
    CALLER,
    PATIENCE,
    drain_rate,
    echo,
    open_runner,
    refs,
    runner_rate,
    scratch,
)

__all__ = ["SCENARIO"]

#: Long enough that no busy job fails while it is measured.
RETRY_FOR = 600.0

#: The busy jobs' retry_wait: often (they keep taking turns), and seldom
#: (they only wait: none comes back while the clock runs).
OFTEN = 0.05
SELDOM = 60.0


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work one measurement does, and how long a slow one may take."""

    jobs: int
    per_job: int
    small_jobs: int
    busy_jobs: int
    budget: float


FULL = Sizes(jobs=10, per_job=2_000, small_jobs=10_000, busy_jobs=5_000, budget=4.0)
QUICK = Sizes(jobs=10, per_job=200, small_jobs=1_000, busy_jobs=500, budget=2.0)


class BusyUpstream:
    """The fetch of the mixed shapes: a ref starting ``busy`` is always busy,
    any other is fetched at once. Counts the busy tries; ``tried`` is set
    once there have been ``jobs`` of them."""

    def __init__(self, jobs: int) -> None:
        self._tries = itertools.count()
        self._jobs = jobs
        self.tried = threading.Event()

    def __call__(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        if target.ref.startswith("busy"):
            if next(self._tries) + 1 >= self._jobs:
                self.tried.set()
            raise batch.RetryLater("always busy")
        return echo(ctx, caller, target)

    def mark(self) -> int:
        """A reading of the try counter: the tries between two marks are their
        difference less one."""
        return next(self._tries)


def mixed_rate(sizes: Sizes, retry_wait: float) -> tuple[float, float]:
    """Targets per second of the reference's jobs while ``busy_jobs`` jobs are
    busy with ``retry_wait``; and the busy tries per second meanwhile."""
    upstream = BusyUpstream(sizes.busy_jobs)
    work = [refs(j, sizes.per_job) for j in range(sizes.jobs)]
    with (
        scratch() as path,
        open_runner(
            path, upstream, retry_wait=retry_wait, retry_for=RETRY_FOR, max_targets=sizes.per_job
        ) as (runner, tally),
    ):
        busy = [runner.submit(CALLER, [f"busy-{i}"]) for i in range(sizes.busy_jobs)]
        if not upstream.tried.wait(PATIENCE):
            raise TimeoutError("the busy jobs were never tried")
        first, start = upstream.mark(), time.perf_counter()
        rate = drain_rate(runner, tally, work, sizes.budget)
        tries = (upstream.mark() - first - 1) / (time.perf_counter() - start)
        for job_id in busy:
            runner.cancel(CALLER, job_id)
        return rate, tries


def run(opts: Options) -> list[Row]:
    """Each shape's rate against the reference's, and the busy jobs' tries."""
    sizes = QUICK if opts.quick else FULL
    results: dict[str, list[Any]] = alternate(
        opts.rounds,
        {
            "reference": lambda: runner_rate(sizes.jobs, sizes.per_job),
            "small": lambda: runner_rate(sizes.small_jobs, 2),
            "many": lambda: runner_rate(sizes.small_jobs, 2, many=True),
            "often": lambda: mixed_rate(sizes, OFTEN),
            "seldom": lambda: mixed_rate(sizes, SELDOM),
        },
    )
    reference = Series(f"{sizes.jobs} jobs of {sizes.per_job:,}", results["reference"])
    often = [rate for rate, _ in results["often"]]
    seldom = [rate for rate, _ in results["seldom"]]
    tries = [tries for _, tries in results["often"]]
    busy = f"{sizes.busy_jobs:,} busy"
    return [
        Figure(
            "2",
            f"{sizes.small_jobs:,} jobs of 2 vs {sizes.jobs} of {sizes.per_job:,}",
            "/s",
            Series(f"{sizes.small_jobs:,} jobs of 2", results["small"]),
            reference,
        ),
        Figure(
            "2",
            f"{sizes.small_jobs:,} jobs of 2 by submit_many",
            "/s",
            Series(f"{sizes.small_jobs:,} jobs of 2, one submit_many", results["many"]),
            reference,
            Goal("ratio", ">=", 0.8),
        ),
        Figure(
            "2",
            f"{sizes.jobs} jobs + {busy} waiting, retry {SELDOM:g} s",
            "/s",
            Series(f"{busy} jobs, retry_wait {SELDOM:g} s", seldom),
            reference,
            Goal("ratio", ">=", 0.8),
        ),
        Figure(
            "2",
            f"{sizes.jobs} jobs + {busy} retrying, {OFTEN:g} s",
            "/s",
            Series(f"{busy} jobs, retry_wait {OFTEN:g} s", often),
            reference,
        ),
        Figure(
            "2",
            "  the busy jobs' tries",
            "/s",
            Series(f"tries of the {busy} jobs", tries),
        ),
    ]


SCENARIO: Scenario = join(Scenario("2", "many live jobs", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
