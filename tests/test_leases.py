"""Job leases between runners, the key facts one by one (the state machine
of ``test_leases_model.py`` holds them all against a model): a stall gives
its time back, a beat that finds the clock kept takes nothing by lapse, a
lapse lets another take over, a cancel is released at the holder's beat,
room limits what is taken."""

from __future__ import annotations

import psycopg
import pytest

import store
from store import Conflict, Lease, TargetOutcome
from store.engines import LOCKS
from store.ledger import Ledger
from tests.helpers import Clock, raw
from tests.leases_model import LAPSE

pytestmark = pytest.mark.timeout(120)


# -- the key facts, one by one ------------------------------------------------------


def lease_of(db: store.Store, job_id: str) -> tuple[str | None, int, float | None]:
    """The job's lease as stored: owner, token, until."""
    ((owner, token, until),) = raw(
        db.path, "SELECT lease_owner, lease_token, lease_until FROM jobs WHERE id = ?", (job_id,)
    )
    return owner, token, until


def done(job_id: str, pos: int, lease: Lease) -> TargetOutcome:
    return TargetOutcome(job_id, pos, "done", result='"x"', lease=lease)


def test_a_stall_gives_the_time_back(db: store.Store, clock: Clock) -> None:
    """No beat for over half a lease: the whole gap is added to every lease
    and heartbeat, so the silent owner keeps its job."""
    Ledger.of(db).register_runner("a")
    Ledger.of(db).register_runner("b")
    Ledger.of(db).create_job("j", "alice", ["x"], "a", lease_for=LAPSE)
    start = clock.now
    Ledger.of(db).beat_runner("b", LAPSE)
    clock.tick(3 * LAPSE)  # nobody beats: a stall
    got = Ledger.of(db).beat_runner("b", LAPSE, foreign=True)
    assert got.taken == []
    assert lease_of(db, "j") == ("a", 1, start + LAPSE + 3 * LAPSE)
    clock.tick(LAPSE / 2)
    assert Ledger.of(db).beat_runner("a", LAPSE) == store.Beat({"j": 1}, frozenset(), [])
    assert Ledger.of(db).store_targets([done("j", 0, Lease("a", 1))]).refused == {}


def test_a_beat_that_finds_the_clock_kept_takes_nothing_by_lapse(
    db: store.Store, clock: Clock, location: str
) -> None:
    """On PostgreSQL beats commit side by side, and one at a time keeps the
    clock: a beat that finds it kept may be racing the very give-back that
    saves a lease. It takes no job whose lease lapsed, nor a waiting job of
    a runner silent for a lease; the next beat keeps the clock and gives the
    stall back, and nobody lost a job."""
    if not location.startswith("postgresql://"):
        pytest.skip("one writer at a time: every beat keeps the clock")
    Ledger.of(db).register_runner("a", LAPSE)
    Ledger.of(db).register_runner("b", LAPSE)
    Ledger.of(db).create_job("held", "alice", ["x"], "a", lease_for=LAPSE)
    Ledger.of(db).create_job("waiting", "alice", ["y"], "a")
    start = clock.now
    Ledger.of(db).beat_runner("b", LAPSE)
    clock.tick(3 * LAPSE)  # nobody beats: a stall
    with psycopg.connect(location) as other:
        # Held by an open transaction: a transaction pooler keeps its server
        # session for it alone until it ends.
        other.execute("SELECT pg_advisory_xact_lock(%s)", (LOCKS["clock"],))
        # Both jobs look orphaned to it: "a" lapsed and is silent.
        assert Ledger.of(db).beat_runner("b", LAPSE).taken == []
        other.rollback()
    assert Ledger.of(db).beat_runner("b", LAPSE).taken == []
    assert lease_of(db, "held") == ("a", 1, start + LAPSE + 3 * LAPSE)
    assert db.get_job("waiting", "alice").status == "queued"  # type: ignore[union-attr]
    got = Ledger.of(db).beat_runner("a", LAPSE)
    assert (got.held, [(row.id, token) for row, token in got.taken]) == (
        {"held": 1},
        [("waiting", 1)],
    )


