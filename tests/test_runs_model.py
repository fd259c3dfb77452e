"""Runs, nodes, leases and the queue against a plain-Python model.

A Hypothesis state machine drives a real store, on each engine, through advertise, drain,
submit, claim, report, heartbeat, reap, cancel, wake and the passing of time
(the store's clock, stepped), and checks after every step that the store
agrees with a model that places runs with the library's own pure matcher,
scanning the QUEUED runs in submit order; with ``reserve_after`` set, a run
that has waited that long reserves the nodes it could use. A second handle
opened with ``lease_ttl=0`` frees capacity without promoting anything, so an
explicit ``wake_queued`` has real work to do.
The model is ``tests/runs_model.py``; ``tests/test_runs_threads.py`` hammers
one store from several threads and checks the same structural rules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
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
from store.runs.match import place
from tests.helpers import EXAMPLES, Clock, Raw, examples
from tests.runs_model import (
    FAR,
    LABELS,
    LAYOUT,
    MAX_NODES,
    NAMES,
    NO_RUN,
    NODES,
    RESERVE,
    TERMINAL,
    TTL,
    MNode,
    Model,
    MRun,
    MStep,
    check_structure,
    read_caps,
    read_leases,
)

pytestmark = pytest.mark.slow


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
            self.db = self.stack.enter_context(
                store.open(where, lease_ttl=TTL, clock=self.clock.time, **settings)
            )
            # lease_ttl=0: a handle whose events wake the queue but can promote nothing.
            self.quiet = self.stack.enter_context(
                store.open(where, lease_ttl=0, clock=self.clock.time, **settings)
            )
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
    max_examples=examples(160),
    stateful_step_count=60,
    deadline=None,
    # Tracing a failing machine line by line takes longer than the test may.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


@pytest.mark.timeout(120 * max(1.0, EXAMPLES))
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
        mock.patch.multiple(
            RunQueueMachine,
            fresh=fresh_location,
            clock=Clock(),
            reserve_after=reserve_after,
            create=True,
        ),
    ):
        run_state_machine_as_test(
            RunQueueMachine, settings=settings(SETTINGS, max_examples=examples)
        )
