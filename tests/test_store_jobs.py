"""The SQLite store's batch-job operations: opening a file, jobs and targets,
byte accounting, eviction, and sharing a store between threads and handles."""

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
from store.schema import MIGRATIONS, VERSION
from tests.helpers import Clock, raw

JOIN_TIMEOUT = 30.0

TERMINAL = ("done", "failed", "partial", "cancelled")


def utf8_len(*texts: str | None) -> int:
    return sum(len(t.encode("utf-8")) for t in texts if t is not None)


def sqlite_pragma(path: Path, name: str) -> object:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (value,) = conn.execute(f"PRAGMA {name}").fetchone()
    return value


def job_of(db: store.Store, job_id: str, owner: str = "alice") -> store.JobRow:
    job = db.get_job(job_id, owner)
    assert job is not None, f"job {job_id!r} is gone"
    return job


def terminal_job(db: store.Store, job_id: str, nbytes: int, status: str = "done") -> None:
    """A job of exactly ``nbytes`` stored bytes (ASCII result), ended ``status``."""
    db.create_job(job_id, "alice", ["t"])
    db.store_target(job_id, 0, "done", result="x" * nbytes)
    assert db.set_job_status(job_id, status)


# -- opening ----------------------------------------------------------------


def test_open_creates_schema_version_and_wal(tmp_path: Path) -> None:
    """A new file gets the current schema version and WAL journaling, so
    readers and a writer can share it."""
    path = tmp_path / "new.sqlite3"
    with store.open(path) as db:
        assert db.total_bytes() == 0
        assert db.get_job("nope", "alice") is None
    assert sqlite_pragma(path, "user_version") == VERSION
    assert sqlite_pragma(path, "journal_mode") == "wal"


def test_open_sets_up_an_empty_database_file(tmp_path: Path) -> None:
    """An existing SQLite file with no tables is brought to the current schema."""
    path = tmp_path / "old.sqlite3"
    sqlite3.connect(path).close()
    with store.open(path) as db:
        db.create_job("j", "alice", ["a"])
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
        db.create_job("j1", "alice", ["a", "b"])
        db.store_target("j1", 0, "done", result='"ü"')
        assert db.set_job_status("j1", "running")
        before = job_of(db, "j1")
        total = db.total_bytes()
    with store.open(path, synchronous="FULL") as db:
        assert job_of(db, "j1") == before
        assert db.total_bytes() == total == utf8_len('"ü"')
        db.store_target("j1", 1, "failed", error="boom")
        assert job_of(db, "j1").targets[1].status == "failed"
    assert sqlite_pragma(path, "user_version") == VERSION


def _store_of_version(location: str, version: int) -> None:
    """Write, at ``location``, an empty store of schema ``version``, as an
    older library left it (through its steps, not this library's open)."""
    if location.startswith("postgresql://"):
        from store import postgres  # noqa: PLC0415 (the PostgreSQL half only)

        assert version == postgres.SCHEMA_VERSION
        statements = [
            *postgres.SCHEMA,
            "CREATE TABLE store_schema (version INTEGER NOT NULL)",
            f"INSERT INTO store_schema (version) VALUES ({version:d})",
        ]
        for statement in ("DROP SCHEMA public CASCADE", "CREATE SCHEMA public", *statements):
            raw(location, statement)
        return
    with contextlib.closing(sqlite3.connect(location)) as conn:
        for step in MIGRATIONS[:version]:
            for statement in step:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version:d}")
        conn.commit()


