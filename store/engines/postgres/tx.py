"""PostgreSQL's transactions: how one begins (its settings, clock and mark
sent with its first statement), its statements in the store's dialect, and
what a lost answer to its COMMIT leaves (``store.engines.postgres``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerrors
from psycopg.pq import TransactionStatus

from .. import LOCKS, Cursor

if TYPE_CHECKING:
    from . import PostgresDatabase

#: Seconds a new connection may take to be made.
CONNECT_TIMEOUT = 10
#: The channel the store's notices go out on (``Transaction.notify``).
CHANNEL = "batch_store"
#: Seconds a session may sit idle inside a transaction before the server
#: ends it (and so releases the write lock it holds).
IDLE_IN_TRANSACTION = 5.0
#: Seconds a statement waits for a lock before it fails (and is retried).
LOCK_TIMEOUT = 20.0
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
BEGIN_LOCKED = f"BEGIN; {_SETTINGS}; {_CLOCK} FROM pg_advisory_xact_lock(%s)"
_MARK = (
    "INSERT INTO store_commits (conn, token, at)"
    " VALUES (%s, %s, extract(epoch FROM clock_timestamp()))"
    " ON CONFLICT (conn) DO UPDATE SET token = excluded.token, at = excluded.at, answer = NULL"
)
BEGIN_SERIAL = f"{BEGIN_LOCKED}; {_MARK}"
BEGIN_FENCED = f"BEGIN; {_SETTINGS}; {_CLOCK}; {_MARK}"
#: The tokens of marks: a mark's token differs from every earlier one on
#: its connection (whose key no other process shares). A counter, not a
#: random draw: it costs no system call per transaction.
TOKENS = itertools.count(1)
#: Seconds a connection's mark is kept after its last write (pruned at open).
MARKS_KEPT = 86_400.0
#: A read sees one snapshot throughout, and may not write.
_BEGIN_READ = f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {_SETTINGS}"

#: Errors that mean only "try again": nothing was committed.
CONTENTION = (
    pgerrors.SerializationFailure,
    pgerrors.DeadlockDetected,
    pgerrors.LockNotAvailable,
)
#: SQLSTATE classes of a connection that is gone, whatever the client saw:
#: connection exceptions, and the server shutting the session down.
_LOST_STATES = ("08", "57P")


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


class TryAgain(Exception):
    """A transaction of which nothing stands, worth trying again."""

    def __init__(self, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
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
    mark (``Transaction.finish``): a cursor over them."""

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


class Transaction:
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
        mark: Mark | None = None,
    ) -> None:
        self._db = db
        self._conn = conn
        # The mark a write leaves (``_MARK``), by which a lost answer to its
        # COMMIT is asked for; and until when it may be asked.
        self._mark = mark
        # What begins it, sent with its first statement: a write's lock,
        # clock and mark (``BEGIN_SERIAL``, ``BEGIN_FENCED``), or a read's snapshot.
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
            if not (is_lost(self._conn, e) or e.sqlstate is None):
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


def is_lost(conn: psycopg.Connection[Any], e: psycopg.Error) -> bool:
    """Whether ``e`` means the connection is gone (or no longer to be trusted)."""
    state = e.sqlstate or ""
    return conn.closed or conn.broken or state.startswith(_LOST_STATES)


def rollback(conn: psycopg.Connection[Any]) -> None:
    if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
