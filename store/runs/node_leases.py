"""The leases of the run scheduler's nodes (the ``leases`` table): a node
placed for a run holds a lease on it until ``not_after``, renewed by its
claims and heartbeats, released when it has nothing left in the run or the
run ends. A node holds at most one lease (the primary key): a leased node
is busy, and no run is placed on it. (A batch runner's hold on a job is
another thing: ``fence`` and ``runners``.)

Functions take an open transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..engines import Tx

__all__ = ["issue", "lapsed", "release", "release_run", "renew"]


def issue(conn: Tx, run_id: str, node_ids: Iterable[str], not_after: float) -> None:
    """Lease each node to the run until ``not_after``. A node that holds a
    lease already is refused by the primary key (``Conflict``)."""
    conn.executemany(
        "INSERT INTO leases (node_id, run_id, not_after) VALUES (?, ?, ?)",
        ((node_id, run_id, not_after) for node_id in sorted(node_ids)),
    )


def renew(conn: Tx, node_id: str, not_after: float) -> float | None:
    """Extend the node's lease to ``not_after``; the new end, or None if the
    node holds no lease."""
    row = conn.execute(
        "UPDATE leases SET not_after = ? WHERE node_id = ? RETURNING not_after",
        (not_after, node_id),
    ).fetchone()
    return None if row is None else float(row[0])


def release(conn: Tx, node_id: str, run_id: str) -> None:
    """The node has nothing left in the run: it is free."""
    conn.execute("DELETE FROM leases WHERE node_id = ? AND run_id = ?", (node_id, run_id))


def release_run(conn: Tx, run_id: str) -> None:
    """The run ended: every node it held is free."""
    conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))


def lapsed(conn: Tx, now: float) -> list[tuple[str, str]]:
    """The runs holding a lease that ended at or before ``now``, by id, each
    with the first such node."""
    return [
        (run_id, node_id)
        for run_id, node_id in conn.execute(
            "SELECT run_id, MIN(node_id) FROM leases WHERE not_after <= ?"
            " GROUP BY run_id ORDER BY run_id",
            (now,),
        )
    ]
