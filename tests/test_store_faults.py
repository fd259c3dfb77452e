"""A store file that cannot be used says so, naming it and what to do; a new
file is private to its owner; hostile refs are stored intact, never run."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import batch
import store
import store.engines.sqlite
from store.ledger import Ledger
from tests.helpers import TIMEOUT, Script, frozen, trace


def test_a_new_store_file_is_private_to_its_owner(tmp_path: Path) -> None:
    """The file and its -wal and -shm files are 0600; the directory is left as it was."""
    mode_before = stat.S_IMODE(tmp_path.stat().st_mode)
    path = tmp_path / "private.sqlite3"
    with store.open(path) as db:
        Ledger.of(db).create_job("j", "alice", ["x"])
        files = sorted(p.name for p in tmp_path.iterdir())
        assert files == ["private.sqlite3", "private.sqlite3-shm", "private.sqlite3-wal"]
        for name in files:
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(tmp_path.stat().st_mode) == mode_before
    assert not stat.S_IMODE(tmp_path.stat().st_mode) & stat.S_IWOTH


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    store.open(path).close()
    path.chmod(0o640)
    store.open(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "x.sqlite3"
    with pytest.raises(store.StoreError) as e:
        store.open(path)
    assert str(path) in str(e.value)
    assert "directory exists" in str(e.value)


def test_a_corrupt_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.sqlite3"
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    with pytest.raises(store.StoreError) as e:
        store.open(path)
    assert str(path) in str(e.value)
    assert "backup" in str(e.value)


@pytest.fixture
def locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store file another connection holds an exclusive lock on."""
    path = tmp_path / "locked.sqlite3"
    store.open(path).close()
    monkeypatch.setattr(store.engines.sqlite, "BUSY_TIMEOUT", 0.05)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield path
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_locked_file_is_named_with_what_to_do(locked: Path) -> None:
    with pytest.raises(store.StoreError) as e:
        store.open(locked)
    assert str(locked) in str(e.value)
    assert "another process holds it locked" in str(e.value)


def test_a_file_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    """A store in a directory nothing may write (not even root) is refused
    with the file's name and what to do."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    path = folder / "x.sqlite3"
    store.open(path).close()
    with frozen(folder, path), pytest.raises(store.StoreError) as e:
        store.open(path)
    assert str(path) in str(e.value)
    assert "writ" in str(e.value)


def test_reading_a_store_leaves_no_file_beside_it(tmp_path: Path) -> None:
    """A read-only open creates nothing that stays: with no writer, the -wal
    and -shm files go when it closes; a live writer keeps its own."""
    path = tmp_path / "s.sqlite3"
    with store.open(path) as db:
        Ledger.of(db).create_job("j", "alice", ["x"])
    assert [p.name for p in tmp_path.iterdir()] == ["s.sqlite3"]
    with store.open(path, readonly=True) as ro:
        assert ro.find_job("j") is not None
    assert [p.name for p in tmp_path.iterdir()] == ["s.sqlite3"]

    with store.open(path) as writer:
        with store.open(path, readonly=True) as ro:
            assert ro.find_job("j") is not None
        Ledger.of(writer).create_job("k", "alice", ["y"])
        with store.open(path, readonly=True) as ro:
            assert ro.find_job("k") is not None
    assert [p.name for p in tmp_path.iterdir()] == ["s.sqlite3"]


def test_a_store_nobody_may_write_can_still_be_read(tmp_path: Path) -> None:
    """In a directory (and a file) nobody may write, a read-only open reads
    what is stored and creates nothing; a writer is still refused."""
    folder = tmp_path / "frozen"
    folder.mkdir()
    path = folder / "x.sqlite3"
    with store.open(path) as db:
        Ledger.of(db).create_job("j", "alice", ["x"])
    for paths in ([folder], [folder, path]):
        with frozen(*paths):
            with store.open(path, readonly=True) as ro:
                assert [s.id for s in ro.list_jobs()] == ["j"]
            with pytest.raises(store.StoreError, match="writ"):
                store.open(path)
        assert [p.name for p in folder.iterdir()] == ["x.sqlite3"]


@pytest.mark.parametrize(
    "ref",
    [
        "x'; DROP TABLE jobs; --",
        'a "quoted" ref',
        "back\\slash and % and _",
        "ünïcödé ✓ 漢字",
        "x" * batch.model.MAX_REF_BYTES,
    ],
)
def test_hostile_refs_are_stored_intact(db: store.Store, ref: str) -> None:
    """A ref is data: whatever it holds comes back byte for byte and runs nothing."""
    seen: list[str] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        seen.append(target.ref)
        return {"ref": target.ref}

    alice = batch.Caller("alice")
    with batch.Runner(db, fetch) as r:
        job = r.wait(alice, r.submit(alice, [ref]), TIMEOUT)
    assert seen == [ref]
    assert job.targets[0].target.ref == ref
    assert job.targets[0].result == {"ref": ref}
    assert Ledger.of(db).total_bytes() > 0


def test_unknown_and_foreign_ids_take_the_same_path(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another caller's job is looked up exactly as an unknown one: the same
    single query, the same error and message."""
    alice, bob = batch.Caller("alice"), batch.Caller("bob")
    with batch.Runner(db, Script()) as r:
        job_id = r.wait(alice, r.submit(alice, ["x"]), TIMEOUT).id
        statements = trace(db, monkeypatch)
        errors = []
        for probe in (job_id, "f" * 32):
            with pytest.raises(batch.JobNotFound) as e:
                r.status(bob, probe)
            errors.append(str(e.value).replace(probe, "ID"))
    assert errors[0] == errors[1]
    selects = [s for s in statements if s.startswith("SELECT") and " FROM jobs " in s]
    assert len(selects) == 2
    assert selects[0].replace(job_id, "ID") == selects[1].replace("f" * 32, "ID")


