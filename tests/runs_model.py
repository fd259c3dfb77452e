"""The plain-Python model of runs, nodes, leases and the queue that the run
tests hold the store to (placement by the library's own pure matcher, the
QUEUED runs scanned in submit order, reservations after ``reserve_after``),
and the structural rules every store file must keep."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event

import store
from store.runs.match import place
from store.shapes import Assignment
from tests.helpers import Raw

NODES = ("n1", "n2", "n3", "n4")
LABELS = ("gpu", "linux", "arm")
NAMES = ("alpha", "beta", "gamma")
MAX_NODES = 2
TTL = 30.0
#: reserve_after of the machine that reserves: a few ticks.
RESERVE = 15.0
#: Seconds past every lease's end: a reap at now + FAR expires them all.
FAR = 100_000.0
TERMINAL = ("SUCCEEDED", "FAILED")
UNFINISHED = ("PENDING", "RUNNING")
NO_RUN = "no-such-run"
#: Caps of NODES in the usual start: no node has both gpu and arm.
LAYOUT = ({"gpu"}, {"arm"}, {"gpu", "linux"}, {"arm", "linux"})


# -- structural checks on a store file, shared by both tests -------------------


def read_leases(raw: Raw) -> list[tuple[str, str]]:
    """Every lease row, as ``(node_id, run_id)``."""
    return [(n, r) for n, r in raw.rows("SELECT node_id, run_id FROM leases")]


def read_caps(raw: Raw) -> dict[str, frozenset[str]]:
    """The caps of every advertised node, as stored."""
    return {n: frozenset(_json_list(c)) for n, c in raw.rows("SELECT id, caps FROM nodes")}


def _json_list(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list)
    return [str(v) for v in value]


def check_structure(
    db: store.Store, raw: Raw
) -> tuple[list[store.RunView], dict[str, dict[str, Any]]]:
    """The rules that hold of any store file at rest, whatever happened to it.
    Returns the runs, FIFO, and their Records, for further checks."""
    runs = db.list_runs()
    by_id = {r.run_id: r for r in runs}
    leases = read_leases(raw)

    # No node in two leases; every lease is on a node with an unfinished step
    # of its own RUNNING run, and every such node holds that lease.
    lease_nodes = [n for n, _ in leases]
    assert len(lease_nodes) == len(set(lease_nodes)), f"a node leased twice: {leases}"
    lease_of = dict(leases)
    for node_id, run_id in leases:
        run = by_id[run_id]
        assert run.state == "RUNNING", f"{run_id} is {run.state} but holds a lease on {node_id}"
        assert any(s.node == node_id and s.state in UNFINISHED for s in run.steps), (
            f"lease {node_id} -> {run_id}, but no unfinished step of the run is on it"
        )
    serving: dict[str, str] = {}
    for run in runs:
        nodes_used = {s.node for s in run.steps if s.node}
        assert len(nodes_used) <= db.max_leases_per_run, f"{run.run_id} holds {nodes_used}"
        assert sum(1 for _, r in leases if r == run.run_id) <= db.max_leases_per_run
        if run.state == "QUEUED":
            assert all(s.node == "" for s in run.steps), f"QUEUED {run.run_id} has a node"
            assert all(s.state == "PENDING" for s in run.steps)
            assert run.run_id not in lease_of.values(), f"QUEUED {run.run_id} holds a lease"
            assert run.started_at is None
        if run.state == "RUNNING":
            for s in run.steps:
                if s.state in UNFINISHED:
                    assert lease_of.get(s.node) == run.run_id, (
                        f"step {s.seq} of {run.run_id} is {s.state} on {s.node!r} without its lease"
                    )
                    other = serving.setdefault(s.node, run.run_id)
                    assert other == run.run_id, f"{s.node} serves {other} and {run.run_id}"
        if run.state in TERMINAL:
            assert all(s.state in TERMINAL for s in run.steps)
            assert run.ended_at is not None
        else:
            assert run.ended_at is None

    # A terminal run has a sealed Record; no other run has.
    records = {run.run_id: db.record(run.run_id) for run in runs}
    for run in runs:
        rec = records[run.run_id]
        assert rec["run_id"] == run.run_id
        if run.state in TERMINAL:
            assert rec["sealed_at"] is not None, f"terminal {run.run_id} has an open Record"
            assert str(rec.get("digest", "")).startswith("sha256:"), rec
            assert rec["state"] == run.state
            assert [s["state"] for s in rec["steps"]] == [s.state for s in run.steps]
        else:
            assert rec["sealed_at"] is None, f"{run.state} {run.run_id} has a sealed Record"
            assert "digest" not in rec
        assert [s["node_id"] for s in rec["steps"]] == [s.node for s in run.steps]
    return runs, records


def unplaceable_queue(db: store.Store, raw: Raw, runs: list[store.RunView]) -> None:
    """No QUEUED run fits the nodes available now."""
    caps = read_caps(raw)
    unavailable = db.unavailable_nodes()
    for run in runs:
        if run.state == "QUEUED":
            needs = [(s.seq, s.needs) for s in run.steps]
            fit = place(needs, caps, unavailable, db.max_leases_per_run)
            assert fit is None, f"QUEUED {run.run_id} fits {fit} after a wake"


# -- the model -------------------------------------------------------------------


@dataclass
class MNode:
    caps: frozenset[str]
    name: str
    draining: bool = False


@dataclass
class MStep:
    needs: frozenset[str]
    node: str = ""
    #: The node's name when the step was placed: what the Record keeps.
    node_name: str = ""
    state: str = "PENDING"


@dataclass
class MRun:
    run_id: str
    steps: list[MStep]
    created_at: float
    state: str = "QUEUED"
    #: "" while live or after success; "cancelled", "step" or "lease" once failed.
    why: str = ""
    placed: bool = False

    def needs(self) -> list[tuple[int, frozenset[str]]]:
        return [(seq, s.needs) for seq, s in enumerate(self.steps, 1)]


@dataclass
class Model:
    reserve_after: float | None = None
    nodes: dict[str, MNode] = field(default_factory=dict)
    runs: list[MRun] = field(default_factory=list)
    leases: dict[str, str] = field(default_factory=dict)
    #: When each lease ends unless renewed.
    lease_until: dict[str, float] = field(default_factory=dict)

    def run(self, run_id: str) -> MRun:
        return next(r for r in self.runs if r.run_id == run_id)

    def caps(self) -> dict[str, frozenset[str]]:
        return {n: node.caps for n, node in self.nodes.items()}

    def unavailable(self) -> set[str]:
        return set(self.leases) | {n for n, node in self.nodes.items() if node.draining}

    def place(self, needs: list[tuple[int, frozenset[str]]], free: bool) -> list[Assignment] | None:
        return place(needs, self.caps(), set() if free else self.unavailable(), MAX_NODES)

    def starving(self, run: MRun, now: float) -> bool:
        """QUEUED for ``reserve_after`` seconds or more (0: at once)."""
        if run.state != "QUEUED" or self.reserve_after is None:
            return False
        return not self.reserve_after or now - run.created_at >= self.reserve_after

    def covering(self, run: MRun) -> set[str]:
        """The nodes that could take one of the run's steps."""
        return {
            n
            for n, node in self.nodes.items()
            if any(needs <= node.caps for _, needs in run.needs())
        }

    def reserves(self, run: MRun, now: float) -> set[str]:
        """The nodes a starving run holds back, if it could be placed at all
        (with every node free); none otherwise."""
        if not self.starving(run, now) or self.place(run.needs(), free=True) is None:
            return set()
        return self.covering(run)

    def reserved(self, now: float, before: MRun | None = None) -> dict[str, str]:
        """Each node reserved by a starving run (ahead of ``before``, if
        given), with the first such run."""
        held: dict[str, str] = {}
        for run in self.runs:
            if run is before:
                break
            for node_id in self.reserves(run, now):
                held.setdefault(node_id, run.run_id)
        return held

    def apply(self, run: MRun, placed: list[Assignment], now: float) -> set[str]:
        for a in placed:
            step = run.steps[a.seq - 1]
            step.node, step.node_name = a.node_id, self.nodes[a.node_id].name
        taken = {a.node_id for a in placed}
        for node_id in taken:
            assert node_id not in self.leases
            self.leases[node_id] = run.run_id
            self.lease_until[node_id] = now + TTL
        run.state, run.placed = "RUNNING", True
        event("placed on nodes", len(taken))
        return taken

    def scan(self, now: float) -> list[str]:
        """The FIFO wake: promote every QUEUED run that fits, in submit order,
        blocking each promotion's nodes for the runs after it, and the nodes
        a starving run that does not fit could use."""
        caps, blocked = self.caps(), self.unavailable()
        promoted = []
        for run in self.runs:
            if run.state == "QUEUED":
                placed = place(run.needs(), caps, blocked, MAX_NODES)
                if placed is not None:
                    blocked |= self.apply(run, placed, now)
                    promoted.append(run.run_id)
                elif held := self.reserves(run, now):
                    event("a starving run reserves")
                    blocked |= held
        return promoted

    def end(self, run: MRun, state: str, why: str) -> None:
        for s in run.steps:
            if s.state in UNFINISHED:
                s.state = "FAILED"
        for node_id in [n for n, r in self.leases.items() if r == run.run_id]:
            del self.leases[node_id], self.lease_until[node_id]
        run.state, run.why = state, why

    def next_step(self, node_id: str) -> tuple[MRun, int] | None:
        """The step a claim by ``node_id`` gets: the first PENDING step on it,
        in FIFO and seq order, whose earlier steps all SUCCEEDED."""
        for run in self.runs:
            if run.state != "RUNNING":
                continue
            for seq, s in enumerate(run.steps, 1):
                before = run.steps[: seq - 1]
                if (
                    s.node == node_id
                    and s.state == "PENDING"
                    and all(p.state == "SUCCEEDED" for p in before)
                ):
                    return run, seq
        return None

    def claim(self, node_id: str, now: float) -> tuple[str, int] | None:
        found = self.next_step(node_id)
        if found is None:
            return None
        run, seq = found
        run.steps[seq - 1].state = "RUNNING"
        self.lease_until[node_id] = now + TTL
        return run.run_id, seq

    def ready(self) -> list[str]:
        """Nodes a claim would hand a step to."""
        return [n for n in sorted(self.nodes) if self.next_step(n) is not None]

    def held(self) -> list[tuple[str, str, int]]:
        """``(node, run, seq)`` of every RUNNING step."""
        return [
            (s.node, r.run_id, seq)
            for r in self.runs
            for seq, s in enumerate(r.steps, 1)
            if s.state == "RUNNING"
        ]

    def report(self, node_id: str, run_id: str, seq: int, ok: bool) -> bool:
        """Apply a valid report; whether it freed capacity."""
        run = self.run(run_id)
        run.steps[seq - 1].state = "SUCCEEDED" if ok else "FAILED"
        if not ok:
            self.end(run, "FAILED", "step")
            return True
        left = {s.node for s in run.steps if s.state in UNFINISHED}
        if not left:
            self.end(run, "SUCCEEDED", "")
            return True
        if node_id not in left:
            event("lease released before the run ended")
            del self.leases[node_id], self.lease_until[node_id]
            return True
        return False
