"""Nodes: what they advertise, whether they drain, and which are unavailable.

Functions take an open transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..engines import Tx
from ..errors import NotFound
from ..shapes import Advert, NodeView
from .match import labels, place

__all__ = [
    "ANY_FREE",
    "GENERATION",
    "Fleet",
    "Fleets",
    "advertise",
    "adverts",
    "any_free",
    "list_nodes",
    "require",
    "set_draining",
    "unavailable",
]


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the nodes advertised as of one ``generation`` of the store's
    (bumped by every advertise): each node's advert and caps, by id, in id
    order. ``known`` remembers, for sets of needs already asked about,
    whether a placement exists with every node free; ``covers``, the nodes
    that could take one of them."""

    generation: int
    adverts: Mapping[str, Advert]
    caps: Mapping[str, frozenset[str]]
    known: dict[tuple[frozenset[frozenset[str]], int], bool] = field(default_factory=dict)
    covers: dict[frozenset[frozenset[str]], frozenset[str]] = field(default_factory=dict)

    def placeable(self, needs: Sequence[tuple[int, frozenset[str]]], max_nodes: int) -> bool:
        """Whether steps of these needs could be placed with every node free."""
        key = (frozenset(n for _, n in needs), max_nodes)
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = place(needs, self.caps, frozenset(), max_nodes) is not None
        return found

    def reserves(
        self, needs: Sequence[tuple[int, frozenset[str]]], max_nodes: int
    ) -> frozenset[str]:
        """The nodes a run of these needs that waited too long holds back:
        those that could take one of its steps, if it could be placed at all."""
        return self.covering(needs) if self.placeable(needs, max_nodes) else frozenset()

    def covering(self, needs: Sequence[tuple[int, frozenset[str]]]) -> frozenset[str]:
        """The nodes whose caps cover the needs of at least one of the steps."""
        key = frozenset(n for _, n in needs)
        found = self.covers.get(key)
        if found is None:
            found = self.covers[key] = frozenset(
                node_id for node_id, caps in self.caps.items() if any(n <= caps for n in key)
            )
        return found


class Fleets:
    """The last :class:`Fleet` a store read, kept while no node is advertised
    again: a submit or a wake then reads one number, not every advert.

    Safe between threads without a lock: a fleet is never changed but for
    ``known`` and ``covers`` (whose entries are facts of its generation), and
    is replaced whole; two threads that both find it stale both read it again.
    """

    __slots__ = ("_fleet",)

    def __init__(self) -> None:
        self._fleet: Fleet | None = None

    @property
    def last(self) -> Fleet | None:
        """The fleet read last, if any: as of its generation, which may be
        stale by now."""
        return self._fleet

    def get(self, conn: Tx, generation: int | None = None) -> Fleet:
        """The nodes as ``conn``'s transaction sees them, given their
        ``generation`` if the caller read it (:data:`GENERATION`)."""
        if generation is None:
            (generation,) = conn.execute(f"SELECT {GENERATION}").fetchone()
        fleet = self._fleet
        if fleet is None or fleet.generation != generation:
            ads = adverts(conn)
            fleet = Fleet(
                generation, ads, {node_id: frozenset(a.caps) for node_id, a in ads.items()}
            )
            self._fleet = fleet
        return fleet


def advertise(conn: Tx, advert: Advert, now: float) -> None:
    """Add the node, or replace a known node's name and caps (its draining
    flag and lease stay as they are)."""
    if not isinstance(advert, Advert):
        raise TypeError(f"advertise takes a store.Advert, not {type(advert).__name__}")
    for name in ("node_id", "name"):
        value = getattr(advert, name)
        if not isinstance(value, str) or (name == "node_id" and not value.strip()):
            raise ValueError(f"Advert.{name} must be a non-empty str, not {value!r}")
    caps, _ = labels(advert.caps, "Advert.caps")
    conn.execute(
        "INSERT INTO nodes (id, name, caps, last_seen) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET name = excluded.name, caps = excluded.caps,"
        " last_seen = excluded.last_seen",
        (advert.node_id, advert.name, json.dumps(sorted(caps)), now),
    )
    conn.execute("UPDATE node_generation SET generation = generation + 1")


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
    """Every advertised node, by id (in id order), with its caps as a frozenset."""
    return {
        node_id: Advert(node_id, name, frozenset(json.loads(caps)))
        for node_id, name, caps in conn.execute("SELECT id, name, caps FROM nodes ORDER BY id")
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


#: The nodes' generation, as an expression: bumped whenever a node is
#: advertised (:class:`Fleets` reads the adverts again only then).
GENERATION = "(SELECT generation FROM node_generation)"

#: Whether some node could take a run now (neither busy nor draining), as
#: an expression: from three counts (draining nodes are indexed), without
#: reading what the nodes advertise or looking each node up.
ANY_FREE = (
    "((SELECT count(*) FROM nodes) - (SELECT count(*) FROM leases)"
    " - (SELECT count(*) FROM nodes WHERE draining = 1"
    "    AND NOT EXISTS (SELECT 1 FROM leases WHERE leases.node_id = nodes.id)) > 0)"
)


def any_free(conn: Tx) -> bool:
    """Whether some node could take a run now (:data:`ANY_FREE`)."""
    (free,) = conn.execute(f"SELECT {ANY_FREE}").fetchone()
    return bool(free)


def unavailable(conn: Tx) -> set[str]:
    """Nodes that take no new run: busy (holding a lease) or draining. Submit
    and promotion both place runs only outside this set."""
    return {
        node_id
        for (node_id,) in conn.execute(
            "SELECT node_id FROM leases UNION SELECT id FROM nodes WHERE draining = 1"
        )
    }