def test_a_lapse_while_another_beats_lets_it_take_over(db: store.Store, clock: Clock) -> None:
    """The same silence with another runner beating all along is a lapse: a
    foreign runner takes the job with token 2, and every write of the old
    owner's with token 1 is refused from then on."""
    Ledger.of(db).register_runner("a")
    Ledger.of(db).register_runner("b")
    Ledger.of(db).create_job("j", "alice", ["x", "y"], "a", lease_for=LAPSE)
    old = Lease("a", 1)
    assert Ledger.of(db).store_targets([done("j", 0, old)], starting=[("j", old)]).refused == {}
    for _ in range(4):
        clock.tick(LAPSE / 4)
        assert Ledger.of(db).beat_runner("b", LAPSE, foreign=True).taken == []  # not lapsed yet
    clock.tick(LAPSE / 4)
    got = Ledger.of(db).beat_runner("b", LAPSE, foreign=True)
    assert [(row.id, token) for row, token in got.taken] == [("j", 2)]
    (row, _) = got.taken[0]
    assert row.status == "running"
    assert [t.status for t in row.targets] == ["done", "pending"]
    refused = Ledger.of(db).store_targets([done("j", 1, old)]).refused
    assert list(refused) == [0] and isinstance(refused[0], Conflict)
    assert not Ledger.of(db).set_job_status("j", "done", old)
    assert Ledger.of(db).interrupt_job("j", "late", old) is None
    assert Ledger.of(db).beat_runner("a", LAPSE) == store.Beat({}, frozenset(), [])
    new = Lease("b", 2)
    assert Ledger.of(db).store_targets([done("j", 1, new)]).refused == {}
    assert Ledger.of(db).set_job_status("j", "done", new)
    assert lease_of(db, "j")[:2] == (None, 2)


def test_a_cancel_through_the_store_is_released_at_the_holders_beat(
    db: store.Store, clock: Clock
) -> None:
    """``cancel_job`` ends the job at once but leaves the lease: the holder's
    write in flight is still stored (reported cancelled). Its next beat
    reports the job ended and releases it, unless it keeps it (a target in
    flight still to store); nobody takes it."""
    Ledger.of(db).register_runner("a")
    Ledger.of(db).register_runner("b")
    Ledger.of(db).create_job("j", "alice", ["x", "y", "z"], "a", lease_for=LAPSE)
    assert not db.cancel_job("j", "bob")
    assert db.cancel_job("j", "alice")
    assert not db.cancel_job("j", "alice")
    assert lease_of(db, "j")[:2] == ("a", 1)
    got = Ledger.of(db).store_targets([done("j", 0, Lease("a", 1))])
    assert (got.refused, got.cancelled) == ({}, frozenset({0}))
    assert not Ledger.of(db).set_job_status("j", "done", Lease("a", 1))
    clock.tick(1)
    assert Ledger.of(db).beat_runner("a", LAPSE, keep=["j"]) == store.Beat({}, frozenset({"j"}), [])
    assert lease_of(db, "j") == ("a", 1, clock.now + LAPSE)
    got = Ledger.of(db).store_targets([done("j", 1, Lease("a", 1))])
    assert (got.refused, got.cancelled) == ({}, frozenset({0}))
    clock.tick(1)
    assert Ledger.of(db).beat_runner("a", LAPSE) == store.Beat({}, frozenset({"j"}), [])
    assert lease_of(db, "j")[:2] == (None, 1)
    assert Ledger.of(db).beat_runner("b", LAPSE, foreign=True).taken == []
    job = db.find_job("j")
    assert job is not None and job.status == "cancelled"


