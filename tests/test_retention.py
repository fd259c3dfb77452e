"""Retention by status and age (SPEC §2f): ``Store.prune`` and the
runner's ``Config(keep=...)``, beside the byte budget. Times are the
store's clock, moved by the test."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

import batch
import store
import store.jobs
import store.store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, Clock, MakeRunner, Script, eventually
from tests.jobs_helpers import TERMINAL, terminal_job

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


def ids(db: store.Store) -> list[str]:
    return [j.id for j in db.list_jobs()]


def test_prune_deletes_what_ended_longer_ago_in_the_statuses_given(
    db: store.Store, clock: Clock
) -> None:
    """By status and by the time each ended: a job of another status, one
    that ended since, and a live one stay; the bytes and counts of the
    pruned leave the totals."""
    for status in TERMINAL:
        terminal_job(db, f"old-{status}", 10, status)
    Ledger.of(db).create_job("live", "alice", ["t"])
    clock.tick(100)
    terminal_job(db, "new-done", 10, "done")
    clock.tick(50)
    assert db.prune(120, ["done", "failed"]) == 2
    assert ids(db) == ["old-partial", "old-cancelled", "live", "new-done"]
    assert Ledger.of(db).total_bytes() == 30
    assert db.gauges().jobs == {
        "queued": 1,
        "running": 0,
        "done": 1,
        "failed": 0,
        "partial": 1,
        "cancelled": 1,
    }
    assert db.prune(0) == 3
    assert ids(db) == ["live"]
    assert Ledger.of(db).total_bytes() == 0
    assert db.get_job("live", "alice") is not None


def test_prune_reads_the_jobs_of_a_status_through_the_index_of_ended_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs of a status that ended longest ago come from the index of
    ended jobs, in its order, not from a scan of every job. SQLite only:
    PostgreSQL's planner picks by the table's statistics."""
    path = tmp_path / "s.db"
    with store.open(str(path)) as db:
        for status in TERMINAL:
            terminal_job(db, f"old-{status}", 10, status)
        seen: list[tuple[str, object]] = []
        monkeypatch.setattr(db, "tracer", lambda sql, args: seen.append((sql, args)))
        assert db.prune(0, ["done"]) == 1
    picks = [(sql, args) for sql, args in seen if sql.startswith("SELECT id, nbytes FROM jobs")]
    assert picks, seen
    sql, args = picks[0]
    with contextlib.closing(sqlite3.connect(path)) as raw:
        plan = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + sql, args))
    assert "USING INDEX jobs_ended" in plan, plan
    assert "TEMP B-TREE" not in plan, plan


def test_prune_goes_in_batches_and_stops_at_its_limit(
    db: store.Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many short transactions (one per batch), the oldest first, and no
    more than ``limit`` jobs."""
    monkeypatch.setattr(store.jobs, "PRUNE_BATCH", 3)
    monkeypatch.setattr(store.store, "PRUNE_BATCH_ONE_WRITER", 3)
    monkeypatch.setattr(store.store, "PRUNE_REST", 0.0)
    for k in range(10):
        terminal_job(db, f"j{k}", 1)
        clock.tick(1)
    writes = []
    real = db._db.write
    monkeypatch.setattr(db._db, "write", lambda fn, **kw: writes.append(fn) or real(fn, **kw))
    assert db.prune(0, limit=4) == 4
    assert ids(db) == [f"j{k}" for k in range(4, 10)]
    assert len(writes) == 2
    assert db.prune(0) == 6
    assert ids(db) == []


def test_a_pruned_jobs_key_is_free_again(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        first = r.submit(ALICE, ["a"], idempotency_key="k")
        r.wait(ALICE, first, TIMEOUT)
        # A prune passes over a job another transaction holds (the runner's
        # beat, say, as its lease goes): it is pruned at a later try.
        assert eventually(lambda: db.prune(0, ["done"]) == 1)
        with pytest.raises(batch.JobNotFound):
            r.status(ALICE, first)
        assert r.submit(ALICE, ["a"], idempotency_key="k") != first


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((-1,), {}, ValueError, "older_than is a finite number of seconds >= 0, not -1"),
        (("1",), {}, TypeError, "older_than is a number of seconds, not str"),
        ((float("nan"),), {}, ValueError, "older_than is a finite number of seconds >= 0, not nan"),
        (
            (1, ["running"]),
            {},
            ValueError,
            "only jobs that ended are pruned: 'running' is not one of done, failed, partial,"
            " cancelled",
        ),
        ((1, "done"), {}, TypeError, "statuses are a list of job statuses, not str"),
        ((1,), {"limit": 1.5}, TypeError, "limit is an int or None, not float"),
    ],
)
def test_a_bad_prune_is_refused_and_deletes_nothing(
    db: store.Store, args: tuple[object, ...], kwargs: dict[str, object], error: type, message: str
) -> None:
    terminal_job(db, "j", 1)
    with pytest.raises(error) as raised:
        db.prune(*args, **kwargs)  # type: ignore[arg-type]
    assert str(raised.value) == message
    assert ids(db) == ["j"]


def test_a_runner_prunes_what_config_keep_keeps_no_longer(
    db: store.Store, clock: Clock, runner: MakeRunner
) -> None:
    """Done jobs kept a minute, failed ones an hour, the others until
    evicted: once the store's clock passed a minute, the done job goes and
    the others stay."""
    script = Script()
    script.on("bad", lambda ctx, n: (_ for _ in ()).throw(batch.TargetError("no")))
    with runner(db, script, keep={"done": 60, "failed": 3600}) as r:
        done = r.submit(ALICE, ["ok"])
        failed = r.submit(ALICE, ["bad"])
        partial = r.submit(ALICE, ["ok", "bad"])
        for job_id in (done, failed, partial):
            r.wait(ALICE, job_id, TIMEOUT)
        clock.tick(61)
        assert eventually(lambda: done not in ids(db))
        assert ids(db) == [failed, partial]
        clock.tick(3600)
        assert eventually(lambda: failed not in ids(db))
        assert ids(db) == [partial]


@pytest.mark.parametrize(
    ("keep", "error", "message"),
    [
        ([1], TypeError, "Config.keep must be a mapping, not list"),
        (
            {"running": 1},
            ValueError,
            "Config.keep keys are the statuses of ended jobs (done, failed, partial, cancelled),"
            " not 'running'",
        ),
        (
            {"done": -1},
            ValueError,
            "Config.keep['done'] must be a finite number of seconds >= 0, not -1",
        ),
        ({"done": "1h"}, TypeError, "Config.keep['done'] must be a number of seconds, not str"),
    ],
)
def test_a_bad_keep_is_refused(keep: object, error: type, message: str) -> None:
    with pytest.raises(error) as raised:
        batch.Config(keep=keep)  # type: ignore[arg-type]
    assert str(raised.value) == message
