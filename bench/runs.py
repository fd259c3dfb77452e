"""The run queue at size: wake_queued and submit_run, with and without the
partial index on QUEUED runs.

A store file with --history finished runs, --nodes nodes each busy with a
one-step run, and --queued runs waiting. Measured:
  (a) wake_queued when nothing fits (every node busy);
  (b) wake_queued when one node frees (its run ended);
  submit_run per second on a file store, placed at once and queued.
Each figure is the median of --rounds, first with the partial index the
schema has (runs_queued), then on a copy of the file without it.

    python bench/runs.py [--history H] [--nodes N] [--queued Q] [--rounds R]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import store

STEP = [store.Step("work", "exec", {"linux"})]


def build(path: Path, n_history: int, n_nodes: int, n_queued: int) -> None:
    with store.open(path, max_leases_per_run=1) as db:
        # Finished runs, older than everything else: written directly, as only
        # their rows in `runs` matter to the queue.
        with db._db.transaction() as conn:
            conn.executemany(
                "INSERT INTO runs (id, state, created_at, started_at, ended_at)"
                " VALUES (?, 'SUCCEEDED', ?, ?, ?)",
                ((f"old-{i:07d}", 1.0 + i, 1.0 + i, 2.0 + i) for i in range(n_history)),
            )
        for i in range(n_nodes):
            db.advertise(store.Advert(f"n{i:05d}", f"box-{i}", {"linux"}))
        for _ in range(n_nodes):
            assert db.submit_run(STEP).state == "RUNNING"
        for _ in range(n_queued):
            assert db.submit_run(STEP).state == "QUEUED"


def free_one(path: Path) -> None:
    """End one running run behind the store's back, so that no wake follows."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    (run_id,) = conn.execute("SELECT run_id FROM leases LIMIT 1").fetchone()
    conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
    conn.execute("UPDATE steps SET state = 'SUCCEEDED' WHERE run_id = ?", (run_id,))
    conn.execute("UPDATE runs SET state = 'SUCCEEDED', ended_at = 0 WHERE id = ?", (run_id,))
    conn.execute("COMMIT")
    conn.close()


def timed(fn: object, *args: object) -> float:
    start = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start


def measure(path: Path, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with store.open(path, max_leases_per_run=1) as db:
        out["wake, nothing fits (ms)"] = 1e3 * statistics.median(
            timed(db.wake_queued, "bench") for _ in range(rounds)
        )
        one = []
        for _ in range(rounds):
            free_one(path)
            start = time.perf_counter()
            promoted = db.wake_queued("bench")
            one.append(time.perf_counter() - start)
            assert len(promoted) == 1
        out["wake, one node frees (ms)"] = 1e3 * statistics.median(one)
        n = 500
        start = time.perf_counter()
        for _ in range(n):
            db.submit_run(STEP)
        out["submit_run, queued (/s)"] = n / (time.perf_counter() - start)
    with store.open(path.with_name("idle.sqlite3"), max_leases_per_run=1) as idle:
        for i in range(n):
            idle.advertise(store.Advert(f"n{i:05d}", f"box-{i}", {"linux"}))
        start = time.perf_counter()
        for _ in range(n):
            assert idle.submit_run(STEP).state == "RUNNING"
        out[f"submit_run, placed on {n} idle nodes (/s)"] = n / (time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="the run queue at size")
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "base.sqlite3"
        start = time.perf_counter()
        build(base, args.history, args.nodes, args.queued)
        print(
            f"built {args.history} finished runs, {args.nodes} busy nodes,"
            f" {args.queued} queued runs in "
            f"{time.perf_counter() - start:.1f}s"
        )
        results = {}
        for variant in ("with index", "without index"):
            path = Path(d) / variant.replace(" ", "-") / "runs.sqlite3"
            path.parent.mkdir()
            shutil.copy(base, path)
            if variant == "without index":
                conn = sqlite3.connect(path)
                conn.execute("DROP INDEX runs_queued")
                conn.close()
            results[variant] = measure(path, args.rounds)
    print(f"{'':<44}{'with index':>14}{'without index':>16}")
    for key in results["with index"]:
        print(f"{key:<44}{results['with index'][key]:>14.2f}{results['without index'][key]:>16.2f}")


if __name__ == "__main__":
    main()
