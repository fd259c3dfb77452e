"""The queue: QUEUED runs, promoted in FIFO order as capacity frees.

``runs.state`` is the queue; there is no queue table. Functions take an open
transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..engines import Tx
from ..shapes import Advert, Assignment
from ..states import RunState
from . import match, node_leases, nodes, record, waiting

__all__ = ["promote", "wake"]


def wake(
    conn: Tx,
    now: float,
    *,
    lease_ttl: float,
    max_leases: int,
    fleets: nodes.Fleets,
    reserve_after: float | None = None,
) -> list[str]:
    """Scan the QUEUED runs in FIFO order (``created_at``, then id) and promote
    every run that fits the available nodes now; return their ids, in order.

    The nodes a promotion takes join ``blocked`` within the same scan, so a
    later run in the queue never gets them; so do the nodes a run that has
    waited ``reserve_after`` seconds and still does not fit could use (it
    reserves them: see :mod:`store.runs.waiting`). With ``lease_ttl == 0`` no
    lease may be issued, so nothing is promoted. The scan stops once every
    node is blocked: nothing further could be placed.
    """
    if not lease_ttl or not nodes.any_free(conn):
        return []
    fleet = fleets.get(conn)
    ads, caps = fleet.adverts, fleet.caps
    blocked = nodes.unavailable(conn)
    promoted: list[str] = []
    if blocked >= caps.keys():
        return promoted
    starving = waiting.cutoff(now, reserve_after)
    for run_id, created_at, needs in waiting.queued(conn):
        placed = match.place(needs, caps, blocked, max_leases)
        if placed is not None:
            blocked |= promote(conn, run_id, placed, ads, now=now, lease_ttl=lease_ttl)
            promoted.append(run_id)
        elif created_at <= starving:
            blocked |= fleet.reserves(needs, max_leases)
        if blocked >= caps.keys():
            break
    return promoted


def promote(
    conn: Tx,
    run_id: str,
    placed: Iterable[Assignment],
    ads: Mapping[str, Advert],
    *,
    now: float,
    lease_ttl: float,
) -> set[str]:
    """Place a QUEUED run: fill its steps' nodes, lease them, make it RUNNING
    and name the nodes in its Record; the queue's generation moves. Returns
    the nodes the run now holds."""
    placed = list(placed)
    conn.executemany(
        "UPDATE steps SET node_id = ? WHERE run_id = ? AND seq = ?",
        ((a.node_id, run_id, a.seq) for a in placed),
    )
    taken = {a.node_id for a in placed}
    node_leases.issue(conn, run_id, taken, now + lease_ttl)
    conn.execute(
        f"UPDATE runs SET state = '{RunState.RUNNING}', started_at = ?"
        f" WHERE id = ? AND state = '{RunState.QUEUED}'",
        (now, run_id),
    )
    record.fill_record(conn, run_id, record.label(placed, ads))
    waiting.bump(conn)
    return taken
