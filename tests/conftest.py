"""Shared fixtures: a fresh store per test on each engine (an SQLite file;
a database of a throwaway PostgreSQL server, reached straight or through a
PgBouncer in transaction mode), a clock the test moves, and a check that no
test leaves a thread of its own running.

A test that takes ``db`` or ``location`` runs once per engine. Without a
PostgreSQL server or PgBouncer (none installed, none installable), those
runs are skipped, unless ``CI`` is set: then they fail.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis.internal.conjecture import engine as hypothesis_engine

import batch
import store
from tests import pgbouncer, pgserver
from tests.helpers import TEMPLATE, Clock, MakeRunner, as_async, fresh

#: Seconds a failing Hypothesis example may shrink (Hypothesis's own bound
#: is five minutes). The models' examples are costly (a store, a runner's
#: threads, and a failing one waits out the harness's timeout each time it
#: is replayed): a minute of shrinking keeps the report of a failure well
#: inside the test's own timeout; ``SHRINK_SECONDS=300`` shrinks longer.
SHRINK_SECONDS = int(os.environ.get("SHRINK_SECONDS", "60"))


@pytest.fixture(autouse=True, scope="session")
def shrinking_bounded() -> Iterator[None]:
    """Bound the time a failing example shrinks (see ``SHRINK_SECONDS``):
    Hypothesis has no setting for it, only this module constant."""
    if not hasattr(hypothesis_engine, "MAX_SHRINKING_SECONDS"):
        yield
        return
    before = hypothesis_engine.MAX_SHRINKING_SECONDS
    hypothesis_engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS
    try:
        yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = before


@pytest.fixture
def clock() -> Clock:
    """A clock the test moves by hand: the ``db`` fixture's store reads it
    for every timestamp; a store the test opens itself reads it when given
    ``clock=clock.time``."""
    return Clock()


#: SQLite; PostgreSQL straight; PostgreSQL through a transaction pooler
#: (a real PgBouncer in transaction mode), as it is deployed past a few hosts.
ENGINES = ("sqlite", "postgres", "pgbouncer")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgserver.Server | None]:
    """One PostgreSQL server for the whole run, or None if there is none."""
    bindir = pgserver.find_bin()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set, and no PostgreSQL server can be found or installed")
        yield None
        return
    with pgserver.running(bindir) as server:
        # Each test's database is a copy of one the store set up already.
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {TEMPLATE}")
        store.open(server.url(TEMPLATE)).close()
        yield server


@pytest.fixture(scope="session")
def pg_bouncer(pg_server: pgserver.Server | None) -> Iterator[pgbouncer.Bouncer | None]:
    """One PgBouncer in transaction mode in front of ``pg_server`` for the
    whole run, or None if there is none (nor a server)."""
    binary = None if pg_server is None else pgbouncer.find()
    if binary is None or pg_server is None:
        if pg_server is not None and os.environ.get("CI"):
            pytest.fail("CI is set, and no pgbouncer can be found or installed")
        yield None
        return
    with pgbouncer.running(binary, pg_server) as bouncer:
        yield bouncer


@pytest.fixture(params=ENGINES)
def fresh_location(
    request: pytest.FixtureRequest, tmp_path: Path, pg_server: pgserver.Server | None
) -> Callable[[], contextlib.AbstractContextManager[str]]:
    """Makes new stores on one engine, one per call (for a test that needs
    several, such as a state machine: one per example)."""
    if request.param != "sqlite" and pg_server is None:
        pytest.skip("no PostgreSQL server here")
    if request.param == "pgbouncer":
        bouncer: pgbouncer.Bouncer | None = request.getfixturevalue("pg_bouncer")
        if bouncer is None:
            pytest.skip("no pgbouncer here, and none can be installed")
        return functools.partial(_pooled, bouncer, tmp_path, pg_server)
    return functools.partial(fresh, request.param, tmp_path, pg_server)


@contextlib.contextmanager
def _pooled(
    bouncer: pgbouncer.Bouncer, root: Path, server: pgserver.Server | None
) -> Iterator[str]:
    """A new store's database, reached through the pooler."""
    with fresh("postgres", root, server) as direct:
        yield bouncer.url(direct)


@pytest.fixture
def location(
    fresh_location: Callable[[], contextlib.AbstractContextManager[str]],
) -> Iterator[str]:
    """Where a new store is, on each engine (see :func:`fresh`)."""
    with fresh_location() as where:
        yield where


@pytest.fixture
def db(location: str, request: pytest.FixtureRequest) -> Iterator[store.Store]:
    """A new store, on each engine; on the test's ``clock`` if it takes one."""
    moved: Clock | None = (
        request.getfixturevalue("clock") if "clock" in request.fixturenames else None
    )
    with store.open(location, clock=None if moved is None else moved.time) as s:
        yield s


@pytest.fixture(params=["threads", "async"])
def runner(request: pytest.FixtureRequest) -> MakeRunner:
    """Makes runners of one kind: worker threads, or an event loop running
    an ``async def`` fetch (the test's fetch, made one). A rule test that
    takes it runs on both kinds."""

    def make(
        db: store.Store,
        fetch: Any,
        hooks: batch.Hooks | None = None,
        clock: batch.clock.Clock | None = None,
        **config: Any,
    ) -> batch.Runner[Any]:
        config.setdefault("retry_wait", 0.01)
        if request.param == "async":
            fetch = as_async(fetch)
        return batch.Runner(db, fetch, batch.Config(**config), hooks, clock=clock)

    return make


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[store.Store]:
    """A new store file, for what only SQLite has (its file, its locks)."""
    with store.open(tmp_path / "jobs.sqlite3") as s:
        yield s


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread it started still running."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in left:
        t.join(timeout=5)
    alive = [t.name for t in left if t.is_alive()]
    assert not alive, f"threads left running: {alive}"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[store.Store, store.Store]]:
    """Two handles on one file: one that places runs and one (``lease_ttl=0``)
    that never does, so a queue can be built whose wake is left to the test."""
    path = tmp_path / "x.sqlite3"
    with store.open(path) as placing, store.open(path, lease_ttl=0) as holding:
        yield placing, holding
