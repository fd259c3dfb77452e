"""What the tests of runs, steps and nodes build their stores from: nodes
advertised, steps, runs finished, and what a refused request must leave
as it was."""

from __future__ import annotations

from typing import Any

import pytest

import store
from tests.helpers import raw

FAR_FUTURE = 1e12


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


def none_free(db: store.Store) -> None:
    """Nodes n1 and n2 (linux), neither free: n1 runs a run, n2 drains
    while a second run waits for a linux node."""
    advertise(db, "n1", "linux")
    advertise(db, "n2", "linux")
    db.submit_run([step("a", "linux")])
    db.drain("n2")
    db.submit_run([step("b", "linux")])


def busy_and_waiting(db: store.Store) -> None:
    """Node n1 runs ``busy``; ``waiting`` wants a linux node and is QUEUED."""
    advertise(db, "n1", "linux")
    assert db.submit_run([step("s", "linux")], run_id="busy").state == "RUNNING"
    assert db.submit_run([step("w", "linux")], run_id="waiting").state == "QUEUED"
