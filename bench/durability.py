"""What synchronous="FULL" costs against "NORMAL": runner throughput and
submit_run rate on a file store, measured in the same run, alternating.

    python bench/durability.py [--targets N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import batch
import store
from store.db import Synchronous

WORKERS = 4
JOBS = 10


def noop(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    return {"ref": target.ref}


def runner_rate(path: Path, n: int, synchronous: Synchronous) -> float:
    caller = batch.Caller("bench")
    per_job = n // JOBS
    config = batch.Config(workers=WORKERS, max_targets=per_job)
    with store.open(path, synchronous=synchronous) as db, batch.Runner(db, noop, config) as r:
        start = time.perf_counter()
        ids = [r.submit(caller, [f"j{j}-{i}" for i in range(per_job)]) for j in range(JOBS)]
        for job_id in ids:
            r.wait(caller, job_id, timeout=600)
        return n / (time.perf_counter() - start)


def submit_rate(path: Path, n: int, synchronous: Synchronous) -> float:
    with store.open(path, synchronous=synchronous, max_leases_per_run=1) as db:
        for i in range(n):
            db.advertise(store.Advert(f"n{i}", f"box-{i}", {"linux"}))
        start = time.perf_counter()
        for _ in range(n):
            db.submit_run([store.Step("s", "exec", {"linux"})])
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description="the cost of synchronous=FULL")
    parser.add_argument("--targets", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for sync in ("NORMAL", "FULL"):
            with tempfile.TemporaryDirectory() as d:
                rates.setdefault(("runner targets/s", sync), []).append(
                    runner_rate(Path(d) / "a.sqlite3", args.targets, sync)  # type: ignore[arg-type]
                )
                rates.setdefault(("submit_run/s", sync), []).append(
                    submit_rate(Path(d) / "b.sqlite3", args.runs, sync)  # type: ignore[arg-type]
                )
    print(f"medians of {args.rounds} rounds; {args.targets} targets, {args.runs} runs")
    print(f"{'':<20}{'NORMAL':>10}{'FULL':>10}{'FULL/NORMAL':>14}")
    for what in ("runner targets/s", "submit_run/s"):
        normal = statistics.median(rates[(what, "NORMAL")])
        full = statistics.median(rates[(what, "FULL")])
        print(f"{what:<20}{normal:>10.0f}{full:>10.0f}{full / normal:>14.2f}")


if __name__ == "__main__":
    main()
