"""What only the PostgreSQL engine has: a database to set up (or refuse),
notices between processes, the server's clock, and a server that can
restart under a running runner. (Every other rule is tested once, on both
engines, by the tests that take ``db`` or ``location``.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import batch
import batch.keeper
import store
import store.engines.postgres
from store.ledger import Ledger
from tests import pgserver
from tests.helpers import TIMEOUT, HeldOnServer, Raw, Script, eventually, fresh, raw, within

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
ALICE = batch.Caller("alice")


@pytest.fixture
def server(pg_server: pgserver.Server | None) -> pgserver.Server:
    if pg_server is None:
        pytest.skip("no PostgreSQL server here")
    return pg_server


@pytest.fixture
def url(server: pgserver.Server, tmp_path: Path) -> Iterator[str]:
    """A store on PostgreSQL, its tables set up."""
    with fresh("postgres", tmp_path, server) as where:
        yield where


# -- the database --------------------------------------------------------------


OPENER = textwrap.dedent(
    """
    import sys, store
    from store.ledger import Ledger
    with store.open(sys.argv[1]) as db:
        Ledger.of(db).create_job(sys.argv[2], "alice", ["x"])
    """
)


def test_processes_opening_one_empty_database_at_once_all_succeed(
    server: pgserver.Server,
) -> None:
    """Six processes open the same empty database at the same moment: each
    succeeds, and the schema is set up once."""
    with server.database("opened_at_once") as where:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, where, f"j{i}"],
                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                stderr=subprocess.PIPE,
            )
            for i in range(6)
        ]
        for p in procs:
            _, err = p.communicate(timeout=TIMEOUT * 3)
            assert p.returncode == 0, err.decode(errors="replace")[-2000:]
        assert raw(where, "SELECT version FROM store_schema") == [(store.schema.VERSION,)]
        assert sorted(r for (r,) in raw(where, "SELECT id FROM jobs")) == [
            f"j{i}" for i in range(6)
        ]


def test_a_schema_of_another_application_is_refused_untouched(server: pgserver.Server) -> None:
    """A database whose schema holds other tables (and no store) is refused,
    named, with what to do; nothing is created in it."""
    with server.database("theirs") as where:
        raw(where, "CREATE TABLE invoices (id int)")
        with pytest.raises(store.StoreError, match="is not a store: its schema holds other tables"):
            store.open(where)
        tables = raw(
            where,
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema()",
        )
        assert tables == [("invoices",)]
        # In a schema of its own, the store sets up beside them.
        raw(where, "CREATE SCHEMA batch")
        with store.open(where + "&options=-csearch_path%3Dbatch") as db:
            Ledger.of(db).create_job("j", "alice", ["x"])
        assert raw(where, "SELECT count(*) FROM batch.jobs") == [(1,)]


def test_readonly_open_of_an_empty_database_sets_nothing_up(server: pgserver.Server) -> None:
    """(Reading and refusing writes is tested on both engines, in
    test_store_jobs.py.)"""
    with (
        server.database("nothing_here") as where,
        pytest.raises(store.StoreError, match="holds no store"),
    ):
        store.open(where, readonly=True)


def test_no_setting_of_the_store_outlives_its_transaction(url: str) -> None:
    """Behind a transaction pooler, the server session a transaction ran on
    serves another client next: what the store sets (its timeouts; read
    only, for a read-only store) holds for that transaction alone. Here,
    the store's own sessions, looked at between transactions."""
    for readonly in (True, False):
        with store.open(url, readonly=readonly) as db:
            db.list_jobs()
            if not readonly:
                Ledger.of(db).create_job("j1", "alice", ["x"])
            pool = db._db._pool  # type: ignore[attr-defined]
            with pool.connection() as conn:
                settings = conn.execute(
                    "SELECT current_setting('lock_timeout'),"
                    " current_setting('idle_in_transaction_session_timeout'),"
                    " current_setting('default_transaction_read_only'),"
                    " current_setting('batch_store.now', true)"
                ).fetchone()
    assert settings[:3] == ("0", "0", "off")
    assert settings[3] in (None, "")  # the store's clock: its transaction's alone


def test_a_database_that_cannot_be_reached_is_named(server: pgserver.Server) -> None:
    with pytest.raises(store.StoreError, match="cannot open store") as caught:
        store.open(server.url("no_such_database"))
    assert "no_such_database" in str(caught.value)


