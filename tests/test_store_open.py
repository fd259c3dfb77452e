"""Opening a store: creating, migrating, refusing a foreign or newer file or
a bad setting, closing; reading one: the operator's views and read-only
opening; and a batch of outcomes stored in one go."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import store
from store.engines import wal
from store.ledger import Ledger
from store.schema import HISTORY, VERSION
from tests.helpers import eventually, raw
from tests.jobs_helpers import (
    job_of,
    sqlite_pragma,
    utf8_len,
)

# -- opening ----------------------------------------------------------------


def test_open_creates_schema_version_and_wal(tmp_path: Path) -> None:
    """A new file gets the current schema version and WAL journaling, so
    readers and a writer can share it."""
    path = tmp_path / "new.sqlite3"
    with store.open(path) as db:
        assert Ledger.of(db).total_bytes() == 0
        assert db.get_job("nope", "alice") is None
    assert sqlite_pragma(path, "user_version") == VERSION
    assert sqlite_pragma(path, "journal_mode") == "wal"


def folding() -> bool:
    """Whether a store's thread that folds the log is running."""
    return any(t.name.startswith("store-wal") for t in threading.enumerate())


@pytest.mark.timeout(60)
def test_the_log_stays_small_while_a_handle_writes_on(tmp_path: Path) -> None:
    """A handle writing without pause (as a runner does) has its write-ahead
    log folded into the file as it goes, by a thread of its own rather than
    in one of its commits: the log stays a fraction of what was written."""
    path = tmp_path / "busy.sqlite3"
    result = "x" * 1000
    with store.open(path) as db:
        for n in range(300):
            Ledger.of(db).create_job(f"j{n}", "alice", [f"{n}-{k}-{result}" for k in range(100)])
        written = os.path.getsize(path)
        assert written > 30_000_000
        assert os.path.getsize(f"{path}-wal") < written / 3
        assert folding()
    assert not folding()