def test_an_older_store_is_brought_forward_keeping_its_data(location: str) -> None:
    """A store an older library wrote (schema version 4) is migrated on open,
    on either engine: its jobs and nodes are kept, and what the new steps
    add works on them."""
    _store_of_version(location, 4)
    raw(
        location,
        "INSERT INTO nodes (id, name, caps, last_seen) VALUES ('n1', 'box', '[\"linux\"]', 1)",
    )
    raw(
        location,
        "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at)"
        " VALUES ('j1', 'alice', 'running', 1, 1, 1)",
    )
    raw(
        location,
        "INSERT INTO targets (job_id, pos, ref, status) VALUES"
        " ('j1', 0, 'a', 'done'), ('j1', 1, 'b', 'failed'), ('j1', 2, 'c', 'pending')",
    )
    with store.open(location) as db:
        assert [n.node_id for n in db.list_nodes()] == ["n1"]
        assert job_of(db, "j1").status == "running"
        (summary,) = db.list_jobs()
        assert (summary.done, summary.failed, summary.pending) == (1, 1, 1)
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
        db.create_job("j", "alice", ["a"])
        assert job_of(db, "j").status == "queued"


CLOSED_CALLS: dict[str, Callable[[store.Store], object]] = {
    "create_job": lambda db: db.create_job("k", "alice", ["a"]),
    "get_job": lambda db: db.get_job("j", "alice"),
    "set_job_status": lambda db: db.set_job_status("j", "running"),
    "store_target": lambda db: db.store_target("j", 0, "done", result="1"),
    "touch_job": lambda db: db.touch_job("j", "alice"),
    "evict": lambda db: db.evict(0),
    "total_bytes": lambda db: db.total_bytes(),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CALLS))
def test_closed_store_raises_store_error(tmp_path: Path, call: str) -> None:
    """Every operation on a closed store raises StoreError, never a raw sqlite3 error."""
    db = store.open(tmp_path / "c.sqlite3")
    db.create_job("j", "alice", ["a"])
    db.close()
    with pytest.raises(store.StoreError, match="closed"):
        CLOSED_CALLS[call](db)


def test_close_is_idempotent(tmp_path: Path) -> None:
    """Closing twice is harmless."""
    db = store.open(tmp_path / "c.sqlite3")
    db.close()
    db.close()
    with pytest.raises(store.StoreError):
        db.total_bytes()


def test_store_is_a_context_manager(tmp_path: Path) -> None:
    """``with store.open(...) as db`` yields the store and closes it on exit,
    also when the block raises."""
    path = tmp_path / "cm.sqlite3"
    with store.open(path) as db:
        assert isinstance(db, store.Store)
        assert db.path == str(path)
        db.create_job("j", "alice", ["a"])
    with pytest.raises(store.StoreError):
        db.total_bytes()

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


# -- jobs and targets -------------------------------------------------------


def test_create_job_is_queued_with_pending_targets_in_order(db: store.Store) -> None:
    """A new job is queued, its targets pending, in the order given."""
    refs = ["zeta", "alpha", "mü", "alpha", ""]
    db.create_job("j1", "alice", refs)
    job = job_of(db, "j1")
    assert job.id == "j1"
    assert job.owner == "alice"
    assert job.status == "queued"
    assert job.nbytes == 0
    assert job.created_at == job.updated_at == job.touched_at
    assert [t.pos for t in job.targets] == list(range(len(refs)))
    assert [t.ref for t in job.targets] == refs
    for t in job.targets:
        assert (t.status, t.result, t.error, t.hint) == ("pending", None, None, None)


def test_create_job_without_targets(db: store.Store) -> None:
    """A job with no targets is stored with an empty target list."""
    db.create_job("empty", "alice", [])
    assert job_of(db, "empty").targets == ()


def test_duplicate_job_id_is_refused_and_keeps_the_first(db: store.Store) -> None:
    """Creating a job under an existing id raises StoreError and leaves the
    existing job exactly as it was."""
    db.create_job("j1", "alice", ["a"])
    db.store_target("j1", 0, "done", result="1")
    before = job_of(db, "j1")
    with pytest.raises(store.StoreError):
        db.create_job("j1", "bob", ["x", "y"])
    assert job_of(db, "j1") == before
    assert db.get_job("j1", "bob") is None
    assert db.total_bytes() == 1