def test_the_password_is_never_shown() -> None:
    from store.engines.postgres import _without_password  # noqa: PLC0415

    shown = _without_password("postgresql://app:s3cret@db.internal:5433/jobs?sslmode=require")
    assert shown == "postgresql://app:***@db.internal:5433/jobs?sslmode=require"
    assert "s3cret" not in shown


def test_times_come_from_the_servers_clock(url: str) -> None:
    """Every time the store writes is the server's, whatever this host's
    clock says."""
    with store.open(url) as db:
        Ledger.of(db).create_job("j", "alice", ["x"])
        ((server_now,),) = raw(url, "SELECT extract(epoch FROM clock_timestamp())::float8")
        job = db.get_job("j", "alice")
    assert job is not None
    assert server_now - 5 < job.created_at <= server_now


# -- notices ---------------------------------------------------------------------


def test_a_cancel_from_another_store_reaches_the_holder_by_notice(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job held by a runner, waiting on a busy retry, is cancelled through
    another Store (as another process would): the holder lets go of it at
    once, long before it would poll (made a minute here) or beat."""
    monkeypatch.setattr(batch.keeper, "CANCEL_POLL", 60.0)
    script = Script()

    def busy(ctx: batch.Context, n: int) -> object:
        raise batch.RetryLater("busy")

    script.on("x", busy)
    config = batch.Config(workers=1, retry_wait=30.0, retry_for=600.0, takeover_after=60.0)
    with store.open(url) as a_db, store.open(url) as b_db, batch.Runner(a_db, script, config) as a:
        job_id = a.submit(ALICE, ["x", "y"])
        assert within(TIMEOUT, lambda: a.statistics().waiting_retry == 1)
        # A notice sent before the holder's store listens is not heard (the
        # poll, made a minute here, is what covers that gap).
        assert within(TIMEOUT, lambda: a_db._db.notifies)  # type: ignore[attr-defined]
        assert b_db.cancel_job(job_id, "alice")
        assert within(2.0, lambda: a.statistics().live == 0), a.statistics()
    assert script.calls == ["x"]


def test_a_job_waiting_for_room_reaches_a_runner_with_room_by_notice(url: str) -> None:
    """Past ``max_live`` a job waits, unleased; another runner with room
    takes it at once, not at its next beat (twenty seconds off here)."""
    gate = threading.Event()

    def slow(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        assert gate.wait(TIMEOUT)
        return target.ref

    full = batch.Config(workers=1, max_live=1, takeover_after=60.0)
    roomy = batch.Config(workers=1, takeover_after=60.0, resume=batch.Caller)
    with store.open(url) as a_db, store.open(url) as b_db:
        a = batch.Runner(a_db, slow, full)
        b = batch.Runner(b_db, slow, roomy)
        try:
            assert within(TIMEOUT, lambda: b_db._db.notifies)  # type: ignore[attr-defined]
            first = a.submit(ALICE, ["1"])
            second = a.submit(ALICE, ["2"])
            assert within(2.0, lambda: b.statistics().live == 1), b.statistics()
            gate.set()
            assert a.wait(ALICE, first, TIMEOUT).status == "done"
            assert b.wait(ALICE, second, TIMEOUT).status == "done"
        finally:
            gate.set()
            a.close(TIMEOUT)
            b.close(TIMEOUT)


def test_a_subscriber_that_raises_stops_no_notice(url: str) -> None:
    got: list[str] = []
    ready = threading.Event()

    def bad(notice: str) -> None:
        raise RuntimeError("a subscriber's bug")

    def good(notice: str) -> None:
        got.append(notice)
        ready.set()

    with store.open(url) as db:
        undo_bad, undo_good = Ledger.of(db).subscribe(bad), Ledger.of(db).subscribe(good)
        try:
            assert within(TIMEOUT, lambda: _listening(url))
            Ledger.of(db).create_job("j", "alice", ["x"])
            assert db.cancel_job("j", "alice")
            assert ready.wait(TIMEOUT)
            assert within(TIMEOUT, lambda: store.CANCELLED + "j" in got), got
        finally:
            undo_bad()
            undo_good()


def _listening(url: str) -> bool:
    rows = raw(url, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'")
    return bool(rows[0][0])


# -- the server restarts -------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_restart_of_the_server_loses_nothing_and_ends_no_worker(
    url: str, server: pgserver.Server
) -> None:
    """The server restarts (every connection dropped) while a runner works:
    its workers live, every target is stored exactly once, every job ends
    done; writes that met the restart were tried again on new connections."""
    refs = [[f"j{j}-{i}" for i in range(40)] for j in range(4)]
    script = Script()
    for job in refs:
        for ref in job:
            script.on(ref, lambda ctx, n, ref=ref: ctx.wait(0.005) or {"ref": ref})
    config = batch.Config(workers=2, takeover_after=10.0)
    with store.open(url) as db, batch.Runner(db, script, config) as r:
        ids = [r.submit(ALICE, job) for job in refs]
        assert within(TIMEOUT, lambda: len(script.calls) >= 20)
        server.restart()
        jobs = [r.wait(ALICE, job_id, 60) for job_id in ids]
        assert r.statistics().workers == 2
    assert [j.status for j in jobs] == ["done"] * 4
    assert sorted(script.calls) == sorted(ref for job in refs for ref in job)
    conn = Raw(url)
    try:
        stored = conn.rows("SELECT ref, status FROM targets")
    finally:
        conn.close()
    assert sorted(stored) == sorted((ref, "done") for job in refs for ref in job)


def _store_one(db: store.Store) -> None:
    """A batch of one outcome: one round trip, its COMMIT sent with it."""
    stored = Ledger.of(db).store_targets([store.TargetOutcome("j", 0, "done", result='"v"')])
    assert stored.refused == {}


def _cancel(db: store.Store) -> None:
    """A write of statements, then its COMMIT on its own."""
    assert db.cancel_job("j", "alice")


@pytest.mark.parametrize("after", [True, False], ids=["committed", "not-committed"])
@pytest.mark.parametrize("write", [_store_one, _cancel], ids=["batch", "cancel"])
def test_a_connection_lost_at_commit_is_resolved_by_asking_the_server(
    url: str, monkeypatch: pytest.MonkeyPatch, after: bool, write: Callable[[store.Store], None]
) -> None:
    """The connection drops as a write commits (with the batch's one
    statement, or on its own): the store asks the server whether that
    transaction committed, and either returns (it did, with what the batch
    answered) or runs it again (it did not). Either way it is made once,
    and the caller never sees an error."""
    with store.open(url) as db:
        Ledger.of(db).create_job("j", "alice", ["x", "y"])
        state = {"dropped": 0}
        real = psycopg.Connection.execute

        def dropping(conn: psycopg.Connection[Any], query: Any, *args: Any, **kw: Any) -> Any:
            """The first COMMIT: made (``after``) or not, then the connection drops."""
            if state["dropped"] or "COMMIT" not in str(query):
                return real(conn, query, *args, **kw)
            state["dropped"] = 1
            if after:
                real(conn, query, *args, **kw)
            conn.close()
            raise psycopg.OperationalError("the connection dropped")

        monkeypatch.setattr(psycopg.Connection, "execute", dropping)
        write(db)
        monkeypatch.undo()
        assert state["dropped"] == 1
        job = db.get_job("j", "alice")
    assert job is not None
    if write is _cancel:
        assert job.status == "cancelled"
    else:
        assert [(t.status, t.result) for t in job.targets] == [("done", '"v"'), ("pending", None)]
        assert job.nbytes == 3
        assert db_total(url) == 3


def db_total(url: str) -> int:
    (total,) = raw(url, "SELECT sum(total) FROM job_bytes")[0]
    return int(total)


def test_a_connection_killed_inside_a_batch_stores_it_once(url: str) -> None:
    """The server ends the session of a batch half-way through its work
    (the batch waits on a row held elsewhere, its job's row locked): the
    store finds the batch did not commit, runs it again once the row is
    free, and stores each outcome once."""
    with store.open(url) as db:
        Ledger.of(db).register_runner("a", 30.0)
        Ledger.of(db).create_jobs("alice", [("j", ["x", "y"])], "a", lease_for=30.0)
        held = HeldOnServer(url, "j")
        got: list[store.Stored] = []
        outcomes = [
            store.TargetOutcome("j", pos, "done", result='"v"', lease=store.Lease("a", 1))
            for pos in (0, 1)
        ]
        writer = threading.Thread(target=lambda: got.append(Ledger.of(db).store_targets(outcomes)))
        writer.start()
        try:
            assert eventually(held.waiting)
            [(pid, _)] = held.waiters()
            assert raw(url, "SELECT pg_terminate_backend(?)", (pid,)) == [(True,)]
            # Run again, it waits on the row again, on another session.
            assert eventually(lambda: [p for p, _ in held.waiters()] not in ([], [pid]))
        finally:
            held.release()
        writer.join(TIMEOUT)
        assert got and got[0].refused == {}
        job = db.get_job("j", "alice")
    assert job is not None
    assert [t.status for t in job.targets] == ["done", "done"]
    assert job.nbytes == 6
    assert db_total(url) == 6
