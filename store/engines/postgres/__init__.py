"""The PostgreSQL engine: connections from psycopg's pool, writes fenced by
the rows they touch, the server's clock, and the schema kept by a version
table.

How writers stay correct without SQLite's single writer (every write runs
under READ COMMITTED, where each statement sees every transaction committed
before it began):

- A **fenced** write (``Database.write(fn, fenced=True)``: everything the
  runner writes for its jobs) takes no lock for the whole store. Its own
  statements keep it correct: the rows it decides on are locked, in one
  order, by the statement that reads them (``Tx.locking``), and its
  predicates name the lease it writes under. Writes of different jobs
  commit side by side, and a session stopped in one (a SIGSTOPped process)
  holds only its own jobs' rows: no other runner needs them. Rows that
  every such write would update (the byte total, the clock of beats) are
  written last, sent with the COMMIT, so no session holds them while its
  client is between round trips; work one process does for all (eviction,
  the clock's give-back) is taken with a lock tried, never waited for.
- A **serial** write (the default: the run queue, its nodes and leases,
  migrations) starts by taking one transaction-level advisory lock, held
  until it ends: the queue's FIFO promotion and the nodes it takes are a
  store-wide order, and once the lock is held such a write sees the latest
  committed state and no other serial writer changes it until it ends.
  Under REPEATABLE READ this would not hold (the snapshot would predate the
  lock). Runners never take this lock.

Readers take no lock and wait for no writer. A session that stops inside a
transaction is ended by the server after ``IDLE_IN_TRANSACTION`` seconds,
which frees what it held.

No state outlives a transaction: the settings a transaction needs are set
for it alone (``SET LOCAL``, sent with its BEGIN), a read-only store is
read-only by the ``READ ONLY`` of each of its transactions, and the locks
it takes are transaction-level. So a session handed from one client to
another (a transaction pooler: PgBouncer, RDS Proxy) carries nothing of
this store's to the next.

Every error the driver raises is judged in one place (``_attempt``): what
failed before the COMMIT was sent, or in a read, is tried again if it was
contention or a lost connection; a write whose connection dropped at or
around its COMMIT is settled by the mark it left (``store_commits``):
reported done if it committed, tried again if it did not, never both.

Times come from the server (``clock_timestamp()``), so runners on hosts
whose clocks disagree still agree on every lease, heartbeat and FIFO
position.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import Conflict, StoreError
from ...schema import HISTORY, VERSION
from .. import Database, Tx, check_not_newer, check_readable, traced

try:
    import psycopg
    import psycopg_pool
    from psycopg import errors as pgerrors
except ImportError as e:  # pragma: no cover - depends on the install
    raise StoreError(
        "a postgresql:// store needs psycopg 3 and psycopg-pool:"
        " pip install 'batch-store[postgres]'"
    ) from e

from .listener import TOLD_BYTES, Listener
from .tx import (
    BEGIN_FENCED,
    BEGIN_LOCKED,
    BEGIN_SERIAL,
    CHANNEL,
    CONNECT_TIMEOUT,
    CONTENTION,
    MARKS_KEPT,
    SERVER_TIME,
    TOKENS,
    Mark,
    Transaction,
    TryAgain,
    is_lost,
    rollback,
)

__all__ = ["CHANNEL", "KEYS_LOCK", "LOCK_KEY", "TOLD_BYTES", "PostgresDatabase"]

T = TypeVar("T")

log = logging.getLogger("store")

#: The advisory lock every serial write takes ("bstore" in ASCII).
LOCK_KEY = 0x6273746F7265
#: The first of the two keys of the advisory locks of idempotency keys
#: (``store_create_jobs``); the second is the key's hash. Two writers
#: inserting jobs of the same keys, each in the order its jobs came in,
#: would wait on each other's keys in a circle: each takes the locks of its
#: keys in one order first. (Two keys of one hash only take turns.)
KEYS_LOCK = 0x6B6579
#: How long a transaction is tried again while it meets only contention
#: (a deadlock, a serialization failure, a lock timeout) or a lost
#: connection before it started to commit.
RETRY_FOR = 60.0
#: Connections one ``Store`` opens at most; a thread wanting one more waits
#: (until the transaction's deadline).
POOL_SIZE = 8
#: Seconds a transaction waits for the pool before it looks whether the
#: pool is failing to connect (see ``PostgresDatabase._connection``).
POOL_PATIENCE = 0.1
#: The name the store's sessions give the server (``pg_stat_activity``).
APPLICATION = "batch-store"


class _QuietPool(logging.Filter):
    """psycopg-pool warns of every broken connection it discards. Of the
    store's own connections, such a line goes to debug level: the store
    says itself, once, what broke and that it tried again; a recovered
    fault should not read as a crash. Other pools' lines pass as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.ours: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.levelno == logging.WARNING
            and isinstance(args, tuple)
            and args
            and isinstance(args[0], psycopg.Connection)
            and args[0] in self.ours
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_QUIET_POOL = _QuietPool()
logging.getLogger("psycopg.pool").addFilter(_QUIET_POOL)
#: The table that says a schema is the store's, and at which version.
_VERSION_TABLE = "store_schema"


