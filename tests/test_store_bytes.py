"""The byte total under random operations (a property), and a store shared
between threads and handles."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import store
from store.ledger import Ledger
from tests.helpers import trace
from tests.jobs_helpers import (
    JOIN_TIMEOUT,
    TERMINAL,
    job_of,
    utf8_len,
)

# -- property: byte accounting under random operations ------------------------


@dataclass
class ModelJob:
    owner: str
    ntargets: int
    live: bool = True
    stored: set[int] = field(default_factory=set)
    nbytes: int = 0


class Harness:
    """Runs operations on a store and on a model of it side by side; jobs are
    picked by index into the jobs created so far (evicted ones included)."""

    def __init__(self, db: store.Store) -> None:
        self.db = db
        self.model: dict[str, ModelJob] = {}
        self.order: list[str] = []

    def pick(self, index: int) -> str:
        return self.order[index % len(self.order)] if self.order else "never-created"

    def create(self, ntargets: int, owner: str) -> None:
        job_id = f"job-{len(self.order)}"
        Ledger.of(self.db).create_job(job_id, owner, [f"t{i}" for i in range(ntargets)])
        self.model[job_id] = ModelJob(owner, ntargets)
        self.order.append(job_id)

    def store(
        self,
        index: int,
        pos: int,
        status: str,
        outcome: tuple[str | None, str | None, str | None],
        budget: int | None,
    ) -> None:
        result, error, hint = outcome
        job_id = self.pick(index)
        job = self.model.get(job_id)
        expected: type[store.StoreError] | None = None
        if job is None:
            expected = store.NotFound
        elif pos >= job.ntargets or pos in job.stored:
            expected = store.Conflict
        if expected is not None:
            with pytest.raises(expected):
                Ledger.of(self.db).store_target(
                    job_id, pos, status, result=result, error=error, hint=hint, max_bytes=budget
                )
            return
        assert job is not None
        evicted = Ledger.of(self.db).store_target(
            job_id, pos, status, result=result, error=error, hint=hint, max_bytes=budget
        )
        job.stored.add(pos)
        job.nbytes += utf8_len(result, error, hint)
        self.apply_evicted(evicted, budget)

    def end(self, index: int, status: str) -> None:
        job_id = self.pick(index)
        live = job_id in self.model and self.model[job_id].live
        assert Ledger.of(self.db).set_job_status(job_id, status) is live
        if live and status in TERMINAL:
            self.model[job_id].live = False

    def touch(self, index: int) -> None:
        job_id = self.pick(index)
        owner = self.model[job_id].owner if job_id in self.model else "alice"
        assert self.db.touch_job(job_id, owner) is (job_id in self.model)

    def evict(self, budget: int) -> None:
        self.apply_evicted(self.db.evict(budget), budget)

    def apply_evicted(self, evicted: list[str], budget: int | None) -> None:
        if budget is None:
            assert evicted == []
            return
        for job_id in evicted:
            assert job_id in self.model, f"evicted {job_id!r} twice or unknown"
            assert not self.model[job_id].live, f"live job {job_id!r} was evicted"
            del self.model[job_id]
        total = sum(j.nbytes for j in self.model.values())
        assert total <= budget or all(j.live for j in self.model.values())

    def check(self) -> None:
        present: dict[str, store.JobRow] = {}
        for job_id in self.order:
            rows = [self.db.get_job(job_id, owner) for owner in ("alice", "bob")]
            found = [row for row in rows if row is not None]
            assert len(found) <= 1
            if found:
                present[job_id] = found[0]
        assert set(present) == set(self.model)
        for job_id, row in present.items():
            job = self.model[job_id]
            assert row.owner == job.owner
            assert row.nbytes == job.nbytes
            assert (row.status in ("queued", "running")) is job.live
            assert {t.pos for t in row.targets if t.status != "pending"} == job.stored
        assert Ledger.of(self.db).total_bytes() == sum(row.nbytes for row in present.values())
        # The counts kept with each job agree with its targets.
        for summary in self.db.list_jobs(ids=list(present)):
            row = present[summary.id]
            statuses = [t.status for t in row.targets]
            assert (summary.done, summary.failed, summary.pending, summary.nbytes) == (
                statuses.count("done"),
                statuses.count("failed"),
                statuses.count("pending"),
                row.nbytes,
            )


texts = st.none() | st.text(st.characters(codec="utf-8"), max_size=12)
indexes = st.integers(0, 20)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 3), st.sampled_from(["alice", "bob"])),
        st.tuples(
            st.just("store"),
            indexes,
            st.integers(0, 3),
            st.sampled_from(["done", "failed"]),
            st.tuples(texts, texts, texts),
            st.none() | st.integers(0, 80),
        ),
        st.tuples(st.just("end"), indexes, st.sampled_from(["running", *TERMINAL])),
        st.tuples(st.just("touch"), indexes),
        st.tuples(st.just("evict"), st.integers(0, 80)),
    ),
    max_size=40,
)


@settings(max_examples=50, deadline=None)
@given(ops=operations)
def test_bytes_and_eviction_property(ops: list[tuple[Any, ...]]) -> None:
    """Whatever the sequence of operations, total_bytes equals the sum of the
    sizes of the jobs still stored, each job's size is the UTF-8 length of
    what was stored for it, and no live job is ever evicted."""
    with tempfile.TemporaryDirectory() as tmp, store.open(Path(tmp) / "p.sqlite3") as db:
        harness = Harness(db)
        for kind, *args in ops:
            getattr(harness, kind)(*args)
            harness.check()


# -- concurrency --------------------------------------------------------------


def run_threads(target: Callable[[int], None], n: int) -> None:
    """Run ``target(i)`` in ``n`` threads started together; re-raise the first error."""
    barrier = threading.Barrier(n, timeout=JOIN_TIMEOUT)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), name=f"worker-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT)
    assert not [t.name for t in threads if t.is_alive()], "threads did not finish"
    if errors:
        raise errors[0]


def test_threads_share_one_store(db: store.Store) -> None:
    """Eight threads creating jobs and storing targets through one Store lose
    nothing: every job is there, every target stored, and the total is right."""
    nthreads, njobs, ntargets = 8, 10, 4

    def work(i: int) -> None:
        owner = f"owner-{i}"
        for j in range(njobs):
            job_id = f"t{i}-j{j}"
            Ledger.of(db).create_job(job_id, owner, [f"r{k}" for k in range(ntargets)])
            assert Ledger.of(db).set_job_status(job_id, "running")
            for k in range(ntargets):
                Ledger.of(db).store_target(job_id, k, "done", result=f'"é{i}-{j}-{k}"')
            assert db.touch_job(job_id, owner)
            assert Ledger.of(db).set_job_status(job_id, "done")

    run_threads(work, nthreads)

    expected_total = 0
    for i in range(nthreads):
        for j in range(njobs):
            job = job_of(db, f"t{i}-j{j}", f"owner-{i}")
            assert job.status == "done"
            assert [t.status for t in job.targets] == ["done"] * ntargets
            assert [t.result for t in job.targets] == [f'"é{i}-{j}-{k}"' for k in range(ntargets)]
            assert job.nbytes == sum(utf8_len(t.result) for t in job.targets)
            expected_total += job.nbytes
    assert Ledger.of(db).total_bytes() == expected_total


def test_threads_store_targets_of_one_job(db: store.Store) -> None:
    """Threads storing different targets of the same job all land, and racing
    on the same target lets exactly one win."""
    nthreads = 8
    Ledger.of(db).create_job("shared", "alice", [f"r{k}" for k in range(nthreads)] + ["contested"])
    wins: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        Ledger.of(db).store_target("shared", i, "done", result="ü" * (i + 1))
        try:
            Ledger.of(db).store_target("shared", nthreads, "done", result=f"winner {i}")
        except store.Conflict:
            return
        with lock:
            wins.append(i)

    run_threads(work, nthreads)
    assert len(wins) == 1
    job = job_of(db, "shared")
    assert all(t.status == "done" for t in job.targets)
    assert job.targets[-1].result == f"winner {wins[0]}"
    expected = sum(2 * (i + 1) for i in range(nthreads)) + utf8_len(f"winner {wins[0]}")
    assert job.nbytes == Ledger.of(db).total_bytes() == expected


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    """Two Store objects on the same file both write, and each sees the
    other's jobs, targets and byte total."""
    path = tmp_path / "shared.sqlite3"
    with store.open(path) as first, store.open(path) as second:
        Ledger.of(first).create_job("from-first", "alice", ["a"])
        Ledger.of(second).create_job("from-second", "bob", ["b"])
        Ledger.of(second).store_target("from-first", 0, "done", result="ñ")
        Ledger.of(first).store_target("from-second", 0, "failed", error="boom")
        assert Ledger.of(first).set_job_status("from-second", "failed")
        assert Ledger.of(second).set_job_status("from-second", "done") is False
        for db in (first, second):
            a = job_of(db, "from-first", "alice")
            b = job_of(db, "from-second", "bob")
            assert a.targets[0].result == "ñ"
            assert (b.status, b.targets[0].error) == ("failed", "boom")
            assert Ledger.of(db).total_bytes() == 6
        assert second.evict(0) == ["from-second"]
        assert first.get_job("from-second", "bob") is None
        assert Ledger.of(first).total_bytes() == 2


