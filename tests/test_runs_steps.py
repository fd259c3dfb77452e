"""Steps on their nodes: claiming and reporting them, heartbeats, reaping
lapsed leases, cancelling runs, and one lease per node."""

from __future__ import annotations

from pathlib import Path

import pytest

import store
from store.runs import node_leases
from tests.helpers import Clock
from tests.runs_helpers import (
    FAR_FUTURE,
    advertise,
    busy_and_waiting,
    finish,
    leases,
    snapshot,
    step,
    step_nodes,
    step_states,
)

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
    with store.open(tmp_path / "x.sqlite3", lease_ttl=30, clock=clock.time) as db:
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
    with store.open(tmp_path / "x.sqlite3", lease_ttl=30, clock=clock.time) as db:
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
