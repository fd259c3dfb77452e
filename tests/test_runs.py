"""Runs, steps, nodes and leases in the SQLite store: placement, the FIFO queue
of QUEUED runs and its promotion, claiming and reporting steps, reaping,
cancelling, and the sealed Record."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import store
import store.queue as store_queue
import store.record as record_module
from store import node_leases
from tests.helpers import Clock, raw, trace

FAR_FUTURE = 1e12


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[store.Store, store.Store]]:
    """Two handles on one file: one that places runs and one (``lease_ttl=0``)
    that never does, so a queue can be built whose wake is left to the test."""
    path = tmp_path / "x.sqlite3"
    with store.open(path) as placing, store.open(path, lease_ttl=0) as holding:
        yield placing, holding


def advertise(db: store.Store, node_id: str, *caps: str, name: str | None = None) -> None:
    db.advertise(store.Advert(node_id, name or f"box-{node_id}", frozenset(caps)))


def step(name: str, *needs: str, kind: str = "exec") -> store.Step:
    return store.Step(name, kind, frozenset(needs))


def step_states(db: store.Store, run_id: str) -> list[str]:
    return [s.state for s in db.get_run(run_id).steps]


def step_nodes(db: store.Store, run_id: str) -> list[str]:
    return [s.node for s in db.get_run(run_id).steps]


def leases(db: store.Store) -> dict[str, tuple[str, float]]:
    """The lease rows, read through a connection of their own."""
    return {
        node_id: (run_id, not_after)
        for node_id, run_id, not_after in raw(
            db.path, "SELECT node_id, run_id, not_after FROM leases"
        )
    }


def finish(db: store.Store, node_id: str, run_id: str) -> None:
    """Claim and report, successfully, every step ``node_id`` holds in ``run_id``."""
    for _ in range(100):
        if db.get_run(run_id).state != "RUNNING":
            return
        claim = db.claim_step(node_id)
        if claim is None:
            return
        assert claim.run_id == run_id
        db.report_step(node_id, run_id, claim.seq, ok=True, output={"seq": claim.seq})
    pytest.fail(f"node {node_id} never ran out of steps in {run_id}")


def snapshot(db: store.Store, *run_ids: str) -> Any:
    """Everything a refused request must leave as it was."""
    return (
        [db.get_run(r) for r in run_ids],
        [db.record(r) for r in run_ids],
        db.list_runs(),
        db.unavailable_nodes(),
        leases(db),
    )


def busy_and_waiting(db: store.Store) -> None:
    """Node n1 runs ``busy``; ``waiting`` wants a linux node and is QUEUED."""
    advertise(db, "n1", "linux")
    assert db.submit_run([step("s", "linux")], run_id="busy").state == "RUNNING"
    assert db.submit_run([step("w", "linux")], run_id="waiting").state == "QUEUED"


# -- the queue: FIFO ------------------------------------------------------------


def test_queued_runs_are_promoted_in_submit_order_even_with_a_frozen_clock(
    tmp_path: Path, clock: Clock
) -> None:
    """Waiting runs get capacity in the order they were submitted, whatever
    their ids and even when the clock does not move."""
    with store.open(tmp_path / "x.sqlite3") as db:
        advertise(db, "n1", "linux")
        assert db.submit_run([step("s", "linux")], run_id="r0").state == "RUNNING"
        queued = ["r9", "r8", "r7", "r6"]
        for run_id in queued:
            assert db.submit_run([step("s", "linux")], run_id=run_id).state == "QUEUED"

        assert [r.run_id for r in db.list_runs(state="QUEUED")] == queued
        everything = db.list_runs()
        assert [r.run_id for r in everything] == ["r0", *queued]
        created = [r.created_at for r in everything]
        assert all(a < b for a, b in itertools.pairwise(created)), created

        promoted = []
        current = "r0"
        for _ in queued:
            finish(db, "n1", current)
            assert db.get_run(current).state == "SUCCEEDED"
            running = db.list_runs(state="RUNNING")
            assert len(running) == 1
            current = running[0].run_id
            promoted.append(current)
        assert promoted == queued
        finish(db, "n1", current)
        assert db.list_runs(state="QUEUED") == []
        assert [r.state for r in db.list_runs()] == ["SUCCEEDED"] * 5


def test_fifo_holds_when_the_clock_steps_back(tmp_path: Path, clock: Clock) -> None:
    """A clock set back between submits does not reorder the queue."""
    with store.open(tmp_path / "x.sqlite3") as db:
        advertise(db, "n1", "linux")
        db.submit_run([step("s", "linux")], run_id="m")
        for run_id in ("c", "b", "a"):
            clock.tick(-100)
            assert db.submit_run([step("s", "linux")], run_id=run_id).state == "QUEUED"
        views = db.list_runs()
        assert [r.run_id for r in views] == ["m", "c", "b", "a"]
        assert all(x.created_at < y.created_at for x, y in itertools.pairwise(views))
        finish(db, "n1", "m")
        assert [r.run_id for r in db.list_runs(state="RUNNING")] == ["c"]


def test_a_promotion_blocks_its_nodes_within_the_same_scan(
    pair: tuple[store.Store, store.Store],
) -> None:
    """One wake never gives a node to two runs; the runs it does promote are
    returned, in FIFO order, and later runs that fit elsewhere still go."""
    placing, holding = pair
    advertise(holding, "n1", "gpu")
    advertise(holding, "n2", "cpu")
    for run_id, need in (("r3", "gpu"), ("r2", "gpu"), ("r1", "cpu")):
        assert holding.submit_run([step("s", need)], run_id=run_id).state == "QUEUED"
    assert placing.unavailable_nodes() == set()

    assert placing.wake_queued(why="test") == ["r3", "r1"]

    assert placing.get_run("r3").state == "RUNNING"
    assert step_nodes(placing, "r3") == ["n1"]
    assert placing.get_run("r1").state == "RUNNING"
    assert step_nodes(placing, "r1") == ["n2"]
    assert placing.get_run("r2").state == "QUEUED"
    assert step_nodes(placing, "r2") == [""]
    assert {n: r for n, (r, _) in leases(placing).items()} == {"n1": "r3", "n2": "r1"}
    assert placing.wake_queued() == []


def test_wake_promotes_the_oldest_runs_first_when_several_nodes_free(
    pair: tuple[store.Store, store.Store],
) -> None:
    """When capacity for only some waiting runs appears, the oldest get it."""
    placing, holding = pair
    advertise(holding, "n1", "linux")
    advertise(holding, "n2", "linux")
    queued = ["z", "y", "x", "w"]
    for run_id in queued:
        assert holding.submit_run([step("s", "linux")], run_id=run_id).state == "QUEUED"
    assert placing.wake_queued() == ["z", "y"]
    assert [r.run_id for r in placing.list_runs(state="QUEUED")] == ["x", "w"]


# -- draining ---------------------------------------------------------------------


def test_submit_never_places_on_a_draining_node(db: store.Store) -> None:
    """A drained node gets no new run at submit: the run goes elsewhere or waits."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "linux")
    db.drain("n1")
    assert db.unavailable_nodes() == {"n1"}
    first = db.submit_run([step("s", "linux")], run_id="first")
    assert first.state == "RUNNING"
    assert step_nodes(db, "first") == ["n2"]
    second = db.submit_run([step("s", "linux")], run_id="second")
    assert second.state == "QUEUED"
    assert db.unavailable_nodes() == {"n1", "n2"}
    assert set(leases(db)) == {"n2"}