@pytest.mark.timeout(60)
def test_the_folding_thread_ends_when_writes_stop_and_comes_back_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handle that stopped writing (or was dropped unclosed) keeps no
    thread; the next write starts one again."""
    monkeypatch.setattr(wal, "IDLE_FOR", 0.05)
    with store.open(tmp_path / "quiet.sqlite3") as db:
        Ledger.of(db).create_job("j1", "alice", ["a"])
        assert folding()
        assert eventually(lambda: not folding())
        Ledger.of(db).create_job("j2", "alice", ["b"])
        assert folding()
    assert not folding()


def test_open_sets_up_an_empty_database_file(tmp_path: Path) -> None:
    """An existing SQLite file with no tables is brought to the current schema."""
    path = tmp_path / "old.sqlite3"
    sqlite3.connect(path).close()
    with store.open(path) as db:
        Ledger.of(db).create_job("j", "alice", ["a"])
        assert job_of(db, "j").status == "queued"
    assert sqlite_pragma(path, "user_version") == VERSION


def test_a_file_of_another_application_is_refused_untouched(tmp_path: Path) -> None:
    """A database file holding other tables and no store schema is not a
    store: refused, naming it, and left exactly as it was."""
    path = tmp_path / "theirs.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE jobs (x)")
        conn.commit()
    before = path.read_bytes()
    with pytest.raises(store.StoreError, match="not a store file: it holds other tables"):
        store.open(path)
    assert path.read_bytes() == before
    assert sqlite_pragma(path, "user_version") == 0


@pytest.mark.parametrize("version", [0, 7, 1000])
def test_a_file_another_application_numbered_is_refused_untouched(
    tmp_path: Path, version: int
) -> None:
    """Another application's database, whatever it keeps in user_version
    (it may number its own schema there), is not a store: refused as such,
    never told to upgrade, and left as it was (not switched to WAL)."""
    path = tmp_path / "theirs.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id)")
        conn.execute(f"PRAGMA user_version = {version:d}")
        conn.commit()
    before = path.read_bytes()
    for readonly in (False, True):
        with pytest.raises(store.StoreError, match="is not a store file") as info:
            store.open(path, readonly=readonly)
        assert "upgrade" not in str(info.value)
    assert path.read_bytes() == before
    assert sqlite_pragma(path, "journal_mode") == "delete"


def test_reopen_keeps_data(tmp_path: Path) -> None:
    """Data written before close is there after reopening the same file."""
    path = tmp_path / "jobs.sqlite3"
    with store.open(path) as db:
        Ledger.of(db).create_job("j1", "alice", ["a", "b"])
        Ledger.of(db).store_target("j1", 0, "done", result='"ü"')
        assert Ledger.of(db).set_job_status("j1", "running")
        before = job_of(db, "j1")
        total = Ledger.of(db).total_bytes()
    with store.open(path, synchronous="FULL") as db:
        assert job_of(db, "j1") == before
        assert Ledger.of(db).total_bytes() == total == utf8_len('"ü"')
        Ledger.of(db).store_target("j1", 1, "failed", error="boom")
        assert job_of(db, "j1").targets[1].status == "failed"
    assert sqlite_pragma(path, "user_version") == VERSION


def _store_of_version(location: str, version: int, rows: Sequence[str] = ()) -> None:
    """Write, at ``location``, a store of schema ``version`` as an older
    library left it (through its steps, not this library's open), holding
    what the statements ``rows`` insert."""
    if location.startswith("postgresql://"):
        statements = [
            "DROP SCHEMA public CASCADE",
            "CREATE SCHEMA public",
            *(statement for step in HISTORY[:version] for statement in step.postgres),
            "CREATE TABLE store_schema (version INTEGER NOT NULL)",
            f"INSERT INTO store_schema (version) VALUES ({version:d})",
            *rows,
        ]
        for statement in statements:
            raw(location, statement)
        return
    with contextlib.closing(sqlite3.connect(location)) as conn:
        conn.create_function("store_now", 0, lambda: 1.0)  # what the events' triggers read
        for step in HISTORY[:version]:
            for statement in step.sqlite:
                conn.execute(statement)
        for statement in rows:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version:d}")
        conn.commit()


@pytest.mark.parametrize("version", range(1, VERSION))
def test_an_older_store_is_brought_forward_keeping_its_data(location: str, version: int) -> None:
    """A store an older library wrote, at any version of the schema, is
    migrated on open, on either engine: its jobs and nodes are kept, and
    what the later steps add works on them."""
    # As that version's library wrote them: from step 6 on, a job with its counts.
    job = "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at"
    if version >= 6:
        job += ", ntargets, ndone, nfailed) VALUES ('j1', 'alice', 'running', 1, 1, 1, 3, 1, 1)"
    else:
        job += ") VALUES ('j1', 'alice', 'running', 1, 1, 1)"
    targets = (
        "INSERT INTO targets (job_id, pos, ref, status) VALUES"
        " ('j1', 0, 'a', 'done'), ('j1', 1, 'b', 'failed'), ('j1', 2, 'c', 'pending')"
    )
    node = "INSERT INTO nodes (id, name, caps, last_seen) VALUES ('n1', 'box', '[\"linux\"]', 1)"
    _store_of_version(location, version, [job, targets, *([node] if version >= 2 else [])])
    with store.open(location) as db:
        assert [n.node_id for n in db.list_nodes()] == (["n1"] if version >= 2 else [])
        if version < 2:
            db.advertise(store.Advert("n1", "box", {"linux"}))
        assert job_of(db, "j1").status == "running"
        (summary,) = db.list_jobs()
        assert (summary.done, summary.failed, summary.pending) == (1, 1, 1)
        with db.watch() as watch:
            Ledger.of(db).store_target("j1", 2, store.TargetState.DONE, result='"c"')
            event = watch.get(10.0)
        assert event is not None
        assert (event.kind, event.id, event.data) == (
            "target.stored",
            "j1",
            {"pos": 2, "status": "done"},
        )
        assert [t.result for t in job_of(db, "j1").targets] == [None, None, '"c"']
        run = db.submit_run([store.Step("s", "exec", {"linux"})])
        assert run.state == "RUNNING"
        db.advertise(store.Advert("n2", "gpu-box", {"gpu"}))
        assert db.submit_run([store.Step("s", "exec", {"gpu"})]).state == "RUNNING"
    if location.startswith("postgresql://"):
        assert raw(location, "SELECT version FROM store_schema") == [(VERSION,)]
    else:
        assert sqlite_pragma(Path(location), "user_version") == VERSION


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    """A file written by a newer library is not touched: the error names the
    file and tells the user to upgrade."""
    path = tmp_path / "future.sqlite3"
    store.open(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version = {VERSION + 1:d}")
        conn.commit()
    with pytest.raises(store.StoreError) as info:
        store.open(path)
    message = str(info.value)
    assert str(path) in message
    assert "upgrade" in message.lower()
    assert sqlite_pragma(path, "user_version") == VERSION + 1


def test_not_a_database_raises_store_error(tmp_path: Path) -> None:
    """Opening a file that is not a database raises StoreError naming the file,
    so callers need to catch only the store's own errors."""
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"this is definitely not an SQLite database\n" * 200)
    with pytest.raises(store.StoreError) as info:
        store.open(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("synchronous", ["OFF", "normal", "EXTRA", "", "NORMAL; DROP"])
def test_bad_synchronous_is_a_value_error(tmp_path: Path, synchronous: str) -> None:
    """Only NORMAL and FULL are accepted; anything else is refused before the
    file is created."""
    path = tmp_path / "s.sqlite3"
    with pytest.raises(ValueError, match="synchronous"):
        store.open(path, synchronous=synchronous)  # type: ignore[arg-type]
    assert not path.exists()


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_good_synchronous_opens(tmp_path: Path, synchronous: str) -> None:
    """Both durability levels open a usable store."""
    with store.open(tmp_path / "s.sqlite3", synchronous=synchronous) as db:  # type: ignore[arg-type]
        Ledger.of(db).create_job("j", "alice", ["a"])
        assert job_of(db, "j").status == "queued"


CLOSED_CALLS: dict[str, Callable[[store.Store], object]] = {
    "create_job": lambda db: Ledger.of(db).create_job("k", "alice", ["a"]),
    "get_job": lambda db: db.get_job("j", "alice"),
    "set_job_status": lambda db: Ledger.of(db).set_job_status("j", "running"),
    "store_target": lambda db: Ledger.of(db).store_target("j", 0, "done", result="1"),
    "touch_job": lambda db: db.touch_job("j", "alice"),
    "evict": lambda db: db.evict(0),
    "total_bytes": lambda db: Ledger.of(db).total_bytes(),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CALLS))
