"""Runs, nodes, leases and the queue against a plain-Python model.

A Hypothesis state machine drives a real store, on each engine, through advertise, drain,
submit, claim, report, heartbeat, reap, cancel, wake and the passing of time
(the store's clock, stepped), and checks after every step that the store
agrees with a model that places runs with the library's own pure matcher,
scanning the QUEUED runs in submit order; with ``reserve_after`` set, a run
that has waited that long reserves the nodes it could use. A second handle
opened with ``lease_ttl=0`` frees capacity without promoting anything, so an
explicit ``wake_queued`` has real work to do. A threaded test then hammers one store
from several ``Store`` objects at once and checks the same structural rules on
what is left.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import store
from store.match import place
from store.shapes import Assignment
from tests.helpers import Clock, Raw, store_clock

pytestmark = pytest.mark.slow

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


# -- the state machine -----------------------------------------------------------

node_ids = st.sampled_from(NODES)
#: One label, most often: then runs whose steps need different labels take
#: two nodes, and a node's lease ends before its run does.
one_label = st.sampled_from(LABELS).map(lambda label: frozenset({label}))
label_sets = one_label | st.frozensets(st.sampled_from(LABELS), max_size=len(LABELS))
#: Mostly the live handle; now and then the lease_ttl=0 one.
rarely = st.integers(0, 2).map(lambda i: i == 0)
need_sets = one_label | st.frozensets(st.sampled_from(LABELS), max_size=2)


class RunQueueMachine(RuleBasedStateMachine):
    """A store and a model of it, stepped together."""

    #: Makes a new store for each example (the test sets it, per engine).
    fresh: Callable[[], contextlib.AbstractContextManager[str]]
    #: The store's clock (the test sets it), and the stores' reserve_after.
    clock: Clock
    reserve_after: float | None

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        settings = {"max_leases_per_run": MAX_NODES, "reserve_after": self.reserve_after}
        try:
            where = self.stack.enter_context(self.fresh())
            self.db = self.stack.enter_context(store.open(where, lease_ttl=TTL, **settings))
            # lease_ttl=0: a handle whose events wake the queue but can promote nothing.
            self.quiet = self.stack.enter_context(store.open(where, lease_ttl=0, **settings))
            self.raw = Raw(where)
            self.stack.callback(self.raw.close)
        except BaseException:
            self.stack.close()
            raise
        self.model = Model(self.reserve_after)
        #: True while the last capacity-freeing event was followed by a real wake.
        self.settled = True
        self.sealed: dict[str, dict[str, Any]] = {}

    def teardown(self) -> None:
        self.stack.close()

    def handle(self, quiet: bool) -> store.Store:
        return self.quiet if quiet else self.db

    def freed(self, quiet: bool) -> None:
        """Capacity may have been freed through ``quiet`` or the live handle:
        the live handle's automatic wake is the model's scan."""
        if quiet:
            self.settled = False
        else:
            event("automatic wake promoted", len(self.model.scan(self.clock.now)))
            self.settled = True

    # -- nodes

    @initialize(
        drawn=st.booleans(),
        caps=st.lists(label_sets, min_size=len(NODES), max_size=len(NODES)),
        names=st.lists(st.sampled_from(NAMES), min_size=len(NODES), max_size=len(NODES)),
        count=st.integers(0, len(NODES)),
    )
    def some_nodes(
        self, drawn: bool, caps: list[frozenset[str]], names: list[str], count: int
    ) -> None:
        """Either every node with caps that make some runs take two nodes, or
        drawn caps on the first ``count`` nodes."""
        if not drawn:
            caps, count = [frozenset(c) for c in LAYOUT], len(NODES)
        for node_id, c, name in list(zip(NODES, caps, names, strict=True))[:count]:
            self.advertise(node_id, c, name, quiet=False)

    @rule(node_id=node_ids, caps=label_sets, name=st.sampled_from(NAMES), quiet=rarely)
    def advertise(self, node_id: str, caps: frozenset[str], name: str, quiet: bool) -> None:
        self.handle(quiet).advertise(store.Advert(node_id=node_id, name=name, caps=caps))
        known = self.model.nodes.get(node_id)
        draining = known.draining if known else False
        self.model.nodes[node_id] = MNode(caps, name, draining)
        self.freed(quiet)

    @rule(node_id=node_ids, draining=st.booleans(), quiet=rarely)
    def drain_or_undrain(self, node_id: str, draining: bool, quiet: bool) -> None:
        db = self.handle(quiet)
        change = db.drain if draining else db.undrain
        if node_id not in self.model.nodes:
            with pytest.raises(store.NotFound):
                change(node_id)
            return
        change(node_id)
        self.model.nodes[node_id].draining = draining
        if not draining:
            self.freed(quiet)

    # -- runs

    @rule(needs=st.lists(need_sets, min_size=1, max_size=3), quiet=rarely)
    def submit(self, needs: list[frozenset[str]], quiet: bool) -> None:
        steps = [store.Step(name=f"s{i}", kind="exec", needs=n) for i, n in enumerate(needs, 1)]
        seq_needs = list(enumerate(needs, 1))
        if self.model.place(seq_needs, free=True) is None:
            with pytest.raises(store.Unsatisfiable):
                self.handle(quiet).submit_run(steps)
            event("submitted", "Unsatisfiable")
            return
        now = self.clock.now
        reserved = self.model.reserved(now)
        placed = (
            None
            if quiet
            else place(
                seq_needs, self.model.caps(), self.model.unavailable() | reserved.keys(), MAX_NODES
            )
        )
        view = self.handle(quiet).submit_run(steps)
        if self.model.runs:
            assert view.created_at > self.model.runs[-1].created_at
        run = MRun(view.run_id, [MStep(n) for n in needs], view.created_at)
        self.model.runs.append(run)
        if placed is not None:
            self.model.apply(run, placed, now)
        elif quiet:
            # It may fit and still wait: only a live wake places it.
            self.settled = False
        event("submitted", run.state)
        assert view.state == run.state
        assert [s.node for s in view.steps] == [s.node for s in run.steps]
        assert view.to_dict()["state"] == run.state

    @rule(needs=need_sets)
    def submit_one_step(self, needs: frozenset[str]) -> None:
        self.submit([needs], quiet=False)

    @rule(labels=st.permutations(("gpu", "arm", "linux")), third=st.booleans())
    def submit_across_nodes(self, labels: list[str], third: bool) -> None:
        """Steps needing different labels: with LAYOUT, gpu and arm take two nodes."""
        self.submit([frozenset({label}) for label in labels[: 3 if third else 2]], quiet=False)

    @precondition(lambda self: bool(self.model.ready()))
    @rule(data=st.data())
    def claim_ready(self, data: st.DataObject) -> None:
        self.claim(data.draw(st.sampled_from(self.model.ready())))

    @precondition(lambda self: bool(self.model.ready()))
    @rule(data=st.data(), ok=st.integers(0, 4).map(bool))
    def work(self, data: st.DataObject, ok: bool) -> None:
        """A node that has a step claims it and reports it, mostly ok."""
        node_id = data.draw(st.sampled_from(self.model.ready()))
        self.claim(node_id)
        run_id, seq = next((r, q) for n, r, q in self.model.held() if n == node_id)
        self.report_held(node_id, run_id, seq, ok=ok, quiet=False)

    @rule(node_id=node_ids)
    def claim(self, node_id: str) -> None:
        if node_id not in self.model.nodes:
            with pytest.raises(store.NotFound):
                self.db.claim_step(node_id)
            return
        expected = self.model.claim(node_id, self.clock.now)
        got = self.db.claim_step(node_id)
        assert (None if got is None else (got.run_id, got.seq)) == expected
        event("claim", "step" if got else "none")
        if got is not None:
            assert got.not_after == self.model.lease_until[node_id]

    @precondition(lambda self: bool(self.model.held()))
    @rule(data=st.data(), ok=st.booleans(), quiet=rarely)
    def report(self, data: st.DataObject, ok: bool, quiet: bool) -> None:
        node_id, run_id, seq = data.draw(st.sampled_from(self.model.held()))
        self.report_held(node_id, run_id, seq, ok=ok, quiet=quiet)

    def report_held(self, node_id: str, run_id: str, seq: int, *, ok: bool, quiet: bool) -> None:
        view = self.handle(quiet).report_step(node_id, run_id, seq, ok=ok, output={"seq": seq})
        event("report", str(ok))
        if self.model.report(node_id, run_id, seq, ok):
            self.freed(quiet)
        assert view.state == self.model.run(run_id).state

    @rule(data=st.data(), node_id=node_ids, seq=st.integers(1, 3), ok=st.booleans())
    def report_not_held(self, data: st.DataObject, node_id: str, seq: int, ok: bool) -> None:
        run_id = data.draw(st.sampled_from([r.run_id for r in self.model.runs] + [NO_RUN]))
        if (node_id, run_id, seq) in self.model.held():
            return
        expected: type[store.StoreError]
        if node_id not in self.model.nodes or run_id == NO_RUN:
            expected = store.NotFound
        else:
            expected = store.Conflict
        with pytest.raises(expected):
            self.db.report_step(node_id, run_id, seq, ok=ok)

    @rule(node_id=node_ids)
    def heartbeat(self, node_id: str) -> None:
        if node_id not in self.model.nodes:
            with pytest.raises(store.NotFound):
                self.db.heartbeat(node_id)
            return
        got = self.db.heartbeat(node_id)
        if node_id in self.model.leases:
            self.model.lease_until[node_id] = self.clock.now + TTL
            assert got == self.model.lease_until[node_id]
        else:
            assert got is None

    @rule(far=rarely, quiet=rarely)
    def reap(self, far: bool, quiet: bool) -> None:
        now = self.clock.now + (FAR if far else 0.0)
        expected = sorted(
            {r for n, r in self.model.leases.items() if self.model.lease_until[n] <= now}
        )
        got = self.handle(quiet).reap(now=now)
        assert sorted(got) == expected
        assert len(got) == len(set(got))
        for run_id in expected:
            self.model.end(self.model.run(run_id), "FAILED", "lease")
        event("reaped", len(got))
        if got:
            self.freed(quiet)

    @rule(data=st.data(), quiet=rarely)
    def cancel(self, data: st.DataObject, quiet: bool) -> None:
        run_id = data.draw(st.sampled_from([r.run_id for r in self.model.runs] + [NO_RUN]))
        live = run_id != NO_RUN and self.model.run(run_id).state in ("QUEUED", "RUNNING")
        assert self.handle(quiet).cancel_run(run_id) is live
        if live:
            self.model.end(self.model.run(run_id), "FAILED", "cancelled")
            self.freed(quiet)

    @rule(quiet=rarely)
    def wake(self, quiet: bool) -> None:
        if quiet:
            assert self.quiet.wake_queued("lease_ttl=0") == []
            return
        expected = self.model.scan(self.clock.now)
        event("explicit wake promoted", len(expected))
        assert self.db.wake_queued("asked") == expected
        self.settled = True

    @rule(seconds=st.sampled_from([1.0, 7.0, 16.0]))
    def time_passes(self, seconds: float) -> None:
        """The clock moves: runs wait longer, leases near their end."""
        self.clock.tick(seconds)

    @precondition(lambda self: not self.settled)
    @rule()
    def wake_after_quiet_event(self) -> None:
        """Capacity was freed with no promotion: the explicit wake does it."""
        self.wake(quiet=False)

    # -- checks

    @invariant()
    def agrees_with_model(self) -> None:
        runs, records = check_structure(self.db, self.raw)
        model = self.model
        assert [r.run_id for r in runs] == [r.run_id for r in model.runs], "FIFO is submit order"
        for view, run in zip(runs, model.runs, strict=True):
            assert view.state == run.state, view.run_id
            assert [s.state for s in view.steps] == [s.state for s in run.steps], view.run_id
            assert [s.node for s in view.steps] == [s.node for s in run.steps], view.run_id
            assert (view.started_at is not None) == run.placed
            if run.state == "SUCCEEDED":
                assert view.reason is None
            elif run.state == "FAILED":
                assert view.reason is not None
                assert (view.reason == "cancelled") == (run.why == "cancelled"), view.reason
        assert dict(read_leases(self.raw)) == model.leases
        assert self.db.unavailable_nodes() == model.unavailable()
        assert read_caps(self.raw) == model.caps()
        if self.settled:
            # No QUEUED run fits the nodes available to it: neither
            # unavailable nor reserved by a run ahead. (Time passing only
            # makes more runs reserve, so this holds until the next event.)
            for run in model.runs:
                if run.state == "QUEUED":
                    blocked = model.unavailable() | model.reserved(self.clock.now, run).keys()
                    fit = place(run.needs(), model.caps(), blocked, MAX_NODES)
                    assert fit is None, f"QUEUED {run.run_id} fits {fit} after a wake"

        # Records name each step's node by id and by its name when placed, and
        # a sealed one never changes again.
        for run in model.runs:
            rec = records[run.run_id]
            assert rec["state"] == run.state
            assert [(s["node_id"], s["node_name"]) for s in rec["steps"]] == [
                (s.node, s.node_name) for s in run.steps
            ]
            if run.state in TERMINAL:
                first = self.sealed.setdefault(run.run_id, rec)
                assert rec == first, f"the sealed Record of {run.run_id} changed"

    @invariant()
    def explain_tells_the_truth(self) -> None:
        """For each QUEUED run, ``explain`` gives its place in the queue,
        whether it reserves and, for each step, every node that covers it:
        busy ones hold a lease (of the run named), draining ones drain,
        reserved ones are reserved by the first starving run ahead that
        could use them, and a free one could take the step now; free nodes
        are called over max_leases_per_run exactly when only that keeps the
        run from being placed."""
        model = self.model
        now = self.clock.now
        queued = [r.run_id for r in model.runs if r.state == "QUEUED"]
        for position, run_id in enumerate(queued, 1):
            why = self.db.explain(run_id)
            run = model.run(run_id)
            assert (why["state"], why["position"], why["ahead"]) == (
                "QUEUED",
                position,
                queued[: position - 1],
            )
            assert why["reserving"] is bool(model.reserves(run, now))
            assert why["waited"] == pytest.approx(max(0.0, now - run.created_at))
            held = model.reserved(now, run)
            unavailable = model.unavailable() | held.keys()
            every_step_has_a_node = all(
                any(n not in unavailable and needs <= model.nodes[n].caps for n in model.nodes)
                for _, needs in run.needs()
            )
            over = (
                every_step_has_a_node
                and place(run.needs(), model.caps(), unavailable, MAX_NODES) is None
            )
            if self.settled:
                assert not every_step_has_a_node or over, f"{run_id} fits: a wake placed it"
            for step, (seq, needs) in zip(why["steps"], run.needs(), strict=True):
                assert (step["seq"], set(step["needs"])) == (seq, needs)
                covering = sorted(n for n, node in model.nodes.items() if needs <= node.caps)
                assert [n["node_id"] for n in step["nodes"]] == covering
                for node in step["nodes"]:
                    node_id = node["node_id"]
                    if node_id in model.leases:
                        assert node["why"] == "busy"
                        assert node["run_id"] == model.leases[node_id]
                    elif model.nodes[node_id].draining:
                        assert node["why"] == "draining"
                    elif node_id in held:
                        assert node["why"] == "reserved"
                        assert node["run_id"] == held[node_id]
                    else:
                        assert node_id not in unavailable
                        assert node["why"] == ("over max_leases_per_run" if over else None)


SETTINGS = settings(
    max_examples=250,
    stateful_step_count=60,
    deadline=None,
    # Tracing a failing machine line by line takes longer than the test may.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reserve_after", [None, RESERVE, 0.0])
def test_the_run_queue_against_the_model(
    fresh_location: Callable[[], contextlib.AbstractContextManager[str]],
    request: pytest.FixtureRequest,
    reserve_after: float | None,
) -> None:
    # A store costs ten times more on PostgreSQL (a database each, and a
    # round trip per statement): fewer examples there, the same rules.
    engine = request.node.callspec.params["fresh_location"]
    examples = SETTINGS.max_examples if engine == "sqlite" else SETTINGS.max_examples // 10
    if reserve_after == 0:
        examples //= 3  # strict FIFO: a narrower case of RESERVE's rules
    with (
        store_clock(Clock()) as clock,
        mock.patch.multiple(
            RunQueueMachine,
            fresh=fresh_location,
            clock=clock,
            reserve_after=reserve_after,
            create=True,
        ),
    ):
        run_state_machine_as_test(
            RunQueueMachine, settings=settings(SETTINGS, max_examples=examples)
        )


# -- threads against one file ----------------------------------------------------

THREADS = 8
SECONDS = 3.0
NODE_CAPS = {
    "t0": frozenset(LABELS),  # every run fits here alone: no submit is Unsatisfiable
    "t1": frozenset({"linux"}),
    "t2": frozenset({"gpu", "linux"}),
    "t3": frozenset({"arm"}),
}
#: A client submits only while fewer runs than this are QUEUED, so the queue
#: stays short and the work goes on for the whole time.
QUEUE_LIMIT = 12
#: Runs one client thread submits at most, whatever the queue.
SUBMITS_PER_CLIENT = 300
EXPECTED = (store.Conflict, store.NotFound)


class Shared:
    """What the threads share: the ids submitted, the races they lost, and the
    errors nobody expected."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.run_ids: list[str] = []
        self.races: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self.ops: Counter[str] = Counter()

    def count(self, what: str) -> None:
        with self.lock:
            self.ops[what] += 1

    def lost(self, e: BaseException) -> None:
        with self.lock:
            self.races[type(e).__name__] += 1


