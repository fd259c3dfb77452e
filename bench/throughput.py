"""Throughput: the runner against a plain ThreadPoolExecutor writing to SQLite.

20,000 targets with a no-op fetch, 4 workers, as 10 jobs of 2,000. The
baseline, measured in the same run: a ThreadPoolExecutor(4) whose tasks each
commit their JSON result to SQLite (WAL, synchronous=NORMAL, one connection
shared under a lock, one UPDATE per transaction, rows of the same size).
Compare the ratio, not the absolute figures: the machine is noisy.

    python bench/throughput.py [--targets N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import batch
import store

WORKERS = 4
JOBS = 10


def noop(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    return {"ref": target.ref}


def run_runner(path: Path, n: int) -> float:
    caller = batch.Caller("bench")
    per_job = n // JOBS
    with (
        store.open(path) as db,
        batch.Runner(db, noop, batch.Config(workers=WORKERS, max_targets=per_job)) as r,
    ):
        start = time.perf_counter()
        ids = [r.submit(caller, [f"job{j}-{i}" for i in range(per_job)]) for j in range(JOBS)]
        for job_id in ids:
            assert r.wait(caller, job_id, timeout=600).status == "done"
        return n / (time.perf_counter() - start)


def run_executor(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE targets (job_id TEXT, pos INTEGER, ref TEXT, status TEXT,"
        " result TEXT, PRIMARY KEY (job_id, pos)) WITHOUT ROWID"
    )
    per_job = n // JOBS
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO targets VALUES (?, ?, ?, 'pending', NULL)",
        ((f"job{j:028d}", i, f"job{j}-{i}") for j in range(JOBS) for i in range(per_job)),
    )
    conn.execute("COMMIT")
    lock = threading.Lock()

    def task(job: str, pos: int, ref: str) -> None:
        result = json.dumps({"ref": ref})
        with lock:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE targets SET status = 'done', result = ? WHERE job_id = ? AND pos = ?",
                (result, job, pos),
            )
            conn.execute("COMMIT")

    start = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        for j in range(JOBS):
            for i in range(per_job):
                pool.submit(task, f"job{j:028d}", i, f"job{j}-{i}")
    rate = n / (time.perf_counter() - start)
    conn.close()
    return rate


def measure(fn: Callable[[Path, int], float], n: int, rounds: int) -> list[float]:
    rates = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            rates.append(fn(Path(d) / "bench.sqlite3", n))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description="runner throughput against a baseline")
    parser.add_argument("--targets", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    # Alternate the two so that a noisy spell of the machine hits both alike.
    runner_rates: list[float] = []
    executor_rates: list[float] = []
    for _ in range(args.rounds):
        executor_rates += measure(run_executor, args.targets, 1)
        runner_rates += measure(run_runner, args.targets, 1)
    for name, rates in (
        ("batch.Runner", runner_rates),
        ("ThreadPoolExecutor+SQLite", executor_rates),
    ):
        rows.append((name, statistics.median(rates), min(rates), max(rates)))
    print(f"{args.targets} targets, no-op fetch, {WORKERS} workers, {args.rounds} rounds")
    print(f"{'':<28}{'median/s':>10}{'min':>10}{'max':>10}")
    for name, med, lo, hi in rows:
        print(f"{name:<28}{med:>10.0f}{lo:>10.0f}{hi:>10.0f}")
    print(f"ratio runner/baseline (medians): {rows[0][1] / rows[1][1]:.2f}x")


if __name__ == "__main__":
    main()
