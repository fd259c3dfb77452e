"""The waiting line: the QUEUED runs in FIFO order, and the nodes held back
for those that have waited too long.

A QUEUED run that has waited ``reserve_after`` seconds *reserves*: no run
behind it in FIFO order is placed on a node that could take one of its
steps, until it starts. A wake places what fits, so a QUEUED run is most
often one that does not fit now; either way, every such run reserves (a
submit then holds back a little more than the next wake would). Functions
take an open transaction (``Tx``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..engines import Tx
from ..states import RunState
from .nodes import Fleet

__all__ = ["PAGE", "Reservations", "bump", "cutoff", "queued"]

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


def bump(conn: Tx) -> None:
    """Note that runs left the queue (placed or ended): what a
    :class:`Reservations` read of it is stale."""
    conn.execute("UPDATE queue_generation SET generation = generation + 1")


def queued(conn: Tx, through: float = math.inf, after: float = -math.inf) -> Iterator[Waiting]:
    """The QUEUED runs submitted after ``after`` and at or before ``through``,
    in FIFO order, read a page at a time so that a scan that stops early
    reads little. ``created_at`` is unique and strictly increasing, so it
    alone orders the queue and pages it."""
    while True:
        rows = conn.execute(
            "SELECT r.id, r.created_at, s.seq, s.needs FROM"
            f" (SELECT id, created_at FROM runs WHERE state = '{RunState.QUEUED}'"
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


@dataclass(frozen=True, slots=True)
class _Held:
    """The nodes reserved (each with the first run reserving it) by the
    QUEUED runs submitted up to ``last``, as of ``key``: the fleet's
    generation, the queue's generation and ``max_nodes``."""

    key: tuple[int, int, int]
    through: float
    last: float
    nodes: Mapping[str, str]


class Reservations:
    """The nodes held back by the runs that waited ``reserve_after``, kept
    by a store between calls while no node was advertised and no run left
    the queue: a submit then reads only the runs that waited long enough
    since the last call (most often none), however long the backlog.

    Runs join the queue at its end and no run enters it again once it
    left, so what was read stays true until one of the two generations
    moves. Safe between threads without a lock: what it keeps is replaced
    whole; two threads that both read it again agree.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: _Held | None = None

    def get(self, conn: Tx, fleet: Fleet, through: float, max_nodes: int) -> Mapping[str, str]:
        """The nodes reserved by the QUEUED runs submitted at or before
        ``through`` (see :func:`cutoff`), each with the first of them, in
        FIFO order, that reserves it. A run reserves the nodes that could
        take one of its steps, if it could be placed at all (with every
        node free, on at most ``max_nodes``): one that never could would
        otherwise hold them for ever."""
        if through == -math.inf:
            return {}
        (generation,) = conn.execute("SELECT generation FROM queue_generation").fetchone()
        key = (fleet.generation, int(generation), max_nodes)
        known = self._held
        if known is None or known.key != key or through < known.through:
            known = _Held(key, through, -math.inf, {})
        held: dict[str, str] | None = None
        last = known.last
        if len(known.nodes) < len(fleet.caps):  # else there is nothing more to learn
            for run_id, created_at, needs in queued(conn, through, after=known.last):
                held = dict(known.nodes) if held is None else held
                last = created_at
                for node_id in fleet.reserves(needs, max_nodes):
                    held.setdefault(node_id, run_id)
                if len(held) == len(fleet.caps):
                    break
        known = _Held(key, through, last, known.nodes if held is None else held)
        self._held = known
        return known.nodes
