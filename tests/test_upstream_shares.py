"""Upstreams shared by the runners of a store (SPEC §2d, ``store.jobs.upstreams``):
concurrency slots that never sum past the limit, the rate divided among the
runners that want it, holds every runner sees; on both engines, with the
store's clock stepped by the test."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store
from store import UpstreamWant
from store.ledger import Ledger
from tests.helpers import Clock

UP = "https://example.org:443"
LAPSE = 5.0


def want(  # type: ignore[no-untyped-def]
    demand: int = 1,
    concurrency: int | None = 3,
    inflight: int = 0,
    hold: float = 0.0,
    rate: float | None = None,
):
    return [UpstreamWant(UP, demand, concurrency, rate, inflight, hold)]


def slots(db: store.Store, runner: str, **kw: object) -> int | None:
    return Ledger.of(db).sync_upstreams(runner, LAPSE, want(**kw))[UP].slots  # type: ignore[arg-type]


def test_one_runner_alone_gets_the_whole_upstream(db: store.Store, clock: Clock) -> None:
    share = Ledger.of(db).sync_upstreams("a", LAPSE, want(concurrency=3))[UP]
    assert (share.runners, share.slots, share.held_for) == (1, 3, 0.0)
    assert Ledger.of(db).sync_upstreams("a", LAPSE, want(concurrency=None))[UP].slots is None


def test_two_runners_converge_to_equal_shares_never_past_the_limit(
    db: store.Store, clock: Clock
) -> None:
    assert slots(db, "a", concurrency=4) == 4
    assert slots(db, "b", concurrency=4) == 0  # a holds them all until it syncs
    assert slots(db, "a", concurrency=4) == 2
    assert slots(db, "b", concurrency=4) == 2
    share = Ledger.of(db).sync_upstreams("b", LAPSE, want(concurrency=4))[UP]
    assert share.runners == 2


def test_slots_in_flight_are_kept_until_they_return(db: store.Store, clock: Clock) -> None:
    assert slots(db, "a", concurrency=2) == 2
    assert slots(db, "b", concurrency=2) == 0
    # a's fair part is 1 now, but both its slots are fetching: it keeps both.
    assert slots(db, "a", concurrency=2, inflight=2) == 1
    assert slots(db, "b", concurrency=2) == 0
    assert slots(db, "a", concurrency=2, inflight=1) == 1
    assert slots(db, "b", concurrency=2) == 1


def test_a_runner_that_wants_nothing_keeps_its_share_until_another_does(
    db: store.Store, clock: Clock
) -> None:
    assert slots(db, "a", concurrency=2, demand=0) == 2  # nobody wants it
    assert slots(db, "b", concurrency=2, demand=0) == 0  # a keeps it
    assert slots(db, "b", concurrency=2) == 0  # b wants it: a gives it back first
    assert slots(db, "a", concurrency=2, demand=0) == 0
    assert slots(db, "b", concurrency=2) == 2
    assert Ledger.of(db).sync_upstreams("b", LAPSE, want(concurrency=2))[UP].runners == 1


def test_leftover_slots_go_round_in_turn(db: store.Store, clock: Clock) -> None:
    """Three runners, two slots: each gets a turn, none waits for ever."""
    got: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    for _ in range(6):
        for _ in range(3):  # every runner syncs, twice, so grants settle
            for runner in got:
                slots(db, runner, concurrency=2)
        for runner in got:
            got[runner] += slots(db, runner, concurrency=2) or 0
        clock.tick(LAPSE)
    assert all(n > 0 for n in got.values()), got


def test_a_dead_runner_s_share_counts_until_it_lapses(db: store.Store, clock: Clock) -> None:
    assert slots(db, "a", concurrency=2) == 2
    assert slots(db, "b", concurrency=2) == 0
    clock.tick(LAPSE - 1)
    assert slots(db, "b", concurrency=2) == 0
    clock.tick(2)
    assert slots(db, "b", concurrency=2) == 2


def test_a_closed_runner_gives_its_share_back_at_once(db: store.Store, clock: Clock) -> None:
    Ledger.of(db).register_runner("a", LAPSE)
    assert slots(db, "a", concurrency=2) == 2
    Ledger.of(db).retire_runner("a")
    assert slots(db, "b", concurrency=2) == 2


def test_a_hold_is_seen_by_every_runner_and_never_shortened(db: store.Store, clock: Clock) -> None:
    Ledger.of(db).sync_upstreams("a", LAPSE, want(hold=5.0))
    clock.tick(1)
    assert Ledger.of(db).sync_upstreams("b", LAPSE, want())[UP].held_for == pytest.approx(4.0)
    Ledger.of(db).sync_upstreams("b", LAPSE, want(hold=1.0))
    assert Ledger.of(db).sync_upstreams("a", LAPSE, want())[UP].held_for == pytest.approx(4.0)
    clock.tick(10)
    assert Ledger.of(db).sync_upstreams("a", LAPSE, want())[UP].held_for == 0.0


def test_the_rate_is_shared_and_never_granted_twice(db: store.Store, clock: Clock) -> None:
    def rate(runner: str, demand: int = 1) -> float | None:
        return Ledger.of(db).sync_upstreams(runner, LAPSE, want(demand, None, rate=20.0))[UP].rate

    assert rate("a") == 20.0
    assert rate("b") == 0.0  # a holds it all until it syncs
    assert rate("a") == 10.0
    assert rate("b") == 10.0
    assert rate("a", demand=0) == 0.0  # b wants it
    assert rate("b") == 20.0
    assert rate("b", demand=0) == 20.0  # nobody wants it: b keeps it


def test_upstreams_no_longer_named_are_let_go(db: store.Store, clock: Clock) -> None:
    assert slots(db, "a", concurrency=1) == 1
    assert Ledger.of(db).sync_upstreams("a", LAPSE, []) == {}
    assert slots(db, "b", concurrency=1) == 1


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(0, 3),  # demand
            st.floats(0.0, 0.5),  # returned: the share of its fetches that came back
            st.sampled_from([0.0, 0.0, 1.0, LAPSE]),  # time passing before it
        ),
        max_size=40,
    ),
    concurrency=st.integers(1, 4),
)
def test_fetches_in_flight_never_sum_past_the_concurrency(
    fresh_location: Callable[[], contextlib.AbstractContextManager[str]],
    steps: list[tuple[str, int, float, float]],
    concurrency: int,
) -> None:
    """Whatever the runners want, when they sync and how time passes, the
    targets in flight of the runners still live (each starting as many as
    its grant lets it) never number more than ``concurrency``. A runner
    silent for longer than its lapse is dead: its fetches are gone with it
    (one that lives on past its lapse is the documented exception)."""
    clock = Clock()
    inflight = {"a": 0, "b": 0, "c": 0}
    seen = {"a": -1e9, "b": -1e9, "c": -1e9}
    with fresh_location() as where, store.open(where, clock=clock.time) as db:
        for runner, demand, returned, gap in steps:
            clock.tick(gap)
            if clock.time() - seen[runner] > LAPSE:
                inflight[runner] = 0  # silent past its lapse: it died, and this one is new
            inflight[runner] -= int(inflight[runner] * returned)
            share = Ledger.of(db).sync_upstreams(
                runner, LAPSE, want(demand, concurrency, inflight[runner])
            )
            granted = share[UP].slots
            assert granted is not None
            seen[runner] = clock.time()
            if demand:
                inflight[runner] = max(inflight[runner], min(granted, demand))
            live = [r for r in inflight if clock.time() - seen[r] <= LAPSE]
            assert sum(inflight[r] for r in live) <= concurrency


def test_the_store_lists_what_is_held_or_wanted(db: store.Store, clock: Clock) -> None:
    Ledger.of(db).sync_upstreams("a", LAPSE, want(concurrency=2, hold=30.0))
    Ledger.of(db).sync_upstreams("b", LAPSE, [UpstreamWant("other", 2, None, 5.0, 0)])
    clock.tick(2)
    views = {v.name: v for v in db.upstreams()}
    assert views[UP].held_until == pytest.approx(clock.now + 28.0)
    assert (views["other"].runners, views["other"].demand, views["other"].rate) == (1, 2, 5.0)
    clock.tick(30)  # a's and b's rows lapsed, and the hold is over
    assert db.upstreams() == []
