"""What a run says of itself: the sealed Record, the wire view, labels,
``explain``, and bad input refused with nothing changed."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

import store
import store.runs.record as record_module
from tests.helpers import Clock, raw, trace
from tests.runs_helpers import (
    advertise,
    busy_and_waiting,
    finish,
    none_free,
    snapshot,
    step,
    step_nodes,
)

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
    none_free(db)
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
    none_free(db)
    seen = trace(db, monkeypatch)
    assert db.submit_run([step("c", "linux")]).state == "QUEUED"
    assert seen
    assert not any("caps" in sql for sql in seen), seen