@contextlib.contextmanager
def handle_for(own: bool, path: str, shared_db: store.Store) -> Iterator[store.Store]:
    """The thread's own Store on the file, closed afterwards, or the shared one."""
    if own:
        with store.open(path, lease_ttl=TTL, max_leases_per_run=MAX_NODES) as db:
            yield db
    else:
        yield shared_db


def node_loop(db: store.Store, node_id: str, rng: random.Random, shared: Shared) -> None:
    """Claim and report this node's steps until the time is up."""
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        try:
            claim = db.claim_step(node_id)
            if claim is None:
                shared.count("idle")
                if rng.random() < 0.1:
                    db.heartbeat(node_id)
                if rng.random() < 0.03:
                    db.drain(node_id)
                    db.undrain(node_id)
                continue
            ok = rng.random() > 0.15
            db.report_step(node_id, claim.run_id, claim.seq, ok=ok, output={"by": node_id})
            shared.count("report")
        except EXPECTED as e:
            shared.lost(e)


def client_loop(db: store.Store, rng: random.Random, shared: Shared) -> None:
    """Submit runs, cancel some, wake the queue, until the time is up."""
    deadline = time.monotonic() + SECONDS
    submitted = 0
    while time.monotonic() < deadline:
        try:
            pick = rng.random()
            if (
                pick < 0.5
                and submitted < SUBMITS_PER_CLIENT
                and len(db.list_runs(state="QUEUED")) < QUEUE_LIMIT
            ):
                needs = [
                    frozenset(rng.sample(LABELS, rng.randint(0, 2)))
                    for _ in range(rng.randint(1, 3))
                ]
                steps = [store.Step(f"s{i}", "exec", n) for i, n in enumerate(needs, 1)]
                view = db.submit_run(steps)
                submitted += 1
                with shared.lock:
                    shared.run_ids.append(view.run_id)
                shared.count("submit")
            elif pick < 0.65:
                with shared.lock:
                    recent = shared.run_ids[-8:]
                victim = rng.choice(recent) if recent else NO_RUN
                db.cancel_run(victim)
                shared.count("cancel")
            elif pick < 0.8:
                db.wake_queued("client")
                shared.count("wake")
            else:
                with shared.lock:
                    some = rng.choice(shared.run_ids) if shared.run_ids else NO_RUN
                db.get_run(some)
                shared.count("get")
        except EXPECTED as e:
            shared.lost(e)


