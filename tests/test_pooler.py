"""PostgreSQL behind a transaction pooler (SPEC 2g): a real PgBouncer in
transaction mode in front of the tests' server. No setting, lock or LISTEN
of the store outlives a transaction; where its LISTEN cannot hear, the
store says so once and keeps its promises by reading: a wait on a job
another store's runner ends, a cancel reaching the fetch, within 0.2 s;
the pooler restarted mid-run loses nothing."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import batch
import store
from tests import pgbouncer, pgserver
from tests.helpers import TIMEOUT, eventually, fresh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ALICE = batch.Caller("alice")
#: How soon news crosses from one store to another through the pooler.
REACHES = 0.2


@pytest.fixture
def bouncer(pg_bouncer: pgbouncer.Bouncer | None) -> pgbouncer.Bouncer:
    if pg_bouncer is None:
        pytest.skip("no PostgreSQL server or pgbouncer here")
    return pg_bouncer


@pytest.fixture
def direct(pg_server: pgserver.Server, tmp_path: Path) -> Iterator[str]:
    """A new store's database, straight to the server."""
    with fresh("postgres", tmp_path, pg_server) as where:
        yield where


@pytest.fixture
def pooled(bouncer: pgbouncer.Bouncer, direct: str) -> str:
    """The same database, through the pooler."""
    return bouncer.url(direct)


def done(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    return {"ref": target.ref}


def test_nothing_fails_after_a_read_only_store_used_the_pooler(pooled: str) -> None:
    """A read-only store (``batch-runner jobs``) once left its session read
    only, and the pooler handed it to the next client: a runner's writes
    failed. Many reads, then writes through every session of the pool."""
    for _ in range(20):
        with store.open(pooled, readonly=True) as ro:
            ro.list_jobs()
    with store.open(pooled) as db, batch.Runner(db, done, batch.Config(workers=4)) as r:
        ids = r.submit_many(ALICE, [[f"{k}/{n}" for n in range(5)] for k in range(20)])
        assert all(r.wait(ALICE, job, TIMEOUT).status == "done" for job in ids)


def test_through_the_pooler_the_store_reads_for_news_and_says_so_once(
    pooled: str, direct: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its LISTEN would hear nothing: the store finds so, says it once, and
    reads instead; given ``listen`` (a direct URL) it hears."""
    caplog.set_level(logging.WARNING, logger="store")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "notices do not reach" in r.getMessage()]

    with store.open(pooled) as db:
        with db.watch(timeout=0):
            assert eventually(lambda: len(said()) == 1)
        with db.watch(timeout=0):  # a watch again: the store does not try again
            assert not db._db.notifies  # type: ignore[attr-defined]
    assert len(said()) == 1, said()
    caplog.clear()
    with store.open(pooled, listen=direct) as db, db.watch(timeout=0):
        assert eventually(lambda: db._db.notifies)  # type: ignore[attr-defined]
    assert said() == []


class Gate:
    """A fetch of a target ``c...`` waits until its context is cancelled,
    and notes when; any other returns at once."""

    def __init__(self) -> None:
        self.cancelled_at: dict[str, float] = {}

    def __call__(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        if target.ref.startswith("c") and ctx.wait(TIMEOUT):
            self.cancelled_at[target.ref] = time.monotonic()
        return {"ref": target.ref}


def test_a_wait_and_a_cancel_cross_the_pooler_within_a_fifth_of_a_second(pooled: str) -> None:
    """Two stores through the pooler, as two processes would have: a job one
    runner runs is waited for through the other (it returns soon after the
    job ends), and cancelled through the other (the fetch sees it soon)."""
    gate = Gate()
    with (
        store.open(pooled) as here,
        store.open(pooled) as there,
        batch.Runner(here, gate, batch.Config(workers=2)) as runner,
        batch.Runner(there, done) as waiter,
    ):
        # Cancels: the fetch in flight sees its context cancelled.
        for k in range(5):
            job = runner.submit(ALICE, [f"c{k}"])
            assert eventually(lambda job=job: runner.explain(ALICE, job)["state"] == "fetching")
            asked = time.monotonic()
            assert there.cancel_job(job, ALICE.id)
            assert eventually(lambda k=k: f"c{k}" in gate.cancelled_at)
            assert gate.cancelled_at[f"c{k}"] - asked <= REACHES
        # Waits: the other runner's wait returns once the job ended (as of
        # the server's clock, on this host: the commit that ended it).
        lags = []
        for k in range(10):
            job = runner.submit(ALICE, [f"w{k}"])
            assert waiter.wait(ALICE, job, TIMEOUT).status == "done"
            lags.append(time.time() - waiter.status(ALICE, job).updated_at)
    assert statistics.median(lags) <= REACHES / 2, lags
    assert max(lags) <= REACHES, lags


def test_the_pooler_restarted_mid_run_loses_nothing(
    pooled: str, bouncer: pgbouncer.Bouncer
) -> None:
    """Every client connection cut at once, the pooler back a moment later:
    every job ends done, each target stored once, no worker dies."""
    started = threading.Event()
    calls: dict[str, int] = {}
    lock = threading.Lock()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        with lock:
            calls[target.ref] = calls.get(target.ref, 0) + 1
            if len(calls) >= 50:
                started.set()
        ctx.wait(0.002)
        return {"ref": target.ref}

    config = batch.Config(workers=4, retry_wait=0.05)
    with store.open(pooled) as db, batch.Runner(db, fetch, config) as r:
        ids = r.submit_many(ALICE, [[f"{k}/{n}" for n in range(20)] for k in range(10)])
        assert started.wait(TIMEOUT)
        bouncer.restart()
        assert all(r.wait(ALICE, job, 60).status == "done" for job in ids)
        assert r.statistics().workers == 4
        stored: list[Any] = [t for job in ids for t in r.status(ALICE, job).targets]
    assert len(stored) == 200 and all(t.status == "done" for t in stored)
    assert all(n >= 1 for n in calls.values()) and len(calls) == 200


def test_a_store_closed_while_it_checks_its_listener_leaves_no_thread(pooled: str) -> None:
    """The check that notices come takes up to two seconds through a
    pooler; a store closed meanwhile stops it within a quarter second."""
    with store.open(pooled) as db, db.watch(timeout=0):
        pass
    assert eventually(
        lambda: not any(t.name == "store-listener" for t in threading.enumerate()), timeout=1.0
    )
