"""Threads against one store file (or database): several ``Store`` objects
at once advertise, submit, claim, report, reap and cancel, and what is left
keeps the structural rules of ``tests/runs_model.py``."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import store
from tests.helpers import Raw
from tests.runs_model import (
    LABELS,
    MAX_NODES,
    NO_RUN,
    TERMINAL,
    TTL,
    check_structure,
    unplaceable_queue,
)

pytestmark = pytest.mark.slow


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
