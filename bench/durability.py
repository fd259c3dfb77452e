"""What ``synchronous="FULL"`` costs against ``"NORMAL"`` (the default):
FULL waits for an fsync of the log at every commit, so that a commit also
survives a power loss. Both measured in the same rounds, taking turns:

- the runner's throughput, as in scenario 1 on fewer targets;
- ``submit_run`` placing each run at once on an idle node, as in scenario 5.

Not part of the suite (it measures a setting, not the code):

    python -m bench.durability [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.measure import Figure, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import placed_rate, runner_rate

__all__ = ["SCENARIO"]


@dataclass(frozen=True, slots=True)
class Sizes:
    """The runner's workload, and the runs submitted."""

    jobs: int
    per_job: int
    runs: int


FULL = Sizes(jobs=10, per_job=1_000, runs=300)
QUICK = Sizes(jobs=10, per_job=100, runs=50)


def run(opts: Options) -> list[Row]:
    """Runner throughput and submit_run rate on FULL, each against NORMAL."""
    sizes = QUICK if opts.quick else FULL
    results = alternate(
        opts.rounds,
        {
            "runner NORMAL": lambda: runner_rate(sizes.jobs, sizes.per_job, "NORMAL"),
            "runner FULL": lambda: runner_rate(sizes.jobs, sizes.per_job, "FULL"),
            "submit NORMAL": lambda: placed_rate(sizes.runs, "NORMAL")["placed"],
            "submit FULL": lambda: placed_rate(sizes.runs, "FULL")["placed"],
        },
    )

    def full_vs_normal(what: str, key: str) -> Figure:
        return Figure(
            "D",
            f"{what}, FULL vs NORMAL",
            "/s",
            Series(f"{key}, synchronous=FULL", results[f"{key} FULL"]),
            Series(f"{key}, synchronous=NORMAL", results[f"{key} NORMAL"]),
        )

    return [full_vs_normal("runner", "runner"), full_vs_normal("submit_run placed", "submit")]


SCENARIO: Scenario = join(Scenario("D", "durability", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