def test_foreign_job_reads_like_unknown(db: store.Store) -> None:
    """Another owner's job is indistinguishable from a missing one."""
    db.create_job("j1", "alice", ["a"])
    assert db.get_job("j1", "bob") is None
    assert db.get_job("j1", "bob") == db.get_job("nope", "bob")
    assert db.get_job("j1", "") is None
    assert job_of(db, "j1").owner == "alice"


def test_touch_job_owner_check(db: store.Store, clock: Clock) -> None:
    """touch_job returns True for the owner's job and False for a foreign or
    unknown one, which it leaves untouched."""
    db.create_job("j1", "alice", ["a"])
    created = job_of(db, "j1").touched_at
    clock.tick()
    assert db.touch_job("j1", "bob") is False
    assert db.touch_job("nope", "alice") is False
    assert job_of(db, "j1").touched_at == created
    assert db.touch_job("j1", "alice") is True
    assert job_of(db, "j1").touched_at == clock.now


def test_set_job_status_lifecycle(db: store.Store, clock: Clock) -> None:
    """queued -> running -> done, each move reported True and stamped."""
    db.create_job("j1", "alice", ["a"])
    clock.tick()
    assert db.set_job_status("j1", "running") is True
    job = job_of(db, "j1")
    assert job.status == "running"
    assert job.updated_at == clock.now
    clock.tick()
    assert db.set_job_status("j1", "done") is True
    job = job_of(db, "j1")
    assert job.status == "done"
    assert job.updated_at == job.touched_at == clock.now


@pytest.mark.parametrize("final", TERMINAL)
@pytest.mark.parametrize("late", ["queued", "running", *TERMINAL])
def test_terminal_status_is_final(db: store.Store, clock: Clock, final: str, late: str) -> None:
    """Once a job is terminal no later status overwrites it: the call returns
    False and the job is unchanged."""
    db.create_job("j1", "alice", ["a"])
    assert db.set_job_status("j1", "running")
    assert db.set_job_status("j1", final)
    before = job_of(db, "j1")
    clock.tick()
    assert db.set_job_status("j1", late) is False
    assert job_of(db, "j1") == before


def test_set_job_status_unknown_job(db: store.Store) -> None:
    """Moving a job that does not exist returns False."""
    assert db.set_job_status("nope", "running") is False
    assert db.set_job_status("nope", "done") is False


@pytest.mark.parametrize("status", ["", "DONE", "pending", "evicted", "Running"])
def test_set_job_status_unknown_status(db: store.Store, status: str) -> None:
    """An unknown status is a ValueError and changes nothing."""
    db.create_job("j1", "alice", ["a"])
    before = job_of(db, "j1")
    with pytest.raises(ValueError, match="status"):
        db.set_job_status("j1", status)
    assert job_of(db, "j1") == before


def test_store_target_stores_outcome_and_counts_utf8_bytes(db: store.Store) -> None:
    """A stored target keeps result, error and hint; the job's size is the UTF-8
    length of all three, and total_bytes agrees."""
    db.create_job("j1", "alice", ["a", "b", "c"])
    result = '{"text": "naïve café — 日本語 🎉"}'
    error = "fehlgeschlagen: Größe"
    hint = "再試行してください"
    assert db.store_target("j1", 0, "done", result=result) == []
    assert db.store_target("j1", 2, "failed", error=error, hint=hint) == []
    job = job_of(db, "j1")
    t0, t1, t2 = job.targets
    assert (t0.status, t0.result, t0.error, t0.hint) == ("done", result, None, None)
    assert (t1.status, t1.result, t1.error, t1.hint) == ("pending", None, None, None)
    assert (t2.status, t2.result, t2.error, t2.hint) == ("failed", None, error, hint)
    expected = utf8_len(result, error, hint)
    assert expected > len(result) + len(error) + len(hint)
    assert job.nbytes == expected
    assert db.total_bytes() == expected


