"""The waiting line: the QUEUED runs in FIFO order, and the nodes held back
for those that have waited too long.

A QUEUED run that has waited ``reserve_after`` seconds *reserves*: no run
behind it in FIFO order is placed on a node that could take one of its
steps, until it starts. A QUEUED run is one the last wake could not place,
so every such run reserves. Read-only; functions take an open transaction's
connection.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Set

from .db import Tx
from .nodes import Fleet

__all__ = ["PAGE", "cutoff", "queued", "reservations"]

#: QUEUED runs read at a time.
PAGE = 64

#: A QUEUED run, as the queue reads it: its id, when it was submitted, and
#: its steps' ``(seq, needs)``.
Waiting = tuple[str, float, list[tuple[int, frozenset[str]]]]


def cutoff(now: float, reserve_after: float | None) -> float:
    """The latest ``created_at`` of a run that has waited ``reserve_after``
    seconds at ``now``: the runs submitted then or before reserve. ``-inf``
    when nothing reserves (``reserve_after=None``); ``inf`` when every
    QUEUED run does (0, even for a run stamped after ``now`` by a clock that
    stalled or stepped back: see ``runs.submit``)."""
    if reserve_after is None:
        return -math.inf
    return now - reserve_after if reserve_after else math.inf


def queued(conn: Tx, through: float = math.inf) -> Iterator[Waiting]:
    """The QUEUED runs submitted at or before ``through``, in FIFO order,
    read a page at a time so that a scan that stops early reads little.
    ``created_at`` is unique and strictly increasing, so it alone orders the
    queue and pages it."""
    after = -math.inf
    while True:
        rows = conn.execute(
            "SELECT r.id, r.created_at, s.seq, s.needs FROM"
            " (SELECT id, created_at FROM runs WHERE state = 'QUEUED'"
            "  AND created_at > ? AND created_at <= ? ORDER BY created_at, id LIMIT ?) r"
            " JOIN steps s ON s.run_id = r.id ORDER BY r.created_at, s.seq",
            (after, through, PAGE),
        ).fetchall()
        if not rows:
            return
        for run_id, group in itertools.groupby(rows, key=lambda row: row[0]):
            steps = list(group)
            needs = [(seq, frozenset(json.loads(n))) for _, _, seq, n in steps]
            yield run_id, steps[0][1], needs
        after = rows[-1][1]


def reservations(
    conn: Tx, fleet: Fleet, through: float, among: Set[str] | None = None
) -> dict[str, str]:
    """The nodes reserved by the QUEUED runs submitted at or before
    ``through`` (see :func:`cutoff`), each with the first of those runs, in
    FIFO order, that reserves it. Reading stops once every node of
    ``among`` (by default, every node) is known to be reserved."""
    held: dict[str, str] = {}
    if through == -math.inf:
        return held
    wanted = fleet.caps.keys() if among is None else among
    for run_id, _, needs in queued(conn, through):
        for node_id in fleet.covering(needs):
            held.setdefault(node_id, run_id)
        if wanted <= held.keys():
            break
    return held