class FlakyConnection:
    """Wraps a sqlite3 connection: the first ``times`` statements that start
    with ``prefix`` raise ``sqlite3.OperationalError(message)``, as a locked
    file or a full disk would."""

    def __init__(self, conn: sqlite3.Connection, prefix: str, message: str, times: int) -> None:
        self._conn = conn
        self._prefix = prefix
        self._message = message
        self.left = times

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        self._maybe_fail(sql)
        return self._conn.execute(sql, *args)

    def executemany(self, sql: str, *args: object) -> sqlite3.Cursor:
        self._maybe_fail(sql)
        return self._conn.executemany(sql, *args)  # type: ignore[arg-type]

    def _maybe_fail(self, sql: str) -> None:
        if self.left and sql.lstrip().startswith(self._prefix):
            self.left -= 1
            raise sqlite3.OperationalError(self._message)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [("UPDATE targets", "database is locked"), ("COMMIT", "database or disk is full")],
)
def test_sqlite_errors_under_the_runner_lose_nothing(
    sqlite_db: store.Store, monkeypatch: pytest.MonkeyPatch, prefix: str, message: str
) -> None:
    """SQLite refusing statements (locked, disk full, even at COMMIT) under a
    running runner: every target is fetched once and stored once, the jobs
    end as their targets say, and the file stays whole."""
    db = sqlite_db
    script = Script()
    alice = batch.Caller("alice")
    refs = [[f"j{j}-{i}" for i in range(4)] for j in range(3)]
    refused = 0

    def submit(r: batch.Runner[batch.Caller], job_refs: list[str]) -> str:
        nonlocal refused
        while True:
            try:
                return r.submit(alice, job_refs)
            except store.StoreError:
                refused += 1  # the caller is told, and nothing was stored

    with batch.Runner(db, script, batch.Config(workers=2)) as r:
        flaky = FlakyConnection(db._db._conn, prefix, message, times=5)
        monkeypatch.setattr(db._db, "_conn", flaky)
        ids = [submit(r, job_refs) for job_refs in refs]
        jobs = [r.wait(alice, job_id, TIMEOUT) for job_id in ids]
    assert flaky.left == 0
    with db._db.transaction(write=False) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (3,)
    assert sorted(script.calls) == sorted(ref for job_refs in refs for ref in job_refs)
    assert [j.status for j in jobs] == ["done"] * 3
    assert [[t.result for t in j.targets] for j in jobs] == [
        [{"ref": ref} for ref in job_refs] for job_refs in refs
    ]
    with db._db.transaction(write=False) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
