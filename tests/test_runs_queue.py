"""Runs placed and queued: the FIFO queue of QUEUED runs and its promotion,
draining nodes, a store that places nothing, every event that frees
capacity waking the queue, and runs no fleet could ever place."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import store
import store.runs.queue as store_queue
from tests.helpers import Clock, raw
from tests.runs_helpers import (
    FAR_FUTURE,
    advertise,
    busy_and_waiting,
    finish,
    leases,
    step,
    step_nodes,
)

# -- the queue: FIFO ------------------------------------------------------------


def test_queued_runs_are_promoted_in_submit_order_even_with_a_frozen_clock(
    tmp_path: Path, clock: Clock
) -> None:
    """Waiting runs get capacity in the order they were submitted, whatever
    their ids and even when the clock does not move."""
    with store.open(tmp_path / "x.sqlite3", clock=clock.time) as db:
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