def test_an_outcome_is_stored_though_a_beat_released_its_cancelled_job(
    db: store.Store, clock: Clock
) -> None:
    """A beat keeps the leases of the jobs with a target in flight when it
    began; a target may start while it is on its way, and the job be
    cancelled meanwhile. The beat then releases the lease, yet the target's
    outcome is stored: the job ended and no runner took it (the token is the
    same). A live job whose lease was released (its runner retired) takes
    no outcome under it."""
    Ledger.of(db).register_runner("a")
    Ledger.of(db).create_job("j", "alice", ["x", "y"], "a", lease_for=LAPSE)
    assert db.cancel_job("j", "alice")
    assert Ledger.of(db).beat_runner("a", LAPSE) == store.Beat({}, frozenset({"j"}), [])
    assert lease_of(db, "j")[:2] == (None, 1)
    got = Ledger.of(db).store_targets([done("j", 0, Lease("a", 1))])
    assert (got.refused, got.cancelled) == ({}, frozenset({0}))
    job = db.find_job("j")
    assert job is not None and job.status == "cancelled"
    assert [t.status for t in job.targets] == ["done", "pending"]

    Ledger.of(db).create_job("k", "alice", ["x"], "a", lease_for=LAPSE)
    Ledger.of(db).retire_runner("a")
    refused = Ledger.of(db).store_targets([done("k", 0, Lease("a", 1))]).refused
    assert list(refused) == [0] and isinstance(refused[0], Conflict)


def test_room_limits_what_is_taken_in_submit_order(db: store.Store, clock: Clock) -> None:
    """Waiting jobs are taken oldest first, at most ``room`` of those the
    runner may run; jobs of no runner (or a gone one) are taken to end
    whatever the room, unless the runner is foreign."""
    Ledger.of(db).register_runner("a")
    Ledger.of(db).register_runner("b")
    for job_id, home in [("j1", "b"), ("j2", "a"), ("j3", "b"), ("j4", None), ("j5", "b")]:
        Ledger.of(db).create_job(job_id, "alice", ["x"], home)

    def taken(got: store.Beat) -> list[tuple[str, int]]:
        return [(row.id, token) for row, token in got.taken]

    assert taken(Ledger.of(db).beat_runner("b", LAPSE, room=0)) == [("j4", 1)]  # an orphan
    assert taken(Ledger.of(db).beat_runner("b", LAPSE, room=1)) == [("j1", 1)]
    assert taken(Ledger.of(db).beat_runner("a", LAPSE, room=0, foreign=True)) == []
    assert taken(Ledger.of(db).beat_runner("a", LAPSE, room=2, foreign=True)) == [
        ("j2", 1),
        ("j3", 1),
    ]
    got = Ledger.of(db).beat_runner("b", LAPSE)
    assert got.held == {"j1": 1, "j4": 1}
    assert taken(got) == [("j5", 1)]


def test_a_shorter_lapse_takes_no_lease_that_has_not_lapsed(db: store.Store, clock: Clock) -> None:
    """SPEC 2a: another runner takes a lease only once it has lapsed. Runner
    "slow" holds a job leased for 30 s (registered with the store's default
    lapse, 5 s, and silent at first); runner "fast" (lapse 5 s) beats every
    1.25 s. Nothing stalls, nobody closes: "fast" takes nothing before the
    lease runs out, whatever the lapses and heartbeats say, and once "slow"
    beats with 30 s it is not even silent.

    (Until 1e2884c "fast" judged "slow" gone by fast's own lapse, and took
    the job at +6.25 s with token 2; through ``batch.Runner``, with
    ``takeover_after`` 3.0 and 0.6 on one store, the first runner's live job
    was ended ``interrupted`` by the second within 0.7 s. Until f7e1d5b, by
    the lapse "slow" registered with.)"""
    Ledger.of(db).register_runner("slow")
    Ledger.of(db).register_runner("fast", 5)
    Ledger.of(db).create_job("j", "alice", ["x"], "slow", lease_for=30)
    for step in range(1, 24):  # up to +28.75 s: the lease runs to +30 s
        clock.tick(1.25)
        got = Ledger.of(db).beat_runner("fast", 5, foreign=True)
        assert got.taken == [], f"taken at +{1.25 * step} s from a live runner, leased to +30 s"
        if step == 8:
            assert Ledger.of(db).beat_runner("slow", 30).held == {"j": 1}  # renewed to +40 s
    assert Ledger.of(db).store_targets([done("j", 0, Lease("slow", 1))]).refused == {}
    start = clock.now - 28.75
    taken_at = []
    for _ in range(10):  # "slow" silent since +10 s: its lease lapses after +40 s
        clock.tick(1.25)
        got = Ledger.of(db).beat_runner("fast", 5, foreign=True)
        taken_at += [(clock.now - start, row.id, token) for row, token in got.taken]
    assert taken_at == [(41.25, "j", 2)]
