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
import dataclasses
import functools
import itertools
import json
import logging
import re
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ..errors import Conflict, StoreError
from ..schema import HISTORY, VERSION
from . import (
    EVENT,
    LOCKS,
    RESYNC,
    Cursor,
    Database,
    Tx,
    check_not_newer,
    check_readable,
    traced,
)

try:
    import psycopg
    import psycopg_pool
    from psycopg import errors as pgerrors
    from psycopg.pq import TransactionStatus
except ImportError as e:  # pragma: no cover - depends on the install
    raise StoreError(
        "a postgresql:// store needs psycopg 3 and psycopg-pool:"
        " pip install 'batch-store[postgres]'"
    ) from e

__all__ = ["LOCK_KEY", "PostgresDatabase"]

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
#: Seconds a session may sit idle inside a transaction before the server
#: ends it (and so releases the write lock it holds).
IDLE_IN_TRANSACTION = 5.0
#: Seconds a statement waits for a lock before it fails (and is retried).
LOCK_TIMEOUT = 20.0
#: How long a transaction is tried again while it meets only contention
#: (a deadlock, a serialization failure, a lock timeout) or a lost
#: connection before it started to commit.
RETRY_FOR = 60.0
#: Connections one ``Store`` opens at most; a thread wanting one more waits
#: (until the transaction's deadline).
POOL_SIZE = 8
#: Seconds a new connection may take to be made.
CONNECT_TIMEOUT = 10
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
#: The channel the store's notices go out on (``Database.notify``).
CHANNEL = "batch_store"
#: The most bytes of events a notice carries (a notice's payload is under
#: 8,000 bytes).
TOLD_BYTES = 7_900
#: Seconds the listener waits for a notice before it looks whether to stop.
LISTEN_POLL = 0.25
#: Seconds before the listener connects again after losing its connection.
RETRY_LISTEN = 1.0
#: Seconds the listener waits for the notice it sent itself (see
#: ``_Listener``): a notice takes a round trip or two.
PROBE_WAIT = 2.0

#: The store's time as the server reads it (``PostgresDatabase.clock``).
SERVER_TIME = "extract(epoch FROM clock_timestamp())"
#: Reads the store's time (``{time}``: ``PostgresDatabase.clock``) once per
#: transaction and keeps it as the transaction's setting, where statements
#: run on the server find it (``NOW``).
_CLOCK = "SELECT set_config('batch_store.now', ({time})::float8::text, true)::float8"
#: The time of the transaction, in a statement: ``Tx.now``, on the server.
NOW = "current_setting('batch_store.now')::float8"
#: A write begins by reading the clock (a serial one once it has the lock)
#: and leaving a mark (its connection's key and a token of its own, in
#: ``store_commits``, a row per connection): should the connection drop as
#: it commits, the mark says whether it did. All in one round trip. (A
#: transaction id would not do: after a crash of the server, the id of a
#: transaction whose commit was lost is given again.)
#: What every transaction sets for itself alone, right after its BEGIN: the
#: server ends it if it idles inside (its client gone), and a statement
#: waiting too long for a lock fails (and is tried again).
_SETTINGS = (
    f"SET LOCAL idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION * 1000:.0f};"
    f" SET LOCAL lock_timeout = {LOCK_TIMEOUT * 1000:.0f}"
)
#: Results of a write's BEGIN and settings, before its clock's.
_BEFORE_CLOCK = _SETTINGS.count(";") + 2
_BEGIN_LOCKED = f"BEGIN; {_SETTINGS}; {_CLOCK} FROM pg_advisory_xact_lock(%s)"
_MARK = (
    "INSERT INTO store_commits (conn, token, at)"
    " VALUES (%s, %s, extract(epoch FROM clock_timestamp()))"
    " ON CONFLICT (conn) DO UPDATE SET token = excluded.token, at = excluded.at, answer = NULL"
)
_BEGIN_SERIAL = f"{_BEGIN_LOCKED}; {_MARK}"
_BEGIN_FENCED = f"BEGIN; {_SETTINGS}; {_CLOCK}; {_MARK}"
#: The tokens of marks: a mark's token differs from every earlier one on
#: its connection (whose key no other process shares). A counter, not a
#: random draw: it costs no system call per transaction.
_TOKENS = itertools.count(1)
#: Seconds a connection's mark is kept after its last write (pruned at open).
MARKS_KEPT = 86_400.0
#: A read sees one snapshot throughout, and may not write.
_BEGIN_READ = f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {_SETTINGS}"