def test_two_stores_write_concurrently(tmp_path: Path) -> None:
    """Two Store objects on one file, written from threads at the same time,
    end with every job and target of both and the right total."""
    path = tmp_path / "shared.sqlite3"
    njobs, ntargets = 15, 3
    with store.open(path) as first, store.open(path) as second:
        stores = (first, second)

        def work(i: int) -> None:
            db = stores[i % 2]
            for j in range(njobs):
                job_id = f"s{i}-j{j}"
                Ledger.of(db).create_job(job_id, f"o{i}", [f"r{k}" for k in range(ntargets)])
                for k in range(ntargets):
                    Ledger.of(db).store_target(job_id, k, "done", result="→" * (k + 1))

        run_threads(work, 4)
        per_job = sum(3 * (k + 1) for k in range(ntargets))
        for db in stores:
            for i in range(4):
                for j in range(njobs):
                    job = job_of(db, f"s{i}-j{j}", f"o{i}")
                    assert [t.status for t in job.targets] == ["done"] * ntargets
                    assert job.nbytes == per_job
            assert Ledger.of(db).total_bytes() == 4 * njobs * per_job


# -- eviction's plan ----------------------------------------------------------


def test_eviction_reads_the_ended_jobs_in_its_own_order(tmp_path: Path, monkeypatch: Any) -> None:
    """The least recently touched ended job comes from the index kept in
    eviction's order, without sorting every ended job: the index of ended
    jobs by status (for retention) must not win SQLite's plan, which it
    does by SQLite's rules of thumb (a store of 100,000 ended jobs took
    17 ms an eviction instead of 35 us). SQLite only: PostgreSQL's planner
    decides by the table's statistics, and evicts in a function of its own."""
    path = tmp_path / "s.db"
    with store.open(str(path)) as db:
        ids = [f"job-{i}" for i in range(3)]
        Ledger.of(db).create_jobs("alice", [(job_id, ["a"]) for job_id in ids])
        Ledger.of(db).store_targets(
            [
                store.TargetOutcome(
                    job_id, 0, store.TargetState.DONE, result='"x"', job_status=store.JobStatus.DONE
                )
                for job_id in ids
            ]
        )
        seen = trace(db, monkeypatch)
        assert db.evict(0) == ids
    picks = [s.split(" ()")[0] for s in seen if s.startswith("SELECT id, nbytes FROM jobs")]
    assert picks, seen
    with contextlib.closing(sqlite3.connect(path)) as raw:
        plan = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + picks[0]))
    assert "USING INDEX jobs_evictable" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