def test_wake_never_promotes_onto_a_draining_node_and_undrain_wakes(db: store.Store) -> None:
    """A waiting run is not given a draining node; undraining it is enough to
    start the run, with no explicit wake."""
    advertise(db, "n1", "linux")
    db.drain("n1")
    assert db.submit_run([step("s", "linux")], run_id="r").state == "QUEUED"
    assert db.wake_queued() == []
    assert db.get_run("r").state == "QUEUED"

    db.undrain("n1")

    assert db.get_run("r").state == "RUNNING"
    assert step_nodes(db, "r") == ["n1"]
    assert db.unavailable_nodes() == {"n1"}


def test_a_draining_node_finishes_the_run_it_holds_and_takes_no_new_one(
    db: store.Store,
) -> None:
    """Draining a busy node lets its run complete; the waiting run stays queued."""
    busy_and_waiting(db)
    db.drain("n1")
    claim = db.claim_step("n1")
    assert claim is not None
    assert claim.run_id == "busy"
    assert db.heartbeat("n1") is not None
    view = db.report_step("n1", "busy", claim.seq, ok=True, output="done")
    assert view.state == "SUCCEEDED"
    assert db.get_run("waiting").state == "QUEUED"
    assert db.claim_step("n1") is None
    assert db.unavailable_nodes() == {"n1"}
    assert leases(db) == {}


# -- lease_ttl = 0 --------------------------------------------------------------


def test_a_zero_lease_ttl_places_nothing(tmp_path: Path) -> None:
    """With ``lease_ttl=0`` every run waits, however free the nodes are."""
    with store.open(tmp_path / "x.sqlite3", lease_ttl=0) as db:
        advertise(db, "n1", "linux")
        advertise(db, "n2", "linux")
        for run_id in ("a", "b"):
            view = db.submit_run([step("s", "linux")], run_id=run_id)
            assert view.state == "QUEUED"
            assert view.started_at is None
        assert db.wake_queued() == []
        assert [r.state for r in db.list_runs()] == ["QUEUED", "QUEUED"]
        assert db.unavailable_nodes() == set()
        assert leases(db) == {}
        assert db.claim_step("n1") is None


# -- every capacity event wakes the queue ----------------------------------------


def test_advertising_a_node_wakes_the_queue(db: store.Store) -> None:
    """A new node starts a waiting run it can serve."""
    busy_and_waiting(db)
    advertise(db, "n2", "linux")
    assert db.get_run("waiting").state == "RUNNING"
    assert step_nodes(db, "waiting") == ["n2"]


def test_undrain_wakes_the_queue(db: store.Store) -> None:
    """Undraining an idle node starts a waiting run on it."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "linux")
    db.drain("n2")
    assert db.submit_run([step("s", "linux")], run_id="busy").state == "RUNNING"
    assert db.submit_run([step("s", "linux")], run_id="waiting").state == "QUEUED"
    db.undrain("n2")
    assert db.get_run("waiting").state == "RUNNING"
    assert step_nodes(db, "waiting") == ["n2"]


def test_a_report_that_releases_a_lease_wakes_the_queue(db: store.Store) -> None:
    """A node done with its share of a still-running run serves a waiting run."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    two = db.submit_run([step("first", "a"), step("second", "b")], run_id="two")
    assert two.state == "RUNNING"
    assert db.submit_run([step("w", "a")], run_id="waiting").state == "QUEUED"
    claim = db.claim_step("n1")
    assert claim is not None
    assert db.report_step("n1", "two", claim.seq, ok=True).state == "RUNNING"
    assert db.get_run("waiting").state == "RUNNING"
    assert step_nodes(db, "waiting") == ["n1"]


def test_a_run_completing_wakes_the_queue(db: store.Store) -> None:
    """When a run succeeds, its node goes to the next waiting run."""
    busy_and_waiting(db)
    finish(db, "n1", "busy")
    assert db.get_run("busy").state == "SUCCEEDED"
    assert db.get_run("waiting").state == "RUNNING"


def test_a_failed_step_wakes_the_queue(db: store.Store) -> None:
    """When a run fails, its node goes to the next waiting run."""
    busy_and_waiting(db)
    claim = db.claim_step("n1")
    assert claim is not None
    db.report_step("n1", "busy", claim.seq, ok=False)
    assert db.get_run("waiting").state == "RUNNING"


def test_cancel_wakes_the_queue(db: store.Store) -> None:
    """Cancelling a running run gives its node to the next waiting run."""
    busy_and_waiting(db)
    assert db.cancel_run("busy")
    assert db.get_run("waiting").state == "RUNNING"


def test_reap_wakes_the_queue(db: store.Store) -> None:
    """Reaping a run with an expired lease gives its node to the next waiting run."""
    busy_and_waiting(db)
    assert db.reap(now=FAR_FUTURE) == ["busy"]
    assert db.get_run("waiting").state == "RUNNING"
    assert set(leases(db)) == {"n1"}
    assert leases(db)["n1"][0] == "waiting"


def test_opening_the_store_wakes_the_queue(tmp_path: Path) -> None:
    """A queue left by an earlier process starts as soon as the file is opened
    by one that may place runs."""
    path = tmp_path / "x.sqlite3"
    with store.open(path, lease_ttl=0) as db:
        advertise(db, "n1", "linux")
        assert db.submit_run([step("s", "linux")], run_id="waiting").state == "QUEUED"
    with store.open(path, lease_ttl=30) as db:
        assert db.get_run("waiting").state == "RUNNING"
        assert step_nodes(db, "waiting") == ["n1"]