def test_total_bytes_sums_every_job(db: store.Store) -> None:
    """total_bytes is the sum over all jobs, live and terminal."""
    db.create_job("j1", "alice", ["a"])
    db.create_job("j2", "bob", ["a", "b"])
    db.store_target("j1", 0, "done", result="ééé")
    db.store_target("j2", 0, "failed", error="ñ", hint="h")
    db.store_target("j2", 1, "done", result="")
    assert db.set_job_status("j1", "done")
    assert job_of(db, "j1").nbytes == 6
    assert job_of(db, "j2", "bob").nbytes == 3
    assert db.total_bytes() == 9


def test_store_target_twice_is_a_conflict(db: store.Store) -> None:
    """Storing an already stored target raises Conflict and writes nothing."""
    db.create_job("j1", "alice", ["a"])
    db.store_target("j1", 0, "done", result='"first"')
    before = job_of(db, "j1")
    total = db.total_bytes()
    for status in ("done", "failed"):
        with pytest.raises(store.Conflict):
            db.store_target("j1", 0, status, result='"second, longer"', error="e", hint="h")
    assert job_of(db, "j1") == before
    assert db.total_bytes() == total


def test_store_target_out_of_range_is_a_conflict(db: store.Store) -> None:
    """A position the job does not have is refused with Conflict, changing nothing."""
    db.create_job("j1", "alice", ["a"])
    before = job_of(db, "j1")
    with pytest.raises(store.Conflict):
        db.store_target("j1", 5, "done", result="1")
    assert job_of(db, "j1") == before
    assert db.total_bytes() == 0


def test_store_target_missing_job_is_not_found(db: store.Store) -> None:
    """Storing for a job that does not exist (or was evicted) raises NotFound."""
    with pytest.raises(store.NotFound):
        db.store_target("nope", 0, "done", result="1")
    terminal_job(db, "gone", 4)
    assert db.evict(0) == ["gone"]
    with pytest.raises(store.NotFound):
        db.store_target("gone", 0, "done", result="1")
    assert db.total_bytes() == 0


@pytest.mark.parametrize("status", ["pending", "", "DONE", "cancelled", "partial"])
def test_store_target_bad_status(db: store.Store, status: str) -> None:
    """A target can only end done or failed; anything else is a ValueError
    and writes nothing."""
    db.create_job("j1", "alice", ["a"])
    with pytest.raises(ValueError, match=repr(status)):
        db.store_target("j1", 0, status, result="1")
    assert job_of(db, "j1").targets[0].status == "pending"
    assert db.total_bytes() == 0


def test_store_target_on_terminal_job_is_kept(db: store.Store) -> None:
    """A result that lands after the job ended (a fetch in flight at cancel)
    is stored and counted; the job stays terminal."""
    db.create_job("j1", "alice", ["a", "b"])
    assert db.set_job_status("j1", "cancelled")
    db.store_target("j1", 0, "done", result="ok")
    job = job_of(db, "j1")
    assert job.status == "cancelled"
    assert job.targets[0].result == "ok"
    assert job.nbytes == db.total_bytes() == 2


# -- eviction ---------------------------------------------------------------


def test_evict_under_budget_does_nothing(db: store.Store) -> None:
    """Within budget no job is evicted, terminal or not."""
    terminal_job(db, "a", 5)
    terminal_job(db, "b", 5)
    assert db.evict(10) == []
    assert db.evict(1 << 40) == []
    assert db.total_bytes() == 10
    job_of(db, "a")
    job_of(db, "b")


