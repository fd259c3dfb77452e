"""Placement: which node runs which step. Pure functions; no SQL, no clock.

Every path that places a run (submit and promotion) comes through
:func:`place`, and every set of labels (a step's needs, a node's caps) through
:func:`labels`, so both paths see the same normalisation and the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

from ..errors import InvalidRun
from ..shapes import Assignment

__all__ = ["labels", "place"]


def labels(values: object, what: str) -> tuple[frozenset[str], list[str]]:
    """Normalise a set of capability labels: each a string, surrounding white
    space dropped, duplicates merged. Returns the labels and a warning for each
    change made. Raises ``InvalidRun`` for anything that is not a collection of
    non-empty strings (a lone string included: it is not a set of labels)."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidRun(f"{what} must be a set of strings, not {type(values).__name__}")
    out: set[str] = set()
    warnings = []
    for value in values:
        if not isinstance(value, str):
            raise InvalidRun(f"{what} must be strings; got {type(value).__name__} {value!r}")
        label = value.strip()
        if not label:
            raise InvalidRun(f"{what} must not hold an empty label")
        if label != value:
            warnings.append(f"{what}: {value!r} was read as {label!r}")
        if label in out:
            warnings.append(f"{what}: {label!r} is listed more than once")
        out.add(label)
    return frozenset(out), warnings


def place(
    needs: Sequence[tuple[int, frozenset[str]]],
    caps: Mapping[str, frozenset[str]],
    unavailable: Set[str],
    max_nodes: int,
) -> list[Assignment] | None:
    """Assign every step (``(seq, needs)``) to an available node whose caps
    cover its needs, using at most ``max_nodes`` distinct nodes; None if that
    cannot be done.

    Deterministic: the answer depends only on the arguments' contents, never
    on their order. Steps go to a node the run already uses whenever one
    covers them, so a run takes as few nodes as it needs. The search is
    exact (it never answers None where a placement exists): it tries, for the
    first uncovered set of needs, each distinct way a node could cover the
    sets still open, nodes that cover more first, then by node id.
    """
    groups = sorted({n for _, n in needs}, key=sorted)
    covers: list[tuple[str, frozenset[int]]] = []
    for node_id in sorted(caps):
        if node_id not in unavailable:
            cover = frozenset(i for i, g in enumerate(groups) if g <= caps[node_id])
            if cover:
                covers.append((node_id, cover))
    chosen = _choose(frozenset(range(len(groups))), covers, max_nodes)
    if chosen is None:
        return None
    index = {g: i for i, g in enumerate(groups)}
    return [
        Assignment(seq, next(node for node, cover in chosen if index[n] in cover))
        for seq, n in needs
    ]


def _choose(
    open_: frozenset[int], covers: list[tuple[str, frozenset[int]]], k: int
) -> list[tuple[str, frozenset[int]]] | None:
    """At most ``k`` nodes of ``covers`` that together cover ``open_``, in the
    order chosen; None if there are none."""
    if not open_:
        return []
    if k == 0:
        return None
    first = min(open_)
    seen: set[frozenset[int]] = set()
    candidates = []
    for node_id, cover in covers:
        if first in cover and (useful := cover & open_) not in seen:
            # Nodes that would cover the same open sets are interchangeable
            # here: trying the first (lowest id) of them is enough.
            seen.add(useful)
            candidates.append((node_id, cover, useful))
    candidates.sort(key=lambda c: -len(c[2]))  # stable: ties stay in node id order
    for node_id, cover, useful in candidates:
        rest = _choose(open_ - useful, covers, k - 1)
        if rest is not None:
            return [(node_id, cover), *rest]
    return None