class PostgresDatabase(Database):
    """A store in one PostgreSQL database (the URL's), in the current schema."""

    def __init__(
        self,
        url: str,
        *,
        readonly: bool = False,
        listen: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.url = url
        self.path = _without_password(url)
        self.readonly = readonly
        self._clock = clock
        self._listener = Listener(self, listen or url)
        # Each pooled connection's key, for the marks its writes leave (its
        # own for as long as it lives), and the server's time when it was
        # set up (its session was there by then). ``_lock`` guards it (the
        # pool makes connections on threads of its own).
        self._keys: weakref.WeakKeyDictionary[psycopg.Connection[Any], tuple[str, float]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._kwargs: dict[str, Any] = {
            "autocommit": True,  # transactions are BEGIN ... COMMIT, said here
            "cursor_factory": psycopg.ClientCursor,
            "connect_timeout": CONNECT_TIMEOUT,
            "application_name": APPLICATION,
        }
        # Failed connection attempts of the pool's, as of when it last served
        # after a wait (see _connection); guarded by ``_lock``.
        self._pool_errors = 0
        # The schema is checked (or made) on a connection of its own, before
        # the pool: a server that cannot be reached fails the open at once.
        try:
            first = self._connect()
        except psycopg.Error as e:
            raise StoreError(f"cannot open store {self.path!r}: {_text(e)}") from e
        with first:
            if readonly:
                self._once(first, self._check_version, write=False)
            else:
                # No mark: the table of marks may not be there yet.
                self._once(first, self._migrate, write=True)
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(
                url,
                kwargs=self._kwargs,
                min_size=1,
                max_size=POOL_SIZE,
                configure=self._configure,
                name=f"store {self.path}",
                num_workers=2,
                open=True,
            )
        )

    # -- connections ------------------------------------------------------------

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Take up a new connection: its key, and the server's time then.
        It sets nothing for the session: a pooler may hand the session to
        another client (see the module)."""
        row = conn.execute(f"SELECT {SERVER_TIME}::float8").fetchone()
        with self._lock:
            self._keys[conn] = (uuid.uuid4().hex, float(row[0]) if row else 0.0)
        _QUIET_POOL.ours.add(conn)

    def _key(self, conn: psycopg.Connection[Any]) -> tuple[str, float]:
        """The connection's key, and the server's time once it was there."""
        with self._lock:
            return self._keys[conn]

    def clock(self) -> str:
        """The store's clock, as SQL: the server's (or the time the clock
        given to ``store.open`` reads now)."""
        return SERVER_TIME if self._clock is None else repr(float(self._clock()))

    def timed(self, sql: str) -> str:
        """``sql`` reading the store's clock where it says ``{time}``."""
        return sql.replace("{time}", self.clock())

    # -- transactions -------------------------------------------------------------

    def write(self, fn: Callable[[Tx], T], *, fenced: bool = False) -> T:
        if self.readonly:
            raise StoreError(f"store {self.path!r} is open for reading only")
        return self._run(fn, write=True, fenced=fenced)

    functions = True

    @property
    def notifies(self) -> bool:
        """Whether notices reach this store (see ``Listener``)."""
        return self._listener.hears

    def read(self, fn: Callable[[Tx], T]) -> T:
        return self._run(fn, write=False, fenced=False)

    def _once(self, conn: psycopg.Connection[Any], fn: Callable[[Tx], T], *, write: bool) -> T:
        """Run ``fn`` once on ``conn`` (opening the store: no retry, no mark)."""
        try:
            tx = Transaction(self, conn, (BEGIN_LOCKED, (LOCK_KEY,)) if write else None)
            result = fn(traced(tx, self.tracer))
            tx.commit()
        except psycopg.Error as e:
            rollback(conn)
            raise StoreError(f"cannot open store {self.path!r}: {_text(e)}") from e
        except BaseException:
            rollback(conn)
            raise
        return result

    def _run(self, fn: Callable[[Tx], T], *, write: bool, fenced: bool) -> T:
        """Run ``fn`` in one transaction, trying again (on another
        connection where the one it had broke) while what fails is
        contention, or a lost connection whose transaction did not commit,
        until ``RETRY_FOR`` seconds have passed."""
        deadline = time.monotonic() + RETRY_FOR
        delay = 0.005
        while True:
            conn, pooled = self._connection(deadline)
            try:
                return self._attempt(conn, fn, write=write, fenced=fenced, deadline=deadline)
            except TryAgain as again:
                if time.monotonic() + delay > deadline:
                    raise self._error(again.cause) from again.cause
            finally:
                if pooled:
                    self._pool.putconn(conn)
                else:
                    conn.close()
            time.sleep(delay)  # contention, or a server away: nothing to be notified by
            delay = min(2 * delay, 0.5)

    def _connection(self, deadline: float) -> tuple[psycopg.Connection[Any], bool]:
        """A connection, and whether it is the pool's, waited for until
        ``deadline`` at most.

        The pool makes new connections on its own threads, and after one
        failed to connect it tries again only after a backoff that grows to
        seconds: a server restarting in a fraction of a second would leave
        the store idle that long. So a transaction that waits for the pool
        more than ``POOL_PATIENCE`` while the pool has failed to connect
        since it last served one, connects itself (a connection used once,
        then closed), until the pool serves again."""
        waited = False
        while True:
            left = deadline - time.monotonic()
            try:
                conn = self._pool.getconn(timeout=max(min(left, POOL_PATIENCE), 0.001))
            except psycopg_pool.PoolClosed as e:
                raise StoreError(f"store {self.path!r} is closed") from e
            except psycopg_pool.PoolTimeout as e:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"store {self.path!r}: no connection to the server within {RETRY_FOR:g}s"
                    ) from e
                waited = True
                if self._pool.get_stats().get("connections_errors", 0) > self._pool_errors:
                    with contextlib.suppress(psycopg.Error):  # still away: wait for the pool
                        return self._connect(), False
                continue
            if waited:
                with self._lock:
                    self._pool_errors = self._pool.get_stats().get("connections_errors", 0)
            return conn, True

    def _connect(self) -> psycopg.Connection[Any]:
        """A connection of its own, set up as the pool's are."""
        conn = psycopg.connect(self.url, **self._kwargs)
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _attempt(
        self,
        conn: psycopg.Connection[Any],
        fn: Callable[[Tx], T],
        *,
        write: bool,
        fenced: bool,
        deadline: float,
    ) -> T:
        """One try of the transaction. Every error of the driver is judged
        here: ``TryAgain`` when nothing of the transaction stands and
        trying again may succeed; the value of ``fn`` when the commit's
        answer was lost but its mark says it committed; else the store's
        error."""
        key, since = self._key(conn)
        mark = Mark(key, next(TOKENS), conn.info.backend_pid, since, deadline)
        begin: tuple[str, tuple[object, ...]] | None = None
        if write:
            begin = (
                (BEGIN_FENCED, (key, mark.token))
                if fenced
                else (BEGIN_SERIAL, (LOCK_KEY, key, mark.token))
            )
        tx = Transaction(self, conn, begin, mark if write else None)
        try:
            result = fn(traced(tx, self.tracer))
            tx.commit()
        except psycopg.Error as e:
            tx.abandon()
            lost = is_lost(conn, e)
            # Whether the COMMIT may have been carried out without its answer
            # reaching us: it was sent, and no answer of the server's own
            # said it failed.
            unsure = write and tx.committing and (lost or e.sqlstate is None)
            if lost or unsure:
                # Closed, so that the transaction is over on the server (or
                # committing, out of our hands) and the pool makes another.
                conn.close()
                self._pool.check()  # its idle connections may be as dead
            else:
                rollback(conn)
            if unsure:
                if self.committed(mark, e) is not False:
                    return result
                lost = True  # it did not commit: as good as lost before the COMMIT
            if lost or isinstance(e, CONTENTION):
                raise TryAgain(e) from e
            raise self._error(e) from e
        except BaseException:
            tx.abandon()
            rollback(conn)
            raise
        return result

    def committed(self, mark: Mark, lost: psycopg.Error) -> Any:
        """Whether the write that left ``mark`` committed, its connection
        lost (``lost``) as it did: False if not, else the answer kept with
        the mark (``Transaction.finish``; None if none was). Asked on a connection
        of its own once the session that ran it is over, since until then
        it may still be committing; ``StoreError`` if the server could not
        be asked by the mark's deadline."""
        delay = 0.005
        while time.monotonic() + delay <= mark.deadline:
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
                ) as conn:
                    # Whether the session runs, then (a statement of its own,
                    # so a snapshot taken after) the mark: a session that
                    # committed and ended between the two is seen committed.
                    (running,) = conn.execute(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s"
                        " AND backend_start <= to_timestamp(%s))",
                        (mark.pid, mark.since),
                    ).fetchone() or (True,)
                    token, answer = conn.execute(
                        "SELECT token, answer FROM store_commits WHERE conn = %s", (mark.key,)
                    ).fetchone() or (None, None)
                if token == mark.token:
                    return json.loads(answer) if isinstance(answer, str) else answer
                if not running:
                    return False
            except psycopg.Error:
                pass  # the server is away: ask again
            time.sleep(delay)
            delay = min(2 * delay, 0.5)
        raise StoreError(
            f"store {self.path!r}: the connection was lost while committing, and the"
            f" server could not be asked whether the transaction was committed: {_text(lost)}"
        ) from lost

    def _error(self, e: psycopg.Error) -> StoreError:
        if isinstance(e, pgerrors.UniqueViolation):
            return Conflict(f"store {self.path!r}: {_text(e)}")
        return StoreError(f"store {self.path!r}: {_text(e)}")

    def close(self) -> None:
        self._listener.stop()
        self._pool.close()

    # -- notices ------------------------------------------------------------------

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        return self._listener.add(callback)

    # -- the schema -----------------------------------------------------------------

    def read_version(self, tx: Tx) -> int:
        return int(tx.execute(f"SELECT version FROM {_VERSION_TABLE}").fetchone()[0])

    def _version(self, tx: Tx) -> int | None:
        found = tx.execute("SELECT to_regclass(?) IS NOT NULL", (_VERSION_TABLE,)).fetchone()
        if not found[0]:
            return None
        (version,) = tx.execute(f"SELECT version FROM {_VERSION_TABLE}").fetchone()
        return int(version)

    def _check_version(self, tx: Tx) -> None:
        version = self._version(tx)
        if version is None:
            raise StoreError(f"{self.path!r} holds no store (no {_VERSION_TABLE} table)")
        check_readable(self.path, version)

    def _migrate(self, tx: Tx) -> None:
        """Set up an empty schema, or bring the store's forward; under the
        write lock, so that processes opening one database at once take
        turns and all succeed."""
        version = self._version(tx)
        if version is None:
            others = [
                name
                for (name,) in tx.execute(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = current_schema() ORDER BY table_name"
                )
            ]
            if others:
                raise StoreError(
                    f"{self.path!r} is not a store: its schema holds other tables"
                    f" ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); open"
                    " another database, or another schema (options=-csearch_path=...)"
                )
            tx.execute(f"CREATE TABLE {_VERSION_TABLE} (version INTEGER NOT NULL)")
            tx.execute(f"INSERT INTO {_VERSION_TABLE} (version) VALUES (0)")
            version = 0
        check_not_newer(self.path, version)
        if version:
            tx.execute("DELETE FROM store_commits WHERE at < ?", (tx.now - MARKS_KEPT,))
        for step in HISTORY[version:]:
            for statement in step.postgres:
                tx.execute(statement)
        if version != VERSION:
            tx.execute(f"UPDATE {_VERSION_TABLE} SET version = ?", (VERSION,))


def _text(e: psycopg.Error) -> str:
    """The server's message, without psycopg's context lines."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _without_password(url: str) -> str:
    """The URL to show in messages and ``Store.path``: without its password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
