"""Scenario 4, the store at size: whether storing a target costs the same in
a store holding 100,000 terminal jobs as in one holding 100, and what reading
a big job costs.

(a) ``Store.store_target`` with eviction: the byte budget is what the
    terminal jobs hold, so every stored target evicts the oldest job (each
    holds exactly the bytes one target adds). 100,000 jobs against 100.
(b) ``Store.store_target`` under budget: the same files, a budget far above
    them. The store keeps a byte total, so this should be flat.
(c) ``Runner.status`` of a done 1,000-target job, against reading the same
    rows with raw SQL and decoding each result (no objects built): the
    least any status read does.

The files are written once with raw SQL in one transaction, in the schema
``store.open`` creates, the byte total kept consistent; every measure then
opens a fresh copy with ``store.open`` and goes through the public API. A
cost is the median of one call over a round's calls.

    python -m bench.size [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from dataclasses import dataclass
from typing import Any

import store
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import (
    CALLER,
    PATIENCE,
    copy_of,
    echo,
    open_runner,
    raw_sqlite,
    result_json,
    scratch,
    timed_calls,
)
from store.ledger import Ledger

__all__ = ["SCENARIO"]

#: A budget no test file comes near.
UNLIMITED = 1 << 62


@dataclass(frozen=True, slots=True)
class Sizes:
    """Terminal jobs in the big and the small file; calls timed per round."""

    big: int
    small: int
    stores: int
    status_calls: int
    status_targets: int


FULL = Sizes(big=100_000, small=100, stores=50, status_calls=50, status_targets=1_000)
QUICK = Sizes(big=5_000, small=100, stores=20, status_calls=10, status_targets=1_000)


def ref(i: int) -> str:
    """Refs of one length, so that every result stored is as long as the next."""
    return f"doc-{i:08d}"


def build(path: str, jobs: int) -> None:
    """A store file holding ``jobs`` terminal jobs of one done target each,
    touched oldest first, and the byte total that goes with them."""
    store.open(path).close()
    nbytes = len(result_json(ref(0)).encode())
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        # The schema's event triggers read the transaction's time from it.
        conn.create_function("store_now", 0, lambda: 1e6 + jobs)
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, nbytes)"
            " VALUES (?, ?, 'done', ?, ?, ?, ?)",
            ((f"{i:032x}", CALLER.id, 1e6 + i, 1e6 + i, 1e6 + i, nbytes) for i in range(jobs)),
        )
        conn.executemany(
            "INSERT INTO targets (job_id, pos, ref, status, result) VALUES (?, 0, ?, 'done', ?)",
            ((f"{i:032x}", ref(i), result_json(ref(i))) for i in range(jobs)),
        )
        conn.execute("UPDATE job_bytes SET total = total + ? WHERE slot = 0", (jobs * nbytes,))
        conn.execute("COMMIT")


def store_cost(base: str, stores: int, evicting: bool) -> float:
    """Microseconds per ``store_target`` into a live job of a copy of
    ``base``: each evicting exactly one job, or (``evicting=False``) none."""
    with copy_of(base) as path, store.open(path) as db:
        budget = Ledger.of(db).total_bytes() if evicting else UNLIMITED
        job_id = uuid.uuid4().hex
        Ledger.of(db).create_job(job_id, CALLER.id, [ref(i) for i in range(stores)])
        outcomes = iter([(pos, result_json(ref(pos))) for pos in range(stores)])

        def store_next() -> None:
            pos, result = next(outcomes)
            evicted = Ledger.of(db).store_target(
                job_id, pos, store.TargetState.DONE, result=result, max_bytes=budget
            )
            if len(evicted) != int(evicting):
                raise RuntimeError(f"stored target {pos} evicted {len(evicted)} jobs")

        return timed_calls(stores, store_next) * 1e6


def status_costs(targets: int, calls: int) -> tuple[float, float]:
    """Milliseconds per ``Runner.status`` of a done job of ``targets``
    targets, and per raw read of the same rows with every result decoded."""
    with scratch() as path, open_runner(path, echo) as (runner, _):
        job_id = runner.submit(CALLER, [ref(i) for i in range(targets)])
        runner.wait(CALLER, job_id, timeout=PATIENCE)
        ours = timed_calls(calls, lambda: runner.status(CALLER, job_id))
        with contextlib.closing(raw_sqlite(path)) as conn:
            raw = timed_calls(calls, lambda: read_raw(conn, job_id))
        return ours * 1e3, raw * 1e3


def read_raw(conn: sqlite3.Connection, job_id: str) -> list[object]:
    """The job's row and its targets' rows, each result decoded."""
    conn.execute(
        "SELECT status, created_at, updated_at FROM jobs WHERE id = ?", (job_id,)
    ).fetchone()
    rows = conn.execute(
        "SELECT pos, ref, status, result, error, hint FROM targets WHERE job_id = ? ORDER BY pos",
        (job_id,),
    )
    return [None if row[3] is None else json.loads(row[3]) for row in rows]


def run(opts: Options) -> list[Row]:
    """Store costs in the big file against the small one, and the status read."""
    sizes = QUICK if opts.quick else FULL
    with scratch("big.sqlite3") as big, scratch("small.sqlite3") as small:
        build(big, sizes.big)
        build(small, sizes.small)
        costs: dict[str, list[Any]] = alternate(
            opts.rounds,
            {
                "evict big": lambda: store_cost(big, sizes.stores, evicting=True),
                "evict small": lambda: store_cost(small, sizes.stores, evicting=True),
                "flat big": lambda: store_cost(big, sizes.stores, evicting=False),
                "flat small": lambda: store_cost(small, sizes.stores, evicting=False),
                "status": lambda: status_costs(sizes.status_targets, sizes.status_calls),
            },
        )
    jobs = f"{sizes.big:,} vs {sizes.small}"

    def per_size(what: str, key: str, goal: Goal) -> Figure:
        return Figure(
            "4",
            what,
            "us",
            Series(f"{key}, {sizes.big:,} terminal jobs", costs[f"{key} big"]),
            Series(f"{key}, {sizes.small} terminal jobs", costs[f"{key} small"]),
            goal,
        )

    return [
        per_size(f"store_target+evict {jobs}", "evict", Goal("ratio", "<=", 1.5)),
        per_size(f"store_target, {jobs} jobs", "flat", Goal("ratio", "<=", 1.5)),
        Figure(
            "4",
            f"Runner.status {sizes.status_targets:,} targets vs raw",
            "ms",
            Series("Runner.status", [ours for ours, _ in costs["status"]]),
            Series("raw SELECT + json.loads", [raw for _, raw in costs["status"]]),
            Goal("ratio", "<=", 1.3),
        ),
    ]


SCENARIO: Scenario = join(Scenario("4", "the store at size", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