def test_closed_store_raises_store_error(tmp_path: Path, call: str) -> None:
    """Every operation on a closed store raises StoreError, never a raw sqlite3 error."""
    db = store.open(tmp_path / "c.sqlite3")
    Ledger.of(db).create_job("j", "alice", ["a"])
    db.close()
    with pytest.raises(store.StoreError, match="closed"):
        CLOSED_CALLS[call](db)


def test_close_is_idempotent(tmp_path: Path) -> None:
    """Closing twice is harmless."""
    db = store.open(tmp_path / "c.sqlite3")
    db.close()
    db.close()
    with pytest.raises(store.StoreError):
        Ledger.of(db).total_bytes()


def test_store_is_a_context_manager(tmp_path: Path) -> None:
    """``with store.open(...) as db`` yields the store and closes it on exit,
    also when the block raises."""
    path = tmp_path / "cm.sqlite3"
    with store.open(path) as db:
        assert isinstance(db, store.Store)
        assert db.path == str(path)
        Ledger.of(db).create_job("j", "alice", ["a"])
    with pytest.raises(store.StoreError):
        Ledger.of(db).total_bytes()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.open(path) as db2:
        raise Boom
    with pytest.raises(store.StoreError):
        db2.get_job("j", "alice")


def test_error_classes() -> None:
    """The store's errors share one root; NotFound is a LookupError."""
    assert issubclass(store.NotFound, store.StoreError)
    assert issubclass(store.NotFound, LookupError)
    assert issubclass(store.Conflict, store.StoreError)
    assert issubclass(store.InvalidRun, ValueError)


# -- reading a store: the operator's views and read-only opening ---------------


def test_list_jobs_counts_targets_and_filters(db: store.Store) -> None:
    Ledger.of(db).create_job("j1", "alice", ["a", "b", "c"])
    Ledger.of(db).create_job("j2", "bob", ["x"])
    Ledger.of(db).store_target("j1", 0, "done", result="1")
    Ledger.of(db).store_target("j1", 1, "failed", error="boom")
    Ledger.of(db).store_target("j2", 0, "done", result="2", job_status="done")
    summaries = db.list_jobs()
    assert [(s.id, s.owner, s.status, s.done, s.failed, s.pending) for s in summaries] == [
        ("j1", "alice", "queued", 1, 1, 1),
        ("j2", "bob", "done", 1, 0, 0),
    ]
    assert summaries[0].nbytes == utf8_len("1", "boom")
    assert [s.id for s in db.list_jobs(owner="bob")] == ["j2"]
    assert [s.id for s in db.list_jobs(status="queued")] == ["j1"]
    assert db.list_jobs(owner="carol") == []
    assert [s.id for s in db.list_jobs(ids=["j2", "nope", "j1"])] == ["j1", "j2"]
    assert [s.id for s in db.list_jobs(ids=["j1", "j2"], owner="bob")] == ["j2"]
    assert db.list_jobs(ids=[]) == []


def test_list_jobs_counts_a_job_interrupted_and_one_without_targets(db: store.Store) -> None:
    """Counts stay right through every way a target ends, and a job of no
    target is listed too."""
    Ledger.of(db).create_job("j1", "alice", ["a", "b", "c"])
    Ledger.of(db).create_job("empty", "alice", [])
    Ledger.of(db).store_target("j1", 0, "done", result="1")
    assert Ledger.of(db).interrupt_job("j1", "gone") == ("partial", 2)
    assert [(s.id, s.status, s.done, s.failed, s.pending) for s in db.list_jobs()] == [
        ("j1", "partial", 1, 2, 0),
        ("empty", "queued", 0, 0, 0),
    ]