def test_evict_least_recently_touched_first(db: store.Store, clock: Clock) -> None:
    """Eviction takes the terminal job touched longest ago first; ending a job
    touches it, so it is the end time that counts, not the creation time."""
    for name in ("a", "b", "c"):
        db.create_job(name, "alice", ["t"])
        db.store_target(name, 0, "done", result="x" * 10)
        clock.tick()
    for name in ("c", "a", "b"):
        assert db.set_job_status(name, "done")
        clock.tick()
    assert db.total_bytes() == 30
    assert db.evict(15) == ["c", "a"]
    assert db.total_bytes() == 10
    assert db.get_job("c", "alice") is None
    assert db.get_job("a", "alice") is None
    job_of(db, "b")


def test_evict_ties_broken_by_creation_order(db: store.Store, clock: Clock) -> None:
    """With equal touch times, the job created first goes first, whatever
    order the jobs ended in or their ids sort in."""
    names = ["m", "z", "a", "q"]
    for name in names:
        db.create_job(name, "alice", ["t"])
        db.store_target(name, 0, "done", result="x" * 3)
    for name in reversed(names):
        assert db.set_job_status(name, "failed")
    assert len({job_of(db, n).touched_at for n in names}) == 1
    assert db.evict(0) == names
    assert db.total_bytes() == 0


def test_touch_moves_job_to_the_back(db: store.Store, clock: Clock) -> None:
    """touch_job makes a job the last candidate for eviction."""
    for name in ("a", "b", "c"):
        terminal_job(db, name, 10)
    clock.tick()
    assert db.touch_job("a", "alice")
    assert db.evict(10) == ["b", "c"]
    job_of(db, "a")
    clock.tick()
    terminal_job(db, "d", 10)
    clock.tick()
    assert db.touch_job("a", "alice")
    assert db.evict(0) == ["d", "a"]


def test_an_outcome_a_runner_stores_makes_its_job_running(db: store.Store) -> None:
    """A runner's outcome (stored under its lease) of a queued job makes the
    job running in the same commit, whether or not a write naming it
    starting has landed: a job with a target stored by its runner is never
    seen queued."""
    db.register_runner("r", 30.0)
    db.create_jobs("alice", [("j", ["a", "b"])], "r", lease_for=30.0)
    lease = store.Lease("r", 1)
    stored = db.store_targets([store.TargetOutcome("j", 0, "done", result="1", lease=lease)])
    assert stored.refused == {}
    assert job_of(db, "j").status == "running"


def test_live_jobs_are_never_evicted(db: store.Store) -> None:
    """Queued and running jobs stay, even when they alone exceed the budget;
    only terminal jobs go, and eviction stops when none is left."""
    db.create_job("queued", "alice", ["t"])
    db.store_target("queued", 0, "done", result="q" * 50)
    db.create_job("running", "alice", ["t"])
    db.store_target("running", 0, "failed", error="r" * 50)
    assert db.set_job_status("running", "running")
    terminal_job(db, "old", 7)
    assert db.total_bytes() == 107
    assert db.evict(10) == ["old"]
    assert db.total_bytes() == 100
    assert db.evict(0) == []
    assert db.total_bytes() == 100
    assert job_of(db, "queued").status == "queued"
    assert job_of(db, "running").status == "running"


@pytest.mark.parametrize("status", TERMINAL)
def test_every_terminal_status_is_evictable(db: store.Store, status: str) -> None:
    """done, failed, partial and cancelled jobs are all evictable."""
    terminal_job(db, "j", 3, status=status)
    assert db.evict(0) == ["j"]
    assert db.get_job("j", "alice") is None


def test_evict_drops_total_by_exactly_the_evicted_bytes(db: store.Store, clock: Clock) -> None:
    """total_bytes falls by exactly the sizes of the evicted jobs (UTF-8 bytes,
    not characters) and eviction stops as soon as the total is within budget."""
    sizes = {"a": "ä" * 5, "b": "🎉" * 2, "c": "c" * 4, "d": "日" * 3}
    for name, text in sizes.items():
        db.create_job(name, "alice", ["t"])
        db.store_target(name, 0, "done", result=text)
        assert db.set_job_status(name, "done")
        clock.tick()
    nbytes = {name: job_of(db, name).nbytes for name in sizes}
    assert nbytes == {"a": 10, "b": 8, "c": 4, "d": 9}
    total = db.total_bytes()
    assert total == 31
    evicted = db.evict(total - 11)
    assert evicted == ["a", "b"]
    assert db.total_bytes() == total - nbytes["a"] - nbytes["b"]
    assert db.evict(db.total_bytes() - 1) == ["c"]
    assert db.total_bytes() == nbytes["d"]