def _two_node_run(db: store.Store) -> None:
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    db.submit_run([step("x", "a"), step("y", "b")], run_id="busy")
    claim = db.claim_step("n1")
    assert claim is not None


CAPACITY_EVENTS: list[Any] = [
    pytest.param(
        lambda db: advertise(db, "n9", "a"),
        "SELECT COUNT(*) FROM nodes WHERE id = 'n9'",
        (1,),
        id="advertise",
    ),
    pytest.param(
        lambda db: (db.drain("n2"), db.undrain("n2")),
        "SELECT draining FROM nodes WHERE id = 'n2'",
        (0,),
        id="undrain",
    ),
    pytest.param(
        lambda db: db.report_step("n1", "busy", 1, ok=True),
        "SELECT COUNT(*) FROM leases WHERE node_id = 'n1'",
        (0,),
        id="report-releasing-a-lease",
    ),
    pytest.param(
        lambda db: db.report_step("n1", "busy", 1, ok=False),
        "SELECT state FROM runs WHERE id = 'busy'",
        ("FAILED",),
        id="run-completion",
    ),
    pytest.param(
        lambda db: db.cancel_run("busy"),
        "SELECT state FROM runs WHERE id = 'busy'",
        ("FAILED",),
        id="cancel",
    ),
    pytest.param(
        lambda db: db.reap(now=FAR_FUTURE),
        "SELECT state FROM runs WHERE id = 'busy'",
        ("FAILED",),
        id="reap",
    ),
]


@pytest.mark.parametrize(("event", "query", "committed"), CAPACITY_EVENTS)
def test_each_capacity_event_wakes_the_queue_after_its_commit(
    db: store.Store,
    monkeypatch: pytest.MonkeyPatch,
    event: Any,
    query: str,
    committed: tuple[object, ...],
) -> None:
    """The wake that follows an event sees the event already committed, as any
    other reader of the file would."""
    _two_node_run(db)
    seen: list[tuple[object, ...]] = []
    real_wake = store_queue.wake

    def spy(conn: Any, *args: Any, **kwargs: Any) -> list[str]:
        seen.append(raw(db.path, query)[0])
        return real_wake(conn, *args, **kwargs)

    monkeypatch.setattr(store_queue, "wake", spy)
    event(db)
    assert seen, "the event did not wake the queue"
    assert seen[-1] == committed


