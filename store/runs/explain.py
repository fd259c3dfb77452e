"""Why a run waits: where it stands in the queue and, step by step, the
nodes that could take the step and why each does not now.

Read-only, and by the rules placement itself follows: a node takes no new
run while it is busy (leased), draining or reserved by a run ahead that
waited too long (:mod:`store.runs.waiting`), and a run is placed whole on at
most ``max_leases`` nodes (``match.place``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..engines import Tx
from ..errors import NotFound
from ..shapes import NodeView
from ..states import RunState
from . import match, nodes, waiting

__all__ = ["explain"]

#: Why a node that covers a step's needs does not take it now. A node that
#: could is given ``why: None``.
BUSY, DRAINING, RESERVED = "busy", "draining", "reserved"
OVER_MAX = "over max_leases_per_run"


def explain(
    conn: Tx, run_id: str, max_leases: int, reserve_after: float | None = None
) -> dict[str, Any]:
    """The run's state, its ``position`` in the queue (1 for the head; None
    unless QUEUED) with the ``ahead`` run ids before it, the seconds it
    ``waited`` (so far, or until it started or ended), whether it is
    ``reserving`` nodes (QUEUED for ``reserve_after`` seconds or more, and
    placeable at all: see :meth:`store.runs.nodes.Fleet.reserves`), and
    its ``steps``: each with its ``needs``, its ``node`` once placed, and
    ``nodes``, every node whose caps cover the needs with ``why`` it cannot
    take the step now (None if it can): ``busy`` (with the ``run_id`` holding
    it and its ``lease_until``), ``draining``, ``reserved`` (with the
    ``run_id`` of the first run ahead that reserves it), in that order.

    A free node is called ``over max_leases_per_run`` when every step of a
    QUEUED run has a free node but no placement on at most ``max_leases``
    of them exists. Raises ``NotFound`` for an unknown run."""
    found = conn.execute(
        "SELECT state, created_at, started_at, ended_at FROM runs WHERE id = ?", (run_id,)
    ).fetchone()
    if found is None:
        raise NotFound(f"no run {run_id!r}")
    state, created_at, started_at, ended_at = found
    steps = [
        (seq, name, frozenset(json.loads(needs)), node_id or "")
        for seq, name, needs, node_id in conn.execute(
            "SELECT seq, name, needs, node_id FROM steps WHERE run_id = ? ORDER BY seq", (run_id,)
        )
    ]
    fleet = nodes.list_nodes(conn)
    queued = state == RunState.QUEUED
    ahead = (
        [
            other
            for (other,) in conn.execute(
                f"SELECT id FROM runs WHERE state = '{RunState.QUEUED}' AND created_at < ?"
                " ORDER BY created_at, id",
                (created_at,),
            )
        ]
        if queued
        else []
    )
    candidates = {seq: [n for n in fleet if needs <= n.caps] for seq, _, needs, _ in steps}
    starving = waiting.cutoff(conn.now, reserve_after)
    held: dict[str, str] = {}
    reserving = False
    if queued:
        advertised = nodes.Fleets().get(conn)
        # Only the runs ahead of this one hold nodes back from it.
        through = min(starving, math.nextafter(created_at, -math.inf))
        held = dict(waiting.Reservations().get(conn, advertised, through, max_leases))
        needs = [(seq, needs) for seq, _, needs, _ in steps]
        reserving = created_at <= starving and bool(advertised.reserves(needs, max_leases))
    why = {n.node_id: _why(n, held) for n in fleet}
    if queued and _only_max_leases_stops(steps, fleet, why, max_leases):
        why = {node_id: OVER_MAX if w is None else w for node_id, w in why.items()}
    until = started_at if started_at is not None else ended_at
    return {
        "run_id": run_id,
        "state": state,
        "position": len(ahead) + 1 if queued else None,
        "ahead": ahead,
        "waited": max(0.0, (conn.now if until is None else until) - created_at),
        "reserving": reserving,
        "steps": [
            {
                "seq": seq,
                "name": name,
                "needs": sorted(needs),
                "node": node_id,
                "nodes": [_candidate(n, why[n.node_id], held) for n in candidates[seq]],
            }
            for seq, name, needs, node_id in steps
        ],
    }


def _why(node: NodeView, held: dict[str, str]) -> str | None:
    if node.run_id:
        return BUSY
    if node.draining:
        return DRAINING
    return RESERVED if node.node_id in held else None


def _only_max_leases_stops(
    steps: list[tuple[int, str, frozenset[str], str]],
    fleet: list[NodeView],
    why: dict[str, str | None],
    max_leases: int,
) -> bool:
    """Whether every step has a free node, yet the run fits on none of at
    most ``max_leases`` of them."""
    free = {n.node_id: n.caps for n in fleet if why[n.node_id] is None}
    needs = [(seq, needs) for seq, _, needs, _ in steps]
    if not all(any(n <= caps for caps in free.values()) for _, n in needs):
        return False
    return match.place(needs, free, frozenset(), max_leases) is None


def _candidate(node: NodeView, why: str | None, held: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"node_id": node.node_id, "name": node.name, "why": why}
    if why == BUSY:
        out.update(run_id=node.run_id, lease_until=node.not_after)
    elif why == RESERVED:
        out.update(run_id=held[node.node_id])
    return out
