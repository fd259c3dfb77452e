"""The SQLite engine: the connection to one store file, the lock that
serialises it, and migration by ``PRAGMA user_version``."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import Conflict, StoreError
from ..schema import HISTORY, VERSION
from . import Database, Synchronous, Tx, check_not_newer, check_readable, traced
from .wal import Folder

__all__ = ["BUSY_TIMEOUT", "SQLiteDatabase"]

T = TypeVar("T")

#: How long a statement waits for another process's write lock before failing.
BUSY_TIMEOUT = 5.0
#: Tables every store file has, whatever its version: what tells one apart.
STORE_TABLES = frozenset({"jobs", "targets", "job_bytes"})


class _Conn(sqlite3.Connection):
    """The connection, carrying the time of its open transaction (``Tx.now``)."""

    now: float = 0.0

    def locking(self, *, skip: bool = False) -> str:
        """Nothing: the file's write lock keeps every other writer out."""
        return ""

    def indexed(self, index: str) -> str:
        """``INDEXED BY``: SQLite plans by rules of thumb until ANALYZE."""
        return f" INDEXED BY {index}"

    def try_lock(self, name: str) -> bool:
        """Always taken: the file's write lock is held already."""
        return True

    def finish(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run the last statement; the commit follows it, as ever."""
        return self.execute(sql, args)

    def notify(self, notice: str) -> None:
        """Nothing is sent: SQLite has no channel between processes, so
        other processes' runners poll."""

    def horizon(self, *, bound: bool) -> None:
        """None: one writer at a time numbers events as it commits."""

    #: No server functions: every operation takes its Python path.
    functions = False


class SQLiteDatabase(Database):
    """One SQLite connection shared by every thread of one ``Store``.

    ``_lock`` guards ``_conn`` (every statement run on it) and ``_closed``.
    Whenever ``_lock`` is free, no transaction is open on ``_conn``: every
    statement runs inside :meth:`transaction`, which commits or rolls back
    before it lets go of the lock. Writers of other processes are kept out
    by the file's write lock, taken at ``BEGIN IMMEDIATE``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "NORMAL",
        readonly: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"a store path is a str or os.PathLike, not {type(path).__name__}")
        self.path = os.fspath(path)
        if not isinstance(self.path, str):
            raise TypeError(f"a store path must name a text path, not {self.path!r}")
        self.readonly = readonly
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        # Folds the log after writes, so that no commit waits for it.
        self._folder = Folder(self.path, BUSY_TIMEOUT)
        if readonly:
            _check_exists(self.path)
        else:
            _create_private(self.path)
        try:
            # isolation_level=None: the module opens no transaction behind our
            # back; transaction() says BEGIN and COMMIT itself.
            self._conn = sqlite3.connect(
                _reading_uri(self.path) if readonly else self.path,
                timeout=BUSY_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,
                uri=readonly,
                factory=_Conn,
            )
        except sqlite3.Error as e:
            raise StoreError(f"cannot open store {self.path!r}: {e}{_advice(e)}") from e
        # The time of the open transaction, for the triggers that write events.
        conn = self._conn
        conn.create_function("store_now", 0, lambda: conn.now)
        try:
            # sqlite3.connect reads nothing: these are the first statements to
            # find out that the file is not a database, or cannot be written.
            if readonly:
                self._conn.execute("PRAGMA query_only = ON")
                self._check_version()
            else:
                _patiently(self._refuse_foreign)
                _patiently(lambda: self._conn.execute("PRAGMA journal_mode = WAL"))
                self._conn.execute(f"PRAGMA synchronous = {synchronous}")
                self._conn.execute("PRAGMA foreign_keys = ON")
                _patiently(self._migrate)
        except sqlite3.Error as e:
            self._conn.close()
            raise StoreError(f"cannot open store {self.path!r}: {e}{_advice(e)}") from e
        except BaseException:
            self._conn.close()
            raise

    def read_version(self, tx: Tx) -> int:
        return int(tx.execute("PRAGMA user_version").fetchone()[0])

    def _check_version(self) -> None:
        """Refuse to read a file whose schema is not this library's."""
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        tables = self._tables()
        if version == 0 or not set(tables) >= STORE_TABLES:
            raise StoreError(f"{self.path!r} is not a store file (it holds no store tables)")
        check_readable(self.path, version)

    def _refuse_foreign(self) -> None:
        """Refuse, before writing anything (even the switch to WAL), a
        database file of another application's: other tables and no store
        schema, whatever its ``user_version`` says (another application may
        number its own schema there too)."""
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        tables = self._tables()
        if not tables and not version:
            return  # a new, empty file: the store's to set up
        if set(tables) >= STORE_TABLES:
            return  # a store, of this library's version or another's
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        what = f"other tables ({shown})" if tables else f"no table, but user_version {version}"
        raise StoreError(
            f"{self.path!r} is not a store file: it holds {what} and no store schema;"
            " open another path"
        )

    def _tables(self) -> list[str]:
        return [
            name
            for (name,) in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]

    def _migrate(self) -> None:
        with self.transaction() as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            check_not_newer(self.path, version)
            for step in HISTORY[version:]:
                for statement in step.sqlite:
                    conn.execute(statement)
            if version != VERSION:
                # PRAGMA takes no bound parameter; VERSION is our own int.
                conn.execute(f"PRAGMA user_version = {VERSION:d}")

    one_writer = True

    def write(self, fn: Callable[[Tx], T], *, fenced: bool = False) -> T:
        with self.transaction() as conn:
            return fn(traced(conn, self.tracer))

    def read(self, fn: Callable[[Tx], T]) -> T:
        with self.transaction(write=False) as conn:
            return fn(traced(conn, self.tracer))

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        return _nothing

    def clock(self) -> float:
        """The store's clock: this host's, the only one that writes the file
        (or the one given to ``store.open``)."""
        return time.time() if self._clock is None else self._clock()

    @contextlib.contextmanager
    def transaction(self, *, write: bool = True) -> Iterator[_Conn]:
        """Hold the connection for one transaction: commit on success, roll back
        on any exception (which propagates; SQLite errors as ``StoreError``).

        ``write=True`` starts with ``BEGIN IMMEDIATE``, taking the file's write
        lock up front, so a transaction never fails half-way for want of it.
        """
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.path!r} is closed")
            if write and self.readonly:
                raise StoreError(f"store {self.path!r} is open for reading only")
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                self._conn.now = self.clock()
                before = self._conn.total_changes
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                    if self._conn.total_changes != before:
                        self._folder.wrote()
                except BaseException:
                    # The failed statement (or COMMIT) left the transaction
                    # open; nothing would ever close it, so roll it back here.
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.IntegrityError as e:
                if "UNIQUE" not in str(e):
                    raise StoreError(f"store {self.path!r}: {e}") from e
                raise Conflict(f"store {self.path!r}: {e}") from e
            except sqlite3.Error as e:
                raise StoreError(f"store {self.path!r}: {e}") from e

    def close(self) -> None:
        """Close the connection; later transactions raise ``StoreError``. Idempotent."""
        self._folder.close()  # first: the last connection to close folds the log
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