def test_store_target_evicts_past_max_bytes(db: store.Store, clock: Clock) -> None:
    """store_target(max_bytes=...) evicts terminal jobs past the budget in the
    same call and returns their ids in eviction order; the live job the
    target belongs to stays."""
    terminal_job(db, "old1", 10)
    clock.tick()
    terminal_job(db, "old2", 10)
    clock.tick()
    terminal_job(db, "old3", 10)
    clock.tick()
    db.create_job("live", "alice", ["a", "b"])
    assert db.store_target("live", 0, "done", result="x" * 5, max_bytes=100) == []
    assert db.total_bytes() == 35
    assert db.store_target("live", 1, "done", result="y" * 10, max_bytes=25) == ["old1", "old2"]
    assert db.total_bytes() == 25
    job_of(db, "old3")
    live = job_of(db, "live")
    assert live.nbytes == 15
    assert [t.status for t in live.targets] == ["done", "done"]


def test_store_target_max_bytes_never_evicts_live(db: store.Store) -> None:
    """A live job larger than the whole budget is kept; store_target evicts nothing."""
    db.create_job("big", "alice", ["a", "b"])
    assert db.store_target("big", 0, "done", result="x" * 100, max_bytes=10) == []
    assert db.store_target("big", 1, "failed", error="y" * 100, max_bytes=0) == []
    assert job_of(db, "big").nbytes == db.total_bytes() == 200


def test_failed_store_target_evicts_nothing(db: store.Store) -> None:
    """A store_target that fails (Conflict) does not run eviction either."""
    terminal_job(db, "old", 10)
    db.create_job("live", "alice", ["a"])
    db.store_target("live", 0, "done", result="1")
    with pytest.raises(store.Conflict):
        db.store_target("live", 0, "done", result="1", max_bytes=0)
    job_of(db, "old")
    assert db.total_bytes() == 11


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
        self.db.create_job(job_id, owner, [f"t{i}" for i in range(ntargets)])
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
                self.db.store_target(
                    job_id, pos, status, result=result, error=error, hint=hint, max_bytes=budget
                )
            return
        assert job is not None
        evicted = self.db.store_target(
            job_id, pos, status, result=result, error=error, hint=hint, max_bytes=budget
        )
        job.stored.add(pos)
        job.nbytes += utf8_len(result, error, hint)
        self.apply_evicted(evicted, budget)

    def end(self, index: int, status: str) -> None:
        job_id = self.pick(index)
        live = job_id in self.model and self.model[job_id].live
        assert self.db.set_job_status(job_id, status) is live
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
        assert self.db.total_bytes() == sum(row.nbytes for row in present.values())
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
            db.create_job(job_id, owner, [f"r{k}" for k in range(ntargets)])
            assert db.set_job_status(job_id, "running")
            for k in range(ntargets):
                db.store_target(job_id, k, "done", result=f'"é{i}-{j}-{k}"')
            assert db.touch_job(job_id, owner)
            assert db.set_job_status(job_id, "done")

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
    assert db.total_bytes() == expected_total