#: Errors that mean only "try again": nothing was committed.
_CONTENTION = (
    pgerrors.SerializationFailure,
    pgerrors.DeadlockDetected,
    pgerrors.LockNotAvailable,
)
#: SQLSTATE classes of a connection that is gone, whatever the client saw:
#: connection exceptions, and the server shutting the session down.
_LOST_STATES = ("08", "57P")

#: The table that says a schema is the store's, and at which version.
_VERSION_TABLE = "store_schema"


@functools.lru_cache(maxsize=1024)
def _translate(sql: str) -> tuple[str, bool]:
    """The statement as psycopg takes it, and whether its placeholders are
    numbered (``?1`` -> ``%(1)s``, given a mapping) or plain (``?`` -> ``%s``)."""
    sql = sql.replace("%", "%%")
    if re.search(r"\?\d", sql):
        return re.sub(r"\?(\d+)", r"%(\1)s", sql), True
    return sql.replace("?", "%s"), False


@functools.lru_cache(maxsize=16)
def _named(head: str, count: int) -> tuple[str, tuple[str, ...]]:
    """``head`` with its ``count`` plain placeholders named (``%(_h0)s``,
    ...), to go before a statement whose placeholders are numbered; and
    the names, in order."""
    names = tuple(f"_h{k}" for k in range(count))
    taken = iter(names)
    return re.sub("%s", lambda _: f"%({next(taken)})s", head), names


def _arg(value: object) -> object:
    # The schema keeps flags as integers 0 and 1, as SQLite does.
    return int(value) if isinstance(value, bool) else value


def _args(args: Sequence[Any], numbered: bool) -> Sequence[Any] | dict[str, Any]:
    if numbered:
        return {str(i): _arg(v) for i, v in enumerate(args, 1)}
    return [_arg(v) for v in args]