def _nothing() -> None:
    """Undo a subscription that has nothing to undo."""


def _patiently(step: Callable[[], object]) -> None:
    """Run ``step``, trying again while another process holds the file
    locked, for up to ``BUSY_TIMEOUT`` seconds: switching a file to WAL (and
    migrating a new one) can meet a lock SQLite's busy handler does not wait
    for, as when another process is creating the same file."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    delay = 0.001
    while True:
        try:
            step()
        except (sqlite3.OperationalError, StoreError) as e:
            text = str(e).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                raise
        else:
            return
        time.sleep(delay)  # nothing to be notified by: another process holds the lock
        delay = min(2 * delay, 0.05)


def _check_exists(path: str) -> None:
    """Refuse to open, for reading, a file that is not there (SQLite would say
    only that it cannot open it)."""
    if not os.path.isfile(path):
        raise StoreError(f"no store file at {path!r}: check the path")


def _reading_uri(path: str) -> str:
    """The URI that opens ``path`` for reading, leaving nothing behind:

    - where this process may write the file and its directory, an ordinary
      connection (the store writes nothing through it: ``transaction``
      refuses, and so does ``query_only``), so that, the last to close, it
      removes the -wal and -shm files as a writer does;
    - else, with a -wal file beside it (a writer has it open), ``mode=ro``,
      which shares that writer's -wal and -shm;
    - else nothing can be writing the file (a writer needs a -wal beside
      it), and ``immutable=1`` reads it as it stands, creating nothing.
    """
    full = os.path.abspath(path)
    if os.access(full, os.W_OK) and os.access(os.path.dirname(full), os.W_OK):
        mode = "rw"
    elif os.path.exists(full + "-wal"):
        mode = "ro"
    else:
        mode = "ro&immutable=1"
    return f"file:{urllib.parse.quote(full)}?mode={mode}"


def _create_private(path: str) -> None:
    """Create a new store file readable and writable by its owner only (SQLite
    gives its -wal and -shm files the same mode). An existing file, or one in
    a directory that does not exist, is left for SQLite to open or refuse."""
    if path == ":memory:" or path.startswith("file:"):
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError, NotADirectoryError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _advice(e: sqlite3.Error) -> str:
    """What to do about an error that stops a store file from opening."""
    text = str(e).lower()
    if "not a database" in text or "malformed" in text:
        return (
            "; it is not a store file, or it is corrupt: restore it from a backup or"
            " open another path"
        )
    if "readonly" in text or "read-only" in text:
        return (
            "; the store writes the file and its -wal and -shm files beside it: make the"
            " file and its directory writable, or open a copy"
        )
    if "locked" in text or "busy" in text:
        return "; another process holds it locked: try again once that process lets go"
    if "unable to open" in text:
        return "; check that the directory exists and that you may write in it"
    return ""
