"""The queue: QUEUED runs, promoted in FIFO order as capacity frees.

``runs.state`` is the queue; there is no queue table. Functions take an open
transaction's connection and run inside it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping

from . import match, nodes, record, runs
from .db import Tx
from .shapes import Advert, Assignment

__all__ = ["promote", "wake"]

#: QUEUED runs read at a time by the scan.
PAGE = 64


def wake(
    conn: Tx, now: float, lease_ttl: float, max_leases: int, fleets: nodes.Fleets
) -> list[str]:
    """Scan the QUEUED runs in FIFO order (``created_at``, then id) and promote
    every run that fits the available nodes now; return their ids, in order.

    The nodes a promotion takes join ``blocked`` within the same scan, so a
    later run in the queue never gets them. With ``lease_ttl == 0`` no lease
    may be issued, so nothing is promoted. The scan stops once no node is
    free: nothing further could be placed.
    """
    if not lease_ttl or not nodes.any_free(conn):
        return []
    fleet = fleets.get(conn)
    ads, caps = fleet.adverts, fleet.caps
    blocked = nodes.unavailable(conn)
    promoted: list[str] = []
    if blocked >= caps.keys():
        return promoted
    for run_id, needs in _queued(conn):
        placed = match.place(needs, caps, blocked, max_leases)
        if placed is not None:
            blocked |= promote(conn, run_id, placed, ads, now=now, lease_ttl=lease_ttl)
            promoted.append(run_id)
            if blocked >= caps.keys():
                break
    return promoted


def _queued(conn: Tx) -> Iterator[tuple[str, list[tuple[int, frozenset[str]]]]]:
    """The QUEUED runs with their steps' needs, in FIFO order, read a page at a
    time so that a scan that stops early reads little. ``created_at`` is unique
    and strictly increasing, so it alone orders the queue and pages it."""
    after = -math.inf
    while True:
        rows = conn.execute(
            "SELECT r.id, r.created_at, s.seq, s.needs FROM"
            " (SELECT id, created_at FROM runs WHERE state = 'QUEUED' AND created_at > ?"
            "  ORDER BY created_at, id LIMIT ?) r"
            " JOIN steps s ON s.run_id = r.id ORDER BY r.created_at, s.seq",
            (after, PAGE),
        ).fetchall()
        if not rows:
            return
        for run_id, group in itertools.groupby(rows, key=lambda row: row[0]):
            yield run_id, [(seq, frozenset(json.loads(needs))) for _, _, seq, needs in group]
        after = rows[-1][1]


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
    and name the nodes in its Record. Returns the nodes the run now holds."""
    placed = list(placed)
    conn.executemany(
        "UPDATE steps SET node_id = ? WHERE run_id = ? AND seq = ?",
        ((a.node_id, run_id, a.seq) for a in placed),
    )
    taken = {a.node_id for a in placed}
    runs.issue_leases(conn, run_id, taken, now + lease_ttl)
    conn.execute(
        "UPDATE runs SET state = 'RUNNING', started_at = ? WHERE id = ? AND state = 'QUEUED'",
        (now, run_id),
    )
    record.fill_record(conn, run_id, record.label(placed, ads))
    return taken