def worker(
    index: int, path: str, shared_db: store.Store, barrier: threading.Barrier, shared: Shared
) -> None:
    rng = random.Random(index)
    nodes = sorted(NODE_CAPS)
    try:
        with handle_for(index % 2 == 0, path, shared_db) as db:
            if index < len(nodes):
                node_id = nodes[index]
                db.advertise(store.Advert(node_id, f"box-{node_id}", NODE_CAPS[node_id]))
                barrier.wait()
                node_loop(db, node_id, rng, shared)
            else:
                barrier.wait()
                client_loop(db, rng, shared)
    except BaseException as e:
        barrier.abort()
        with shared.lock:
            shared.errors.append(e)


@pytest.mark.timeout(120)
def test_threads_on_one_store_keep_the_rules(location: str) -> None:
    path = location
    shared = Shared()
    barrier = threading.Barrier(THREADS, timeout=30)
    with store.open(path, lease_ttl=TTL, max_leases_per_run=MAX_NODES) as db:
        threads = [
            threading.Thread(
                target=worker, args=(i, path, db, barrier, shared), name=f"runs-{i}", daemon=True
            )
            for i in range(THREADS)
        ]
        for t in threads:
            t.start()
        joined_by = time.monotonic() + 60
        for t in threads:
            t.join(timeout=max(0.0, joined_by - time.monotonic()))
        assert not [t.name for t in threads if t.is_alive()], "threads did not finish"
        assert not shared.errors, f"unexpected errors: {shared.errors!r}"
        assert shared.ops["submit"] > 0
        assert shared.ops["report"] > 0, shared.ops

        with contextlib.closing(Raw(location)) as raw:
            runs, _ = check_structure(db, raw)
            assert {r.run_id for r in runs} == set(shared.run_ids)
            assert any(r.state in TERMINAL for r in runs)
            db.wake_queued("final")
            runs, _ = check_structure(db, raw)
            unplaceable_queue(db, raw, runs)