class _TryAgain(Exception):
    """A transaction of which nothing stands, worth trying again."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclasses.dataclass(frozen=True, slots=True)
class _Mark:
    """The mark one write leaves (``_MARK``): its connection's ``key``, its
    own ``token``; the server process ``pid`` of the session, there by the
    server's time ``since``; and until when (``time.monotonic()``) a lost
    answer may be asked for."""

    key: str
    token: int
    pid: int
    since: float
    deadline: float


class _Answer:
    """The rows of a statement whose answer was lost, as kept with its
    mark (``_Tx.finish``): a cursor over them."""

    def __init__(self, rows: list[dict[str, Any]] | None) -> None:
        self._rows = [tuple(row.values()) for row in rows or ()]
        self.rowcount = len(self._rows)

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class _Tx:
    """One transaction on one pooled connection (``db.Tx``).

    A read transaction begins with its first statement, sent with it in one
    round trip (``begun`` is False until then); a write transaction has
    begun, and read the clock, as it took the lock.

    ``executemany`` returns nothing, so its statements need not be waited
    for: they go out in pipeline mode, and are answered together with the
    next statement that returns rows, or with the COMMIT. A batch of writes
    and its commit cost one round trip.
    """

    __slots__ = ("_begin", "_conn", "_db", "_mark", "_now", "_pipeline", "begun", "committing")

    def __init__(
        self,
        db: PostgresDatabase,
        conn: psycopg.Connection[Any],
        begin: tuple[str, tuple[object, ...]] | None,
        mark: _Mark | None = None,
    ) -> None:
        self._db = db
        self._conn = conn
        # The mark a write leaves (``_MARK``), by which a lost answer to its
        # COMMIT is asked for; and until when it may be asked.
        self._mark = mark
        # What begins it, sent with its first statement: a write's lock,
        # clock and mark (``_BEGIN_SERIAL``, ``_BEGIN_FENCED``), or a read's snapshot.
        self._begin = begin
        self._now: float | None = None
        self._pipeline: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self.begun = False
        # Set once the COMMIT is sent: from then on, a lost answer leaves
        # unknown whether the transaction committed.
        self.committing = False

    @property
    def now(self) -> float:
        if self._now is None:
            if self._begin is not None and not self.begun:
                self._start("")
            else:
                (now,) = self.execute(self._db.timed(_CLOCK)).fetchone()
                self._now = float(now)
        assert self._now is not None
        return self._now

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        self._sync()
        query, numbered = _translate(sql)
        if self.begun:
            return self._conn.execute(query, _args(args, numbered))
        return self._start(query, args, numbered)

    def _start(
        self,
        query: str,
        args: Sequence[Any] = (),
        numbered: bool = False,
        begin: tuple[str, tuple[object, ...]] | None = None,
        *,
        bound: bool = False,
    ) -> Cursor:
        """Begin (as ``begin`` says, else as the transaction does), and run
        ``query`` (if any) in the same round trip; the cursor is left at the
        query's rows. A ``bound`` query has its values in its text already
        (and ``args`` is empty): the whole goes out as it is, not read again
        for placeholders."""
        head, head_args = begin or self._begin or (_BEGIN_READ, ())
        head = self._db.timed(head)
        if bound:
            bound_head = psycopg.ClientCursor(self._conn).mogrify(head, head_args)
            cur = self._conn.execute(f"{bound_head}; {query}")
        else:
            cur = self._conn.execute(*self._bind(head, head_args, query, args, numbered))
        self.begun = True
        ahead = head.count(";") + 1  # the head's results, each its own set
        if self._begin is not None:
            for _ in range(_BEFORE_CLOCK):
                cur.nextset()  # past BEGIN and the settings, to the clock
            (now,) = cur.fetchone() or (0.0,)  # read once the lock was taken
            self._now = float(now)
            ahead -= _BEFORE_CLOCK
        for _ in range(ahead if query else 0):
            cur.nextset()
        return cur

    @staticmethod
    def _bind(
        head: str,
        head_args: tuple[object, ...],
        query: str,
        args: Sequence[Any],
        numbered: bool,
    ) -> tuple[str, Sequence[Any] | dict[str, Any]]:
        """The text and values of ``head`` and ``query`` sent as one."""
        if numbered:
            head, named = _named(head, len(head_args))
            params: Sequence[Any] | dict[str, Any] = {
                **dict(zip(named, head_args, strict=True)),
                **_args(args, numbered),  # type: ignore[dict-item]
            }
        else:
            params = [*head_args, *_args(args, numbered)]
        return (f"{head}; {query}" if query else head), params

    def locking(self, *, skip: bool = False) -> str:
        """The clause that locks the rows a SELECT returns, in the order it
        returns them, for this transaction (``skip``: passing over rows
        another holds)."""
        return " FOR UPDATE SKIP LOCKED" if skip else " FOR UPDATE"

    def indexed(self, index: str) -> str:
        """Nothing: autovacuum keeps the planner's statistics."""
        return ""

    def try_lock(self, name: str) -> bool:
        """Take the lock of ``name`` (``LOCKS``) for this transaction, if
        no other session holds it; never waits."""
        (taken,) = self.execute("SELECT pg_try_advisory_xact_lock(?)", (LOCKS[name],)).fetchone()
        return bool(taken)

    def notify(self, notice: str) -> None:
        self.execute("SELECT pg_notify(?, ?)", (CHANNEL, notice))

    def horizon(self, *, bound: bool) -> tuple[int, int]:
        # A snapshot's xmax is no such bound: a transaction may have an id
        # above it and be in flight (xmax is one past the last that ended).
        # An id taken now is above every id given before.
        ended = "pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
        given = "pg_current_xact_id()::text::bigint" if bound else "0"
        first, second = self.execute(f"SELECT {ended}, {given}").fetchone()
        return first, second

    #: The schema's server functions run here (``Tx.functions``).
    functions = True

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        if not self.begun:
            self._start("")
        if self._pipeline is None:
            pipeline = self._conn.pipeline()
            pipeline.__enter__()
            self._pipeline = pipeline
        query, numbered = _translate(sql)
        self._conn.cursor().executemany(query, [_args(r, numbered) for r in rows])

    def finish(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        """Run the transaction's last statement with its COMMIT (and its
        BEGIN, if nothing came before): one round trip for all. The cursor
        is left at the statement's rows; nothing may follow.

        A write's rows are kept with its mark, in the same statement:
        should the answer be lost, the rows are asked for with the mark,
        and handed back as if it had come. (A read lost is read again.)"""
        self._sync()
        query, numbered = _translate(sql)
        if self._mark is None:  # a read: nothing to keep, should the answer be lost
            self.committing = True
            if self.begun:
                return self._conn.execute(f"{query}; COMMIT", _args(args, numbered))
            return self._start(f"{query}; COMMIT", args, numbered)
        # Bound here, so that a value the server cannot take fails before
        # anything is sent: once the COMMIT is, a failure is judged unsure.
        text = psycopg.ClientCursor(self._conn).mogrify(query, _args(args, numbered))
        answer = "(SELECT json_agg(r) FROM answered r)"
        if self.begun:  # the mark is left: the answer joins it
            kept = f"UPDATE store_commits SET answer = {answer} WHERE conn = '{self._mark.key}'"
        else:  # the mark is left here, with the answer: one write of it
            kept = (
                "INSERT INTO store_commits (conn, token, at, answer) VALUES"
                f" ('{self._mark.key}', {self._mark.token:d}, {SERVER_TIME}, {answer})"
                " ON CONFLICT (conn) DO UPDATE SET token = excluded.token,"
                " at = excluded.at, answer = excluded.answer"
            )
        text = f"WITH answered AS ({text}), kept AS ({kept}) SELECT * FROM answered; COMMIT"
        self.committing = True
        try:
            if self.begun:
                return self._conn.execute(text)
            assert self._begin is not None and self._begin[0].endswith(f"; {_MARK}")
            head, head_args = self._begin
            unmarked = (head.removesuffix(f"; {_MARK}"), head_args[:-2])
            return self._start(text, begin=unmarked, bound=True)
        except psycopg.Error as e:
            if not (_lost(self._conn, e) or e.sqlstate is None):
                raise  # the server's own answer: it did not commit
            self._conn.close()
            answer = self._db.committed(self._mark, e)
            if answer is False:
                self.committing = False  # as good as lost before the COMMIT
                raise
            return _Answer(answer)

    def commit(self) -> None:
        """Commit, with whatever writes still wait for their answer (if
        ``finish`` has not)."""
        if self.begun and not self.committing:
            self.committing = True
            self._conn.execute("COMMIT")
        self._sync()

    def abandon(self) -> None:
        """Leave pipeline mode, dropping what is unanswered (the transaction
        is rolled back next)."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            with contextlib.suppress(psycopg.Error):
                pipeline.__exit__(None, None, None)

    def _sync(self) -> None:
        """Wait for the answers of the statements sent in pipeline mode (an
        error among them is raised here), and leave it."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.__exit__(None, None, None)


class _Listener:
    """One connection that LISTENs for the store's notices and hands each
    to the subscribers, on a thread of its own, while any subscriber is
    left; it reconnects (after ``RETRY_LISTEN`` seconds) when the
    connection drops, and then tells every subscriber ``"resync"``.

    A LISTEN made through a transaction pooler (PgBouncer in transaction
    mode, say) succeeds and hears nothing: the server session it was made
    on serves other clients next. So before its first LISTEN the listener
    checks that it hears: it listens on a channel of its own, and another
    session notifies it (:meth:`_hears`). If nothing comes within
    ``PROBE_WAIT`` seconds it says so once in the log, makes no LISTEN on
    the store's channel (which would leave a registration on a server
    session nobody reads, and the pooler a warning per notice), and stops:
    ``hears`` stays False, and the store's readers keep their promises by
    reading (``Database.notifies``). (It is False, too, until the first
    check found that notices come: meanwhile readers read.) ``listen``, a URL that
    reaches the server directly or through a session pooler, is where it
    listens instead of the store's URL.

    ``_lock`` guards ``_subscribers``, ``_thread``, ``deaf`` and the
    thread's ``_stop``, set when the last subscriber leaves or the store
    closes. ``hears`` is written by the thread alone.
    """

    def __init__(self, db: PostgresDatabase, listen: str) -> None:
        self._db = db
        self._url = listen
        #: Whether notices reach this listener now (it listens).
        self.hears = False
        #: Found that notices do not reach it: it never listens again.
        self.deaf = False
        self._lock = threading.Lock()
        self._subscribers: dict[int, Callable[[str], None]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._keys = iter(range(1, 1 << 62))

    def add(self, callback: Callable[[str], None]) -> Callable[[], None]:
        with self._lock:
            key = next(self._keys)
            self._subscribers[key] = callback
            if not self.deaf and (self._thread is None or not self._thread.is_alive()):
                # Until it listens, ``hears`` is False: the subscriber reads
                # meanwhile, and is told "resync" once it listens.
                self._stop = threading.Event()
                self._thread = threading.Thread(
                    target=self._listen, args=(self._stop,), name="store-listener", daemon=True
                )
                self._thread.start()

        def remove() -> None:
            with self._lock:
                self._subscribers.pop(key, None)
                if not self._subscribers:
                    # It ends within LISTEN_POLL; nobody waits for it here.
                    self._stop.set()
                    self._thread = None

        return remove

    def stop(self) -> None:
        """The store closes: let the thread end, and wait (briefly) until it has."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(LISTEN_POLL + 1.0)

    def _hears(self, conn: psycopg.Connection[Any], stop: threading.Event) -> bool | None:
        """Whether a notice sent through the store's URL reaches ``conn``:
        it listens on a channel of its own (one nobody else notifies, so a
        registration left on a pooled server session costs nothing), and
        another session notifies it. None if ``stop`` is set meanwhile (it
        is looked at every ``LISTEN_POLL`` seconds)."""
        probe = f"batch_store_probe_{uuid.uuid4().hex}"
        conn.execute(f"LISTEN {probe}")
        with psycopg.connect(
            self._db.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
        ) as other:
            other.execute("SELECT pg_notify(%s, 'probe')", (probe,))
        deadline = time.monotonic() + PROBE_WAIT
        heard = False
        while not heard and (left := deadline - time.monotonic()) > 0:
            if stop.is_set():
                return None
            wait = min(left, LISTEN_POLL)
            heard = any(n.channel == probe for n in conn.notifies(timeout=wait, stop_after=1))
        conn.execute(f"UNLISTEN {probe}")
        return heard

    def _dispatch(self, notice: str) -> None:
        with self._lock:
            callbacks = list(self._subscribers.values())
        for callback in callbacks:
            try:
                callback(notice)
            except Exception:  # a subscriber's bug must not end the listening
                log.exception("a subscriber of store notices raised")

    def _listen(self, stop: threading.Event) -> None:
        """Until stopped: check once that notices come (else give up, said
        once), then listen, and connect again whenever the connection
        fails. Nothing else ends this thread: a failure of any kind is
        logged (once per outage) and waited out. While it does not listen,
        ``hears`` is False (readers read). Once it listens the subscribers
        are told ``"event"`` (the watchers read what was written before,
        once), and after a lost connection ``"resync"`` (notices were
        lost)."""
        checked, failing, first = False, False, True
        while not stop.is_set():
            try:
                with psycopg.connect(
                    self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
                ) as conn:
                    heard = checked or self._hears(conn, stop)
                    if heard is None:
                        return  # stopped while it checked
                    if not heard:
                        with self._lock:
                            self.deaf = True
                        log.warning(
                            "store %s: notices do not reach this process (a transaction"
                            " pooler between them?): it reads the store for news instead; give"
                            " store.open(listen=...) a URL to the server directly, or through"
                            " a session-mode pool, to be told at once",
                            self._db.path,
                        )
                        return
                    checked = True
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.hears, failing = True, False
                    self._dispatch(EVENT if first else RESYNC)
                    first = False
                    while not stop.is_set():
                        for n in conn.notifies(timeout=LISTEN_POLL):
                            self._dispatch(n.payload)
            except Exception:
                self.hears, first = False, False
                if stop.is_set():
                    return
                if not failing:
                    log.warning(
                        "store %s: listening for notices failed; trying again every %gs",
                        self._db.path,
                        RETRY_LISTEN,
                        exc_info=True,
                    )
                failing = True
                stop.wait(RETRY_LISTEN)


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
        self._listener = _Listener(self, listen or url)
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
        """Whether notices reach this store (see ``_Listener``)."""
        return self._listener.hears

    def read(self, fn: Callable[[Tx], T]) -> T:
        return self._run(fn, write=False, fenced=False)

    def _once(self, conn: psycopg.Connection[Any], fn: Callable[[Tx], T], *, write: bool) -> T:
        """Run ``fn`` once on ``conn`` (opening the store: no retry, no mark)."""
        try:
            tx = _Tx(self, conn, (_BEGIN_LOCKED, (LOCK_KEY,)) if write else None)
            result = fn(traced(tx, self.tracer))
            tx.commit()
        except psycopg.Error as e:
            _rollback(conn)
            raise StoreError(f"cannot open store {self.path!r}: {_text(e)}") from e
        except BaseException:
            _rollback(conn)
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
            except _TryAgain as again:
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
        here: ``_TryAgain`` when nothing of the transaction stands and
        trying again may succeed; the value of ``fn`` when the commit's
        answer was lost but its mark says it committed; else the store's
        error."""
        key, since = self._key(conn)
        mark = _Mark(key, next(_TOKENS), conn.info.backend_pid, since, deadline)
        begin: tuple[str, tuple[object, ...]] | None = None
        if write:
            begin = (
                (_BEGIN_FENCED, (key, mark.token))
                if fenced
                else (_BEGIN_SERIAL, (LOCK_KEY, key, mark.token))
            )
        tx = _Tx(self, conn, begin, mark if write else None)
        try:
            result = fn(traced(tx, self.tracer))
            tx.commit()
        except psycopg.Error as e:
            tx.abandon()
            lost = _lost(conn, e)
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
                _rollback(conn)
            if unsure:
                if self.committed(mark, e) is not False:
                    return result
                lost = True  # it did not commit: as good as lost before the COMMIT
            if lost or isinstance(e, _CONTENTION):
                raise _TryAgain(e) from e
            raise self._error(e) from e
        except BaseException:
            tx.abandon()
            _rollback(conn)
            raise
        return result

    def committed(self, mark: _Mark, lost: psycopg.Error) -> Any:
        """Whether the write that left ``mark`` committed, its connection
        lost (``lost``) as it did: False if not, else the answer kept with
        the mark (``_Tx.finish``; None if none was). Asked on a connection
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


def _lost(conn: psycopg.Connection[Any], e: psycopg.Error) -> bool:
    """Whether ``e`` means the connection is gone (or no longer to be trusted)."""
    state = e.sqlstate or ""
    return conn.closed or conn.broken or state.startswith(_LOST_STATES)


def _rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")


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