def test_threads_store_targets_of_one_job(db: store.Store) -> None:
    """Threads storing different targets of the same job all land, and racing
    on the same target lets exactly one win."""
    nthreads = 8
    db.create_job("shared", "alice", [f"r{k}" for k in range(nthreads)] + ["contested"])
    wins: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        db.store_target("shared", i, "done", result="ü" * (i + 1))
        try:
            db.store_target("shared", nthreads, "done", result=f"winner {i}")
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
    assert job.nbytes == db.total_bytes() == expected


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    """Two Store objects on the same file both write, and each sees the
    other's jobs, targets and byte total."""
    path = tmp_path / "shared.sqlite3"
    with store.open(path) as first, store.open(path) as second:
        first.create_job("from-first", "alice", ["a"])
        second.create_job("from-second", "bob", ["b"])
        second.store_target("from-first", 0, "done", result="ñ")
        first.store_target("from-second", 0, "failed", error="boom")
        assert first.set_job_status("from-second", "failed")
        assert second.set_job_status("from-second", "done") is False
        for db in (first, second):
            a = job_of(db, "from-first", "alice")
            b = job_of(db, "from-second", "bob")
            assert a.targets[0].result == "ñ"
            assert (b.status, b.targets[0].error) == ("failed", "boom")
            assert db.total_bytes() == 6
        assert second.evict(0) == ["from-second"]
        assert first.get_job("from-second", "bob") is None
        assert first.total_bytes() == 2


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
                db.create_job(job_id, f"o{i}", [f"r{k}" for k in range(ntargets)])
                for k in range(ntargets):
                    db.store_target(job_id, k, "done", result="→" * (k + 1))

        run_threads(work, 4)
        per_job = sum(3 * (k + 1) for k in range(ntargets))
        for db in stores:
            for i in range(4):
                for j in range(njobs):
                    job = job_of(db, f"s{i}-j{j}", f"o{i}")
                    assert [t.status for t in job.targets] == ["done"] * ntargets
                    assert job.nbytes == per_job
            assert db.total_bytes() == 4 * njobs * per_job


# -- reading a store: the operator's views and read-only opening ---------------


def test_list_jobs_counts_targets_and_filters(db: store.Store) -> None:
    db.create_job("j1", "alice", ["a", "b", "c"])
    db.create_job("j2", "bob", ["x"])
    db.store_target("j1", 0, "done", result="1")
    db.store_target("j1", 1, "failed", error="boom")
    db.store_target("j2", 0, "done", result="2", job_status="done")
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
    db.create_job("j1", "alice", ["a", "b", "c"])
    db.create_job("empty", "alice", [])
    db.store_target("j1", 0, "done", result="1")
    assert db.interrupt_job("j1", "gone") == ("partial", 2)
    assert [(s.id, s.status, s.done, s.failed, s.pending) for s in db.list_jobs()] == [
        ("j1", "partial", 1, 2, 0),
        ("empty", "queued", 0, 0, 0),
    ]


def test_find_job_reads_any_owner(db: store.Store) -> None:
    db.create_job("j1", "alice", ["a"])
    assert db.find_job("j1") == db.get_job("j1", "alice")
    assert db.find_job("nope") is None


def test_readonly_open_reads_and_refuses_writes(location: str) -> None:
    with store.open(location) as db:
        db.create_job("j1", "alice", ["a"])
    with store.open(location, readonly=True) as ro:
        assert ro.find_job("j1") is not None
        with pytest.raises(store.StoreError, match="reading only"):
            ro.create_job("j2", "alice", ["a"])
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
    db.create_job("a", "alice", ["1", "2"])
    db.create_job("b", "alice", ["1"])
    db.create_job("c", "alice", ["1"])
    db.store_target("a", 0, "done", result="0")
    db.set_job_status("c", "cancelled")
    stored = db.store_targets(
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
    assert db.total_bytes() == utf8_len("0", "11", "e", "h", "3")


@pytest.mark.parametrize(
    ("status", "job_status"), [("pending", None), ("done", "running"), ("done", "nope")]
)
def test_a_target_outcome_refuses_a_status_it_cannot_store(status: str, job_status: str) -> None:
    with pytest.raises(ValueError, match="ends"):
        store.TargetOutcome("a", 0, status, job_status=job_status)
