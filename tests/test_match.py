"""The matcher: valid, deterministic and exact placements, and label normalisation."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import store
from store.runs.match import labels, place

LABELS = ["gpu", "linux", "arm", "ssd"]

needs_st = st.frozensets(st.sampled_from(LABELS), max_size=2)
steps_st = st.lists(needs_st, min_size=1, max_size=5).map(
    lambda ns: [(i, n) for i, n in enumerate(ns, 1)]
)
caps_st = st.dictionaries(
    st.sampled_from([f"n{i}" for i in range(6)]),
    st.frozensets(st.sampled_from(LABELS), max_size=4),
    max_size=6,
)


def brute_force(
    steps: list[tuple[int, frozenset[str]]],
    caps: dict[str, frozenset[str]],
    unavailable: set[str],
    k: int,
) -> bool:
    """Whether any set of at most k available nodes covers every step."""
    free = [n for n in caps if n not in unavailable]
    return any(
        all(any(need <= caps[n] for n in combo) for _, need in steps)
        for size in range(1, k + 1)
        for combo in itertools.combinations(free, size)
    )


@settings(max_examples=300, deadline=None)
@given(steps_st, caps_st, st.sets(st.sampled_from([f"n{i}" for i in range(6)])), st.integers(1, 3))
def test_place_is_valid_exact_and_deterministic(
    steps: list[tuple[int, frozenset[str]]],
    caps: dict[str, frozenset[str]],
    unavailable: set[str],
    k: int,
) -> None:
    """A placement exists exactly when the matcher finds one; it puts each step
    on an available node that covers its needs, within k nodes; and it does
    not depend on the order its inputs come in."""
    placed = place(steps, caps, unavailable, k)
    assert (placed is not None) == brute_force(steps, caps, unavailable, k)
    if placed is None:
        return
    assert [a.seq for a in placed] == [seq for seq, _ in steps]
    for a, (_, need) in zip(placed, steps, strict=True):
        assert a.node_id not in unavailable
        assert need <= caps[a.node_id]
    assert len({a.node_id for a in placed}) <= k
    shuffled = list(caps.items())
    random.Random(0).shuffle(shuffled)
    assert place(steps, dict(shuffled), set(unavailable), k) == placed


def test_steps_share_a_node_when_one_covers_them() -> None:
    """A run takes as few nodes as it can: later steps go where earlier ones are."""
    caps = {"a": frozenset({"linux"}), "b": frozenset({"linux", "gpu"})}
    placed = place([(1, frozenset({"linux"})), (2, frozenset({"gpu"}))], caps, set(), 2)
    assert placed == [store.Assignment(1, "b"), store.Assignment(2, "b")]


def test_no_free_node_places_nothing() -> None:
    assert place([(1, frozenset())], {"a": frozenset()}, {"a"}, 4) is None


def test_labels_normalise_and_warn() -> None:
    got, warnings = labels([" gpu", "gpu", "linux"], "needs")
    assert got == frozenset({"gpu", "linux"})
    assert len(warnings) == 2


@pytest.mark.parametrize("bad", ["gpu", b"gpu", 5, [1], [""], ["  "], None])
def test_labels_refuse_what_is_not_a_set_of_strings(bad: object) -> None:
    with pytest.raises(store.InvalidRun, match="needs"):
        labels(bad, "needs")
