"""Nodes: what they advertise, whether they drain, and which are unavailable.

Functions take an open transaction's connection and run inside it.
"""

from __future__ import annotations

import json

from .db import Tx
from .errors import NotFound
from .match import labels
from .shapes import Advert, NodeView

__all__ = [
    "advertise",
    "adverts",
    "any_free",
    "list_nodes",
    "require",
    "set_draining",
    "unavailable",
]


def advertise(conn: Tx, advert: Advert, now: float) -> None:
    """Add the node, or replace a known node's name and caps (its draining
    flag and lease stay as they are)."""
    if not isinstance(advert, Advert):
        raise TypeError(f"advertise takes a store.Advert, not {type(advert).__name__}")
    for field in ("node_id", "name"):
        value = getattr(advert, field)
        if not isinstance(value, str) or (field == "node_id" and not value.strip()):
            raise ValueError(f"Advert.{field} must be a non-empty str, not {value!r}")
    caps, _ = labels(advert.caps, "Advert.caps")
    conn.execute(
        "INSERT INTO nodes (id, name, caps, last_seen) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET name = excluded.name, caps = excluded.caps,"
        " last_seen = excluded.last_seen",
        (advert.node_id, advert.name, json.dumps(sorted(caps)), now),
    )


def require(conn: Tx, node_id: str, now: float | None = None) -> None:
    """Raise ``NotFound`` unless the node is known; given ``now``, note that
    the node was seen then."""
    if now is None:
        found = conn.execute("SELECT 1 FROM nodes WHERE id = ?", (node_id,)).fetchone()
    else:
        found = conn.execute(
            "UPDATE nodes SET last_seen = ? WHERE id = ? RETURNING 1", (now, node_id)
        ).fetchone()
    if found is None:
        raise NotFound(f"no node {node_id!r}: advertise it first")


def set_draining(conn: Tx, node_id: str, draining: bool) -> None:
    """Mark a node draining (it finishes its run, takes no new one) or not."""
    if (
        conn.execute(
            "UPDATE nodes SET draining = ? WHERE id = ?", (int(draining), node_id)
        ).rowcount
        != 1
    ):
        raise NotFound(f"no node {node_id!r}: advertise it first")


def adverts(conn: Tx) -> dict[str, Advert]:
    """Every advertised node, by id, with its caps as a frozenset."""
    return {
        node_id: Advert(node_id, name, frozenset(json.loads(caps)))
        for node_id, name, caps in conn.execute("SELECT id, name, caps FROM nodes")
    }


def list_nodes(conn: Tx) -> list[NodeView]:
    """Every node, by id, with the lease it holds."""
    return [
        NodeView(node_id, name, frozenset(json.loads(caps)), bool(draining), seen, run, until)
        for node_id, name, caps, draining, seen, run, until in conn.execute(
            "SELECT id, name, caps, draining, last_seen, run_id, not_after"
            " FROM nodes LEFT JOIN leases ON leases.node_id = nodes.id ORDER BY id"
        )
    ]


def any_free(conn: Tx) -> bool:
    """Whether some node could take a run now (neither busy nor draining):
    one query, without reading what the nodes advertise."""
    return (
        conn.execute(
            "SELECT 1 FROM nodes WHERE draining = 0"
            " AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.node_id = nodes.id) LIMIT 1"
        ).fetchone()
        is not None
    )


def unavailable(conn: Tx) -> set[str]:
    """Nodes that take no new run: busy (holding a lease) or draining. Submit
    and promotion both place runs only outside this set."""
    return {
        node_id
        for (node_id,) in conn.execute(
            "SELECT node_id FROM leases UNION SELECT id FROM nodes WHERE draining = 1"
        )
    }