def test_find_job_reads_any_owner(db: store.Store) -> None:
    Ledger.of(db).create_job("j1", "alice", ["a"])
    assert db.find_job("j1") == db.get_job("j1", "alice")
    assert db.find_job("nope") is None


def test_readonly_open_reads_and_refuses_writes(location: str) -> None:
    with store.open(location) as db:
        Ledger.of(db).create_job("j1", "alice", ["a"])
    with store.open(location, readonly=True) as ro:
        assert ro.find_job("j1") is not None
        with pytest.raises(store.StoreError, match="reading only"):
            Ledger.of(ro).create_job("j2", "alice", ["a"])
    with store.open(location, readonly=True) as ro:
        assert [s.id for s in ro.list_jobs()] == ["j1"]


def test_readonly_open_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "missing.sqlite3"
    with pytest.raises(store.StoreError, match="no store file"):
        store.open(path, readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_readonly_open_refuses_a_file_that_is_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite3"
    sqlite3.connect(path).close()
    path.write_bytes(b"")
    with pytest.raises(store.StoreError, match="not a store file"):
        store.open(path, readonly=True)


def test_store_targets_stores_a_batch_in_one_go_and_reports_what_it_refused(
    db: store.Store,
) -> None:
    """Outcomes of several jobs commit together; one the store cannot take
    (its job gone, its target stored already) is reported and stops none of
    the others; a job ends only if it was still live."""
    Ledger.of(db).create_job("a", "alice", ["1", "2"])
    Ledger.of(db).create_job("b", "alice", ["1"])
    Ledger.of(db).create_job("c", "alice", ["1"])
    Ledger.of(db).store_target("a", 0, "done", result="0")
    Ledger.of(db).set_job_status("c", "cancelled")
    stored = Ledger.of(db).store_targets(
        [
            store.TargetOutcome("a", 1, "done", result="11", job_status="done"),
            store.TargetOutcome("gone", 0, "done", result="x"),
            store.TargetOutcome("a", 0, "failed", error="again"),
            store.TargetOutcome("b", 0, "failed", error="e", hint="h", job_status="failed"),
            store.TargetOutcome("c", 0, "done", result="3", job_status="done"),
        ]
    )
    assert {i: type(e) for i, e in stored.refused.items()} == {
        1: store.NotFound,
        2: store.Conflict,
    }
    assert stored.ended == {0, 3}
    assert [(t.status, t.result) for t in job_of(db, "a").targets] == [
        ("done", "0"),
        ("done", "11"),
    ]
    assert (job_of(db, "a").status, job_of(db, "b").status, job_of(db, "c").status) == (
        "done",
        "failed",
        "cancelled",
    )
    assert job_of(db, "c").targets[0].result == "3"
    assert Ledger.of(db).total_bytes() == utf8_len("0", "11", "e", "h", "3")


@pytest.mark.parametrize(
    ("status", "job_status"), [("pending", None), ("done", "running"), ("done", "nope")]
)
def test_a_target_outcome_refuses_a_status_it_cannot_store(status: str, job_status: str) -> None:
    with pytest.raises(ValueError, match="ends"):
        store.TargetOutcome("a", 0, status, job_status=job_status)


def test_a_tracer_is_told_each_statement_a_call_runs(db: store.Store) -> None:
    """``Store.tracer`` sees every statement as the store writes it, with its
    parameters, on either engine; None stops it."""
    Ledger.of(db).create_job("j", "alice", ["a", "b"])
    seen: list[tuple[str, object]] = []
    db.tracer = lambda sql, params: seen.append((sql, params))
    assert db.get_job("j", "alice") is not None
    assert any("FROM jobs" in sql and "j" in list(params) for sql, params in seen), seen  # type: ignore[call-overload]
    db.tracer = None
    seen.clear()
    db.get_job("j", "alice")
    assert seen == []
    with pytest.raises(TypeError, match="callable"):
        db.tracer = "print"  # type: ignore[assignment]


def test_a_given_clock_is_the_store_s_time(location: str) -> None:
    """``store.open(clock=...)`` is what every timestamp reads, on either
    engine, in place of the host's or the server's clock; a clock that is
    not callable is refused before anything is opened."""
    now = [1_000_000.0]
    with store.open(location, clock=lambda: now[0]) as db:
        Ledger.of(db).create_job("j", "alice", ["a"])
        assert db.get_job("j", "alice").created_at == 1_000_000.0  # type: ignore[union-attr]
        now[0] += 60
        db.touch_job("j", "alice")
        assert db.get_job("j", "alice").touched_at == 1_000_060.0  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="clock"):
        store.open(location, clock=1_000_000.0)  # type: ignore[arg-type]