def test_a_failing_wake_does_not_undo_or_fail_the_event(
    db: store.Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The event that freed capacity stands even if the wake after it fails."""
    _two_node_run(db)

    def broken(conn: sqlite3.Connection, *args: Any, **kwargs: Any) -> list[str]:
        raise store.StoreError("wake broke")

    monkeypatch.setattr(store_queue, "wake", broken)
    with caplog.at_level("ERROR", logger="store"):
        assert db.cancel_run("busy") is True
    assert db.get_run("busy").state == "FAILED"
    assert leases(db) == {}
    assert any("wake" in r.getMessage() for r in caplog.records)


# -- reap -------------------------------------------------------------------------


def test_reap_fails_runs_with_expired_leases_and_never_touches_queued_runs(
    db: store.Store,
) -> None:
    """An abandoned run ends FAILED with a lease reason, its nodes freed and its
    Record sealed; a waiting run is left exactly as it was."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "gpu")
    db.drain("n2")
    assert db.submit_run([step("s1", "linux"), step("s2", "linux")], run_id="r").state == "RUNNING"
    claim = db.claim_step("n1")
    assert claim is not None
    assert db.submit_run([step("g", "gpu")], run_id="q").state == "QUEUED"
    queued_view, queued_record = db.get_run("q"), db.record("q")

    assert db.reap() == []
    assert db.get_run("r").state == "RUNNING"

    assert db.reap(now=FAR_FUTURE) == ["r"]

    run = db.get_run("r")
    assert run.state == "FAILED"
    assert run.reason is not None
    assert "lease" in run.reason
    assert run.ended_at is not None
    assert step_states(db, "r") == ["FAILED", "FAILED"]
    assert leases(db) == {}
    assert db.unavailable_nodes() == {"n2"}
    rec = db.record("r")
    assert rec["state"] == "FAILED"
    assert rec["sealed_at"] is not None
    assert rec["digest"]
    assert [s["state"] for s in rec["steps"]] == ["FAILED", "FAILED"]

    assert db.get_run("q") == queued_view
    assert db.record("q") == queued_record
    assert db.reap(now=FAR_FUTURE) == []
    assert db.get_run("q") == queued_view


# -- cancel -----------------------------------------------------------------------


def test_cancelling_a_queued_run_fails_its_steps_and_seals_its_record(db: store.Store) -> None:
    """A waiting run can be cancelled: it ends FAILED ``cancelled`` with a sealed Record."""
    busy_and_waiting(db)
    assert db.cancel_run("waiting") is True
    run = db.get_run("waiting")
    assert run.state == "FAILED"
    assert run.reason == "cancelled"
    assert run.ended_at is not None
    assert step_states(db, "waiting") == ["FAILED"]
    rec = db.record("waiting")
    assert rec["state"] == "FAILED"
    assert rec["reason"] == "cancelled"
    assert rec["sealed_at"] is not None
    assert rec["digest"].startswith("sha256:")
    assert [(s["node_id"], s["state"]) for s in rec["steps"]] == [("", "FAILED")]
    assert db.get_run("busy").state == "RUNNING"
    assert set(leases(db)) == {"n1"}


def test_cancelling_a_running_run_releases_its_leases(db: store.Store) -> None:
    """A cancelled running run frees every node it held; its nodes can no longer report."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    assert db.submit_run([step("x", "a"), step("y", "b")], run_id="r").state == "RUNNING"
    assert db.unavailable_nodes() == {"n1", "n2"}
    claim = db.claim_step("n1")
    assert claim is not None
    assert db.cancel_run("r") is True
    assert db.unavailable_nodes() == set()
    assert leases(db) == {}
    run = db.get_run("r")
    assert (run.state, run.reason) == ("FAILED", "cancelled")
    assert step_states(db, "r") == ["FAILED", "FAILED"]
    assert db.record("r")["sealed_at"] is not None
    with pytest.raises(store.Conflict):
        db.report_step("n1", "r", claim.seq, ok=True)
    assert db.claim_step("n2") is None


def test_cancel_returns_false_for_unknown_or_terminal_runs(db: store.Store) -> None:
    """Cancel says False, changing nothing, when there is nothing to cancel."""
    advertise(db, "n1", "linux")
    assert db.cancel_run("nope") is False
    db.submit_run([step("s", "linux")], run_id="done")
    finish(db, "n1", "done")
    db.submit_run([step("s", "linux")], run_id="cancelled")
    assert db.cancel_run("cancelled") is True
    before = snapshot(db, "done", "cancelled")
    assert db.cancel_run("done") is False
    assert db.cancel_run("cancelled") is False
    assert snapshot(db, "done", "cancelled") == before
    assert db.get_run("done").state == "SUCCEEDED"


# -- claim ------------------------------------------------------------------------


def test_steps_are_claimed_in_seq_order_and_only_by_their_node(db: store.Store) -> None:
    """A step is handed out only after every earlier step succeeded, and only
    to the node it was placed on."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    run = db.submit_run([step("one", "a"), step("two", "b"), step("three", "a")], run_id="r")
    assert run.state == "RUNNING"
    assert step_nodes(db, "r") == ["n1", "n2", "n1"]
    advertise(db, "n3", "a", "b")

    assert db.claim_step("n2") is None
    assert db.claim_step("n3") is None
    first = db.claim_step("n1")
    assert first is not None
    assert (first.run_id, first.seq, first.name, first.kind) == ("r", 1, "one", "exec")
    assert first.needs == frozenset({"a"})
    assert step_states(db, "r") == ["RUNNING", "PENDING", "PENDING"]
    assert db.claim_step("n1") is None
    assert db.claim_step("n2") is None

    db.report_step("n1", "r", 1, ok=True)
    assert db.claim_step("n1") is None
    assert db.claim_step("n3") is None
    second = db.claim_step("n2")
    assert second is not None
    assert (second.seq, second.name) == (2, "two")
    db.report_step("n2", "r", 2, ok=True)

    third = db.claim_step("n1")
    assert third is not None
    assert (third.seq, third.name) == (3, "three")
    assert db.report_step("n1", "r", 3, ok=True).state == "SUCCEEDED"
    assert db.claim_step("n3") is None


def test_claiming_renews_the_nodes_lease(tmp_path: Path, clock: Clock) -> None:
    """Taking a step pushes the node's lease end out to now + lease_ttl."""
    with store.open(tmp_path / "x.sqlite3", lease_ttl=30) as db:
        advertise(db, "n1", "linux")
        db.submit_run([step("s1", "linux"), step("s2", "linux")], run_id="r")
        issued = leases(db)["n1"][1]
        assert issued == clock.now + 30

        clock.tick(10)
        claim = db.claim_step("n1")
        assert claim is not None
        assert claim.not_after == clock.now + 30
        assert claim.not_after > issued
        assert leases(db)["n1"] == ("r", claim.not_after)

        clock.tick(5)
        db.report_step("n1", "r", claim.seq, ok=True)
        clock.tick(5)
        again = db.claim_step("n1")
        assert again is not None
        assert again.not_after == clock.now + 30 > claim.not_after
        assert leases(db)["n1"] == ("r", again.not_after)


def test_a_queued_runs_steps_match_no_node(tmp_path: Path) -> None:
    """No node can pick up a step of a run that is still waiting."""
    with store.open(tmp_path / "x.sqlite3", lease_ttl=0) as db:
        advertise(db, "n1", "linux")
        db.submit_run([step("s", "linux")], run_id="q")
        assert db.claim_step("n1") is None
        assert step_states(db, "q") == ["PENDING"]
    with store.open(tmp_path / "y.sqlite3") as db:
        busy_and_waiting(db)
        claim = db.claim_step("n1")
        assert claim is not None
        assert claim.run_id == "busy"
        assert db.claim_step("n1") is None
        assert step_states(db, "waiting") == ["PENDING"]


def test_claim_by_an_unknown_node_is_not_found(db: store.Store) -> None:
    """A node must advertise before it can claim."""
    with pytest.raises(store.NotFound):
        db.claim_step("ghost")


# -- report -----------------------------------------------------------------------


def test_a_report_from_a_node_not_holding_the_step_is_a_conflict_and_changes_nothing(
    db: store.Store,
) -> None:
    """Only the node running a step can say how it ended; anyone else is refused
    and the run, its Record and the leases stay as they were."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "a")
    db.submit_run([step("x", "a"), step("y", "a")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    before = snapshot(db, "r")

    with pytest.raises(store.Conflict):
        db.report_step("n2", "r", 1, ok=True)
    with pytest.raises(store.Conflict):
        db.report_step("n2", "r", 1, ok=False)
    with pytest.raises(store.Conflict):
        db.report_step("n1", "r", 2, ok=True)  # PENDING, not RUNNING
    with pytest.raises(store.Conflict):
        db.report_step("n1", "r", 99, ok=True)
    with pytest.raises(store.NotFound):
        db.report_step("n1", "nope", 1, ok=True)

    assert snapshot(db, "r") == before


def test_reporting_a_step_twice_is_a_conflict(db: store.Store) -> None:
    """A step's outcome is stored once; a second report is refused."""
    advertise(db, "n1", "a")
    db.submit_run([step("x", "a"), step("y", "a")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    db.report_step("n1", "r", 1, ok=True, output=[1, 2])
    before = snapshot(db, "r")
    with pytest.raises(store.Conflict):
        db.report_step("n1", "r", 1, ok=True)
    with pytest.raises(store.Conflict):
        db.report_step("n1", "r", 1, ok=False)
    assert snapshot(db, "r") == before
    assert step_states(db, "r") == ["SUCCEEDED", "PENDING"]


def test_a_failed_step_fails_the_run_and_releases_all_its_leases(db: store.Store) -> None:
    """One failed step ends the run FAILED, naming the step; its other steps
    fail and every node it held is freed."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    db.submit_run([step("compile", "a"), step("test", "b"), step("ship", "a")], run_id="r")
    assert db.unavailable_nodes() == {"n1", "n2"}
    claim = db.claim_step("n1")
    assert claim is not None
    view = db.report_step("n1", "r", claim.seq, ok=False, output={"exit": 2})
    assert view.state == "FAILED"
    assert view.reason is not None
    assert "compile" in view.reason
    assert [s.state for s in view.steps] == ["FAILED", "FAILED", "FAILED"]
    assert db.unavailable_nodes() == set()
    assert leases(db) == {}
    rec = db.record("r")
    assert rec["sealed_at"] is not None
    assert rec["reason"] == view.reason
    assert db.claim_step("n2") is None


def test_a_nodes_lease_is_released_once_it_has_no_step_left_in_the_run(
    db: store.Store,
) -> None:
    """A node done with its part of a run is free for others while the run goes on."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    db.submit_run([step("x", "a"), step("y", "b")], run_id="r")
    assert db.unavailable_nodes() == {"n1", "n2"}
    finish(db, "n1", "r")
    assert db.get_run("r").state == "RUNNING"
    assert db.unavailable_nodes() == {"n2"}
    assert set(leases(db)) == {"n2"}
    finish(db, "n2", "r")
    assert db.get_run("r").state == "SUCCEEDED"
    assert db.unavailable_nodes() == set()


def test_a_node_keeps_its_lease_while_it_has_a_later_step(db: store.Store) -> None:
    """A node with another step still to run in the run stays leased to it."""
    advertise(db, "n1", "a")
    advertise(db, "n2", "b")
    db.submit_run([step("x", "a"), step("y", "b"), step("z", "a")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    db.report_step("n1", "r", claim.seq, ok=True)
    assert db.unavailable_nodes() == {"n1", "n2"}


@pytest.mark.parametrize(
    "output",
    [object(), float("nan"), {"a": {1, 2}}, {1j: "x"}],
    ids=["object", "nan", "set", "complex-key"],
)
def test_a_report_with_output_that_is_not_json_is_invalid(db: store.Store, output: object) -> None:
    """Output must be JSON; anything else is refused and the step stays RUNNING."""
    advertise(db, "n1", "a")
    db.submit_run([step("x", "a")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    before = snapshot(db, "r")
    with pytest.raises(store.InvalidRun):
        db.report_step("n1", "r", claim.seq, ok=True, output=output)
    assert snapshot(db, "r") == before
    assert db.report_step("n1", "r", claim.seq, ok=True, output={"ok": 1}).state == "SUCCEEDED"


def test_a_steps_output_is_kept_and_shown_with_the_run(db: store.Store) -> None:
    """What a node reports comes back decoded in the run's view and its wire
    form; a step with nothing reported shows no output key."""
    advertise(db, "n1", "a")
    db.submit_run([step("x", "a"), step("y", "a")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    db.report_step("n1", "r", claim.seq, ok=True, output={"lines": ["ok"], "code": 0})
    view = db.get_run("r")
    assert [s.output for s in view.steps] == [{"lines": ["ok"], "code": 0}, None]
    wire = view.to_dict()["steps"]
    assert wire[0]["output"] == {"lines": ["ok"], "code": 0}
    assert "output" not in wire[1]


# -- heartbeat --------------------------------------------------------------------


def test_heartbeat_extends_the_lease(tmp_path: Path, clock: Clock) -> None:
    """A node's heartbeat pushes its lease end out and says when it now ends."""
    with store.open(tmp_path / "x.sqlite3", lease_ttl=30) as db:
        advertise(db, "n1", "linux")
        advertise(db, "n2", "linux")
        db.submit_run([step("s", "linux")], run_id="r")
        held = [n for n, (r, _) in leases(db).items() if r == "r"]
        assert len(held) == 1
        node = held[0]
        idle = ({"n1", "n2"} - {node}).pop()
        old = leases(db)[node][1]

        clock.tick(7)
        new = db.heartbeat(node)
        assert new == clock.now + 30
        assert new is not None
        assert new > old
        assert leases(db)[node] == ("r", new)

        assert db.heartbeat(idle) is None
        assert idle not in leases(db)
        with pytest.raises(store.NotFound):
            db.heartbeat("ghost")


# -- the Record -----------------------------------------------------------------


def test_submit_and_promotion_write_the_same_record_shape_and_names(db: store.Store) -> None:
    """A run started at submit and one started by promotion read the same in
    their Records, naming nodes by id and advertised name."""
    advertise(db, "n1", "linux", name="build-box-1")
    steps = [step("fetch", "linux"), step("build", "linux")]
    assert db.submit_run(steps, run_id="direct").state == "RUNNING"
    assert db.submit_run(steps, run_id="promoted").state == "QUEUED"
    queued_record = db.record("promoted")
    assert [(s["node_id"], s["node_name"]) for s in queued_record["steps"]] == [("", "")] * 2
    direct_record = db.record("direct")
    direct_view = db.get_run("direct")

    finish(db, "n1", "direct")
    assert db.get_run("promoted").state == "RUNNING"
    promoted_record = db.record("promoted")
    promoted_view = db.get_run("promoted")

    assert promoted_record.keys() == direct_record.keys()
    assert direct_record.keys() == {"run_id", "state", "reason", "opened_at", "sealed_at", "steps"}
    for a, b in zip(direct_record["steps"], promoted_record["steps"], strict=True):
        assert a.keys() == b.keys() == {"seq", "name", "node_id", "node_name", "state"}
    assert promoted_record["steps"] == direct_record["steps"]
    assert [s["node_name"] for s in promoted_record["steps"]] == ["build-box-1"] * 2
    assert [s["node_id"] for s in promoted_record["steps"]] == ["n1"] * 2
    assert promoted_record["state"] == direct_record["state"] == "RUNNING"
    assert promoted_record["sealed_at"] is None
    assert promoted_view.assigned == direct_view.assigned
    assert [a.node_name for a in promoted_view.assigned] == ["build-box-1"] * 2

    finish(db, "n1", "promoted")
    sealed_direct, sealed_promoted = db.record("direct"), db.record("promoted")
    assert sealed_direct.keys() == sealed_promoted.keys()
    assert sealed_direct["steps"] == sealed_promoted["steps"]


def test_a_sealed_record_keeps_the_old_node_name_after_a_rename(db: store.Store) -> None:
    """Renaming a node later does not rewrite history."""
    advertise(db, "n1", "linux", name="old-name")
    db.submit_run([step("s", "linux")], run_id="r")
    finish(db, "n1", "r")
    sealed = db.record("r")
    assert sealed["sealed_at"] is not None
    advertise(db, "n1", "linux", name="new-name")
    assert db.record("r") == sealed
    assert [s["node_name"] for s in db.record("r")["steps"]] == ["old-name"]
    db.submit_run([step("s", "linux")], run_id="later")
    assert [s["node_name"] for s in db.record("later")["steps"]] == ["new-name"]


def test_a_sealed_record_cannot_be_changed_even_directly_in_the_file(db: store.Store) -> None:
    """Nobody, not even SQL on the file, can alter or remove a sealed Record;
    its digest can be recomputed by anyone from its content."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="r")
    finish(db, "n1", "r")
    sealed = db.record("r")
    content = {k: v for k, v in sealed.items() if k != "digest"}
    assert record_module.digest(content) == sealed["digest"]

    for forgery in (
        "UPDATE records SET reason = 'forged' WHERE run_id = 'r'",
        "UPDATE records SET sealed_at = NULL, digest = NULL WHERE run_id = 'r'",
        "DELETE FROM records WHERE run_id = 'r'",
    ):
        with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="sealed"):
            raw(db.path, forgery)
    assert raw(db.path, "SELECT COUNT(*) FROM records") == [(1,)]

    assert db.record("r") == sealed


def test_an_unsealed_record_has_no_digest(db: store.Store) -> None:
    """The digest appears only once the run has ended."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="r")
    rec = db.record("r")
    assert rec["sealed_at"] is None
    assert "digest" not in rec
    assert rec["run_id"] == "r"
    assert rec["state"] == "RUNNING"


def test_an_open_record_follows_its_run_and_the_seal_fixes_it(db: store.Store) -> None:
    """Until it is sealed a Record shows the run's and its steps' states now;
    once sealed it no longer changes."""
    advertise(db, "n1", "linux")
    db.submit_run([step("a", "linux"), step("b", "linux")], run_id="r")
    claim = db.claim_step("n1")
    assert claim is not None
    rec = db.record("r")
    assert rec["state"] == "RUNNING"
    assert [s["state"] for s in rec["steps"]] == ["RUNNING", "PENDING"]
    db.report_step("n1", "r", claim.seq, ok=True)
    assert [s["state"] for s in db.record("r")["steps"]] == ["SUCCEEDED", "PENDING"]
    finish(db, "n1", "r")
    sealed = db.record("r")
    assert sealed["state"] == "SUCCEEDED"
    assert [s["state"] for s in sealed["steps"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert "digest" in sealed


# -- the lease primary key --------------------------------------------------------


def test_the_lease_key_refuses_a_second_lease_on_a_node(db: store.Store) -> None:
    """Even if placement were wrong, a leased node cannot be leased again, and
    the refused transaction leaves nothing behind."""
    advertise(db, "n0", "other")
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="holder")
    db.submit_run([step("s", "linux")], run_id="other")
    assert db.get_run("other").state == "QUEUED"
    before = snapshot(db, "holder", "other")

    with pytest.raises(store.Conflict):
        db._db.write(lambda tx: node_leases.issue(tx, "other", {"n0", "n1"}, FAR_FUTURE))

    assert snapshot(db, "holder", "other") == before
    assert set(leases(db)) == {"n1"}


# -- unsatisfiable runs -----------------------------------------------------------


def test_a_run_needing_caps_no_node_has_is_unsatisfiable(db: store.Store) -> None:
    """A run no advertised node could ever serve is refused, not queued forever."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="kept")
    before = db.list_runs()
    with pytest.raises(store.Unsatisfiable, match="gpu"):
        db.submit_run([step("ok", "linux"), step("train", "gpu")], run_id="nope")
    assert db.list_runs() == before
    with pytest.raises(store.NotFound):
        db.get_run("nope")
    with pytest.raises(store.NotFound):
        db.record("nope")


def test_a_run_needing_more_nodes_than_allowed_is_unsatisfiable(tmp_path: Path) -> None:
    """A run that would need more than ``max_leases_per_run`` nodes is refused."""
    with store.open(tmp_path / "x.sqlite3", max_leases_per_run=2) as db:
        advertise(db, "n1", "a")
        advertise(db, "n2", "b")
        advertise(db, "n3", "c")
        assert db.submit_run([step("x", "a"), step("y", "b")], run_id="two").state == "RUNNING"
        before = db.list_runs()
        with pytest.raises(store.Unsatisfiable, match="max_leases_per_run"):
            db.submit_run([step("x", "a"), step("y", "b"), step("z", "c")], run_id="three")
        assert db.list_runs() == before
        assert set(leases(db)) == {"n1", "n2"}


def test_with_no_node_advertised_every_run_is_unsatisfiable(db: store.Store) -> None:
    """Without nodes nothing can ever run, not even a step that needs nothing."""
    with pytest.raises(store.Unsatisfiable):
        db.submit_run([step("s")])
    with pytest.raises(store.Unsatisfiable):
        db.submit_run([step("s", "linux")])
    assert db.list_runs() == []


def test_unsatisfiable_ignores_whether_nodes_are_busy_or_draining(db: store.Store) -> None:
    """A run that fits once its nodes are free waits instead of being refused."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="busy")
    db.drain("n1")
    assert db.submit_run([step("s", "linux")], run_id="waits").state == "QUEUED"


# -- bad input --------------------------------------------------------------------


BAD_STEPS: list[Any] = [
    pytest.param([], id="empty"),
    pytest.param([step("a"), step("a")], id="duplicate-name"),
    pytest.param([step("a", kind="Build")], id="kind-uppercase"),
    pytest.param([step("a", kind="1x")], id="kind-digit-first"),
    pytest.param([step("a", kind="")], id="kind-empty"),
    pytest.param([step("a", kind="a-b")], id="kind-dash"),
    pytest.param([store.Step("a", "exec", {1})], id="needs-int"),  # type: ignore[arg-type]
    pytest.param([store.Step("a", "exec", "linux")], id="needs-plain-string"),  # type: ignore[arg-type]
    pytest.param([step("a"), "b"], id="not-a-step"),
    pytest.param([store.Step("", "exec")], id="empty-name"),
    pytest.param("build", id="steps-a-string"),
]


@pytest.mark.parametrize("steps", BAD_STEPS)
def test_a_malformed_run_is_invalid_and_stores_nothing(db: store.Store, steps: Any) -> None:
    """A malformed run is refused with InvalidRun (a ValueError) and leaves no trace."""
    advertise(db, "n1", "linux")
    with pytest.raises(store.InvalidRun) as caught:
        db.submit_run(steps, run_id="bad")
    assert isinstance(caught.value, ValueError)
    assert str(caught.value)
    assert db.list_runs() == []
    assert db.unavailable_nodes() == set()
    with pytest.raises(store.NotFound):
        db.record("bad")


@pytest.mark.parametrize("steps", BAD_STEPS)
def test_validation_comes_before_placement(db: store.Store, steps: Any) -> None:
    """A run that is both malformed and unplaceable is reported as malformed."""
    with pytest.raises(store.InvalidRun):
        db.submit_run(steps)
    assert db.list_runs() == []


def test_an_unplaceable_malformed_run_with_impossible_needs_is_invalid(db: store.Store) -> None:
    """Bad kind plus needs nobody has: the kind is what gets reported."""
    advertise(db, "n1", "linux")
    with pytest.raises(store.InvalidRun, match="kind"):
        db.submit_run([step("a", "quantum", kind="Bad-Kind")])
    assert db.list_runs() == []


def test_a_run_id_in_use_is_a_conflict(db: store.Store) -> None:
    """Submitting under an existing run id is refused and the first run is untouched."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="r")
    before = snapshot(db, "r")
    with pytest.raises(store.Conflict):
        db.submit_run([step("other", "linux"), step("more", "linux")], run_id="r")
    assert snapshot(db, "r") == before


def test_generated_run_ids_are_distinct(db: store.Store) -> None:
    """Without a run id the store picks a fresh one each time."""
    advertise(db, "n1", "linux")
    ids = {db.submit_run([step("s", "linux")]).run_id for _ in range(3)}
    assert len(ids) == 3
    assert all(isinstance(i, str) and i for i in ids)


def test_unknown_runs_are_not_found(db: store.Store) -> None:
    """Reading a run or Record that does not exist is NotFound, also a LookupError."""
    for read in (db.get_run, db.record, db.explain):
        with pytest.raises(store.NotFound) as caught:
            read("nope")
        assert isinstance(caught.value, LookupError)


def test_unknown_nodes_are_not_found(db: store.Store) -> None:
    """Every per-node call names a node that must have advertised."""
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="r")
    before = snapshot(db, "r")
    for call in (
        lambda: db.drain("ghost"),
        lambda: db.undrain("ghost"),
        lambda: db.claim_step("ghost"),
        lambda: db.heartbeat("ghost"),
        lambda: db.report_step("ghost", "r", 1, ok=True),
    ):
        with pytest.raises(store.NotFound) as caught:
            call()
        assert isinstance(caught.value, LookupError)
    assert snapshot(db, "r") == before


def test_list_runs_rejects_an_unknown_state(db: store.Store) -> None:
    """A typo in the state filter is an error, not an empty list."""
    with pytest.raises(ValueError, match="BOGUS"):
        db.list_runs(state="BOGUS")
    assert db.list_runs(state="QUEUED") == []


@pytest.mark.parametrize(
    "settings",
    [{"lease_ttl": -1}, {"max_leases_per_run": 0}, {"lease_ttl": float("inf")}],
    ids=["negative-ttl", "zero-max-leases", "infinite-ttl"],
)
def test_open_rejects_bad_settings(tmp_path: Path, settings: dict[str, Any]) -> None:
    """Settings that make no sense are refused when the store is opened."""
    with pytest.raises(ValueError):
        store.open(tmp_path / "x.sqlite3", **settings)


# -- explain --------------------------------------------------------------------


def test_explain_says_where_a_run_stands_and_why_each_node_does_not_take_it(
    db: store.Store, clock: Clock
) -> None:
    advertise(db, "n1", "linux")
    advertise(db, "n2", "gpu", "linux")
    advertise(db, "n3", "linux")
    db.drain("n3")
    db.submit_run([step("s", "linux")], run_id="busy")
    db.submit_run([step("s", "gpu")], run_id="first")
    assert db.submit_run([step("s", "linux")], run_id="ahead").state == "QUEUED"
    clock.tick(10)
    db.submit_run([step("build", "linux"), step("train", "gpu")], run_id="r")
    clock.tick(5)

    why = db.explain("r")
    assert {k: why[k] for k in ("run_id", "state", "position", "ahead", "reserving")} == {
        "run_id": "r",
        "state": "QUEUED",
        "position": 2,
        "ahead": ["ahead"],
        "reserving": False,
    }
    assert why["waited"] == pytest.approx(5.0)
    (n1, n2, n3), (gpu,) = (s["nodes"] for s in why["steps"])
    until = clock.now - 15 + 30  # busy's lease, issued 15 seconds ago
    assert n1 == {
        "node_id": "n1",
        "name": "box-n1",
        "why": "busy",
        "run_id": "busy",
        "lease_until": pytest.approx(until),
    }
    assert (n2["why"], n2["run_id"]) == ("busy", "first")
    assert n3 == {"node_id": "n3", "name": "box-n3", "why": "draining"}
    assert gpu["node_id"] == "n2"
    assert [(s["seq"], s["name"], s["needs"], s["node"]) for s in why["steps"]] == [
        (1, "build", ["linux"], ""),
        (2, "train", ["gpu"], ""),
    ]

    running = db.explain("busy")
    assert (running["state"], running["position"], running["ahead"]) == ("RUNNING", None, [])
    assert running["waited"] == 0.0
    assert running["steps"][0]["node"] == "n1"


def test_explain_calls_free_nodes_over_max_leases_when_only_that_stops_the_run(
    tmp_path: Path,
) -> None:
    with store.open(tmp_path / "x.sqlite3", max_leases_per_run=1) as db:
        advertise(db, "n1", "linux")
        advertise(db, "n2", "gpu")
        advertise(db, "both", "gpu", "linux")
        db.submit_run([step("hold", "gpu", "linux")], run_id="holder")
        db.submit_run([step("a", "linux"), step("b", "gpu")], run_id="r")
        nodes = [[(n["node_id"], n["why"]) for n in s["nodes"]] for s in db.explain("r")["steps"]]
        assert nodes == [
            [("both", "busy"), ("n1", "over max_leases_per_run")],
            [("both", "busy"), ("n2", "over max_leases_per_run")],
        ]


# -- the wire view --------------------------------------------------------------


def test_the_wire_view_of_a_run_through_its_life(db: store.Store) -> None:
    """``to_dict`` has the documented keys, the same from submit and get;
    ``assigned`` appears once placed and ``reject`` only once failed."""
    advertise(db, "n1", "linux", name="box")
    busy = db.submit_run([step("s", "linux")], run_id="busy")
    queued = db.submit_run([step("build", " linux"), step("test", "linux")], run_id="q")

    wire = queued.to_dict()
    assert wire.keys() == {"run_id", "state", "steps", "warnings"}
    assert wire["run_id"] == "q"
    assert wire["state"] == "QUEUED"
    assert wire["steps"] == [
        {"seq": 1, "name": "build", "state": "PENDING", "node": ""},
        {"seq": 2, "name": "test", "state": "PENDING", "node": ""},
    ]
    assert len(wire["warnings"]) == 1
    assert "linux" in wire["warnings"][0]
    assert db.get_run("q").to_dict() == wire

    running = busy.to_dict()
    assert running == db.get_run("busy").to_dict()
    assert running.keys() == {"run_id", "state", "steps", "warnings", "assigned"}
    assert running["assigned"] == [{"seq": 1, "node_id": "n1", "node_name": "box"}]
    assert running["steps"] == [{"seq": 1, "name": "s", "state": "PENDING", "node": "n1"}]

    finish(db, "n1", "busy")
    done = db.get_run("busy").to_dict()
    assert done["state"] == "SUCCEEDED"
    assert "reject" not in done
    promoted = db.get_run("q").to_dict()
    assert promoted["state"] == "RUNNING"
    assert "reject" not in promoted
    assert [a["node_id"] for a in promoted["assigned"]] == ["n1", "n1"]

    assert db.cancel_run("q")
    failed = db.get_run("q").to_dict()
    assert failed["state"] == "FAILED"
    assert failed["reject"] == "cancelled"


def test_a_cancelled_queued_run_has_reject_but_no_assigned(db: store.Store) -> None:
    """A run that never got nodes shows none, even once it failed."""
    busy_and_waiting(db)
    assert db.cancel_run("waiting")
    wire = db.get_run("waiting").to_dict()
    assert wire.keys() == {"run_id", "state", "steps", "warnings", "reject"}
    assert wire["steps"] == [{"seq": 1, "name": "w", "state": "FAILED", "node": ""}]


# -- label ------------------------------------------------------------------------


def test_label_attaches_node_names() -> None:
    """``label`` turns the matcher's assignments into named ones, in order."""
    adverts = {
        "n1": store.Advert("n1", "box-one", {"a"}),
        "n2": store.Advert("n2", "box-two", {"b"}),
    }
    assignments = [store.Assignment(1, "n2"), store.Assignment(2, "n1")]
    assert store.label(assignments, adverts) == [
        store.Assigned(1, "n2", "box-two"),
        store.Assigned(2, "n1", "box-one"),
    ]
    assert store.label([], adverts) == []


def test_label_refuses_an_unknown_node() -> None:
    """An assignment to a node that never advertised is a bug, reported loudly."""
    adverts = {"n1": store.Advert("n1", "box-one", {"a"})}
    with pytest.raises(ValueError, match="ghost"):
        store.label([store.Assignment(1, "n1"), store.Assignment(2, "ghost")], adverts)


def test_one_wake_scans_past_many_pages_of_the_queue(tmp_path: Path) -> None:
    """A wake promotes every run that fits, however long the queue, in FIFO
    order, passing over runs that still do not fit."""
    path = tmp_path / "long.sqlite3"
    with store.open(path, lease_ttl=0, max_leases_per_run=1) as paused:
        for i in range(150):
            paused.advertise(store.Advert(f"n{i:03d}", f"box-{i}", {"linux"}))
        paused.advertise(store.Advert("g", "gpu-box", {"gpu"}))
        ids = []
        for i in range(300):
            needs = {"gpu"} if i % 2 else {"linux"}
            ids.append(paused.submit_run([store.Step("s", "exec", needs)]).run_id)
    with store.open(path, lease_ttl=30, max_leases_per_run=1) as db:
        running = [r.run_id for r in db.list_runs("RUNNING")]
        assert running == [ids[0], ids[1], *ids[2::2]]
        assert [r.run_id for r in db.list_runs("QUEUED")] == ids[3::2]


def test_list_nodes_shows_caps_draining_and_the_lease_held(db: store.Store, clock: Clock) -> None:
    advertise(db, "n1", "linux", name="box-1")
    advertise(db, "n2", "gpu")
    db.drain("n2")
    run = db.submit_run([step("build", "linux")])
    n1, n2 = db.list_nodes()
    assert (n1.node_id, n1.name, n1.caps, n1.draining) == ("n1", "box-1", {"linux"}, False)
    assert (n1.run_id, n1.not_after) == (run.run_id, clock.now + db.lease_ttl)
    assert (n2.node_id, n2.draining, n2.run_id, n2.not_after) == ("n2", True, None, None)


def test_wake_with_no_free_node_reads_no_advert_or_queue(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every node busy or draining, wake answers from one query: it
    reads neither the adverts nor the queue (what keeps it cheap however
    long the queue is)."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "linux")
    db.submit_run([step("a", "linux")])
    db.drain("n2")
    db.submit_run([step("b", "linux")])
    seen = trace(db, monkeypatch)
    assert db.wake_queued("test") == []
    assert seen
    assert not any("caps" in sql or "steps" in sql for sql in seen), seen


def test_submit_sees_what_another_store_advertised(location: str) -> None:
    """A store keeps the nodes' adverts between calls, and reads them again
    once any store on the same location advertises: placement never works
    from stale caps."""
    with store.open(location) as a, store.open(location) as b:
        advertise(a, "n1", "linux")
        assert a.submit_run([step("s", "linux")]).state == "RUNNING"
        with pytest.raises(store.Unsatisfiable):
            a.submit_run([step("s", "gpu")])
        advertise(b, "n2", "gpu")
        run = a.submit_run([step("s", "gpu")])
        assert (run.state, step_nodes(a, run.run_id)) == ("RUNNING", ["n2"])
        advertise(b, "n2", "arm", name="renamed")
        with pytest.raises(store.Unsatisfiable):
            a.submit_run([step("s", "gpu")])
        assert a.submit_run([step("s", "arm")]).state == "QUEUED"  # n2 is busy


def test_submit_with_every_node_busy_reads_no_advert(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the adverts are known, a run submitted while no node is free is
    queued without reading them again (what keeps submit cheap however many
    nodes there are)."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "linux")
    db.submit_run([step("a", "linux")])
    db.drain("n2")
    db.submit_run([step("b", "linux")])
    seen = trace(db, monkeypatch)
    assert db.submit_run([step("c", "linux")]).state == "QUEUED"
    assert seen
    assert not any("caps" in sql for sql in seen), seen
