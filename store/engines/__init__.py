"""The engines under the store, and what every one of them gives it:
transactions run as functions (:class:`Database`), on a connection whose
statements are written once for both dialects (:class:`Tx`).

The SQL of the store's operations is the dialect SQLite and PostgreSQL
share: ``?`` placeholders (``?1``, ``?2``: numbered, each usable several
times), ``RETURNING``, ``count(*) FILTER (...)``, partial indexes, ``ON
CONFLICT``, and ``store_now()`` for the transaction's time. What differs
(connections, migration through ``store.schema``, placeholders as the
driver wants them, locks, the clock, notices, error mapping) lives in one
module per engine: ``store.engines.sqlite`` and ``store.engines.postgres``.
Where PostgreSQL runs an operation as a server function of the schema
(``Tx.functions``), the operation calls it through the transaction; the
Python path beside it is SQLite's.

An engine imports nothing of the store above this module but its errors,
shapes of no behaviour, and the schema it migrates.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, Protocol, TypeVar

from ..errors import StoreError
from ..schema import VERSION

__all__ = [
    "CANCELLED",
    "EVENT",
    "LOCKS",
    "RESYNC",
    "TOLD",
    "WORK",
    "Cursor",
    "Database",
    "Synchronous",
    "Tracer",
    "Tx",
    "check_not_newer",
    "check_readable",
    "in_list",
    "traced",
    "values",
]

Synchronous = Literal["NORMAL", "FULL"]

T = TypeVar("T")

#: The notices of ``Ledger.subscribe``: a job was cancelled (its id follows).
CANCELLED = "cancel:"
#: A job waits for a runner with room (submitted past ``max_live``, or released).
WORK = "work"
#: Notices may have been lost: look at the store.
RESYNC = "resync"
#: Events were written (``store.events``): watchers read what is new.
EVENT = "event"
#: Events were written, and these are they (a JSON array of ``[seq, kind,
#: id, at, data]`` follows).
TOLD = "event:"


class Cursor(Protocol):
    """The result of one statement (``sqlite3.Cursor`` and psycopg's agree)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Tx(Protocol):
    """One open transaction: run statements, and read the store's clock.

    ``now`` is the time of the transaction, from the store's one clock (the
    database server's on PostgreSQL, so that hosts whose clocks disagree
    still agree on leases, heartbeats and FIFO order); it is the same for
    every statement of the transaction.
    """

    @property
    def now(self) -> float: ...

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...

    def finish(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        """Run the transaction's last statement; where the engine can, its
        COMMIT goes in the same round trip (PostgreSQL). Nothing may follow."""
        ...

    def locking(self, *, skip: bool = False) -> str:
        """The clause that ends a SELECT whose rows this transaction locks
        until it ends, in the order the SELECT returns them (``skip``: it
        passes over rows another transaction holds). Empty where the engine
        has one writer at a time (SQLite): its rows need no lock of their own."""
        ...

    def indexed(self, index: str) -> str:
        """The clause that makes a SELECT read its table through ``index``,
        placed after the table's name, where the engine's planner would
        choose worse without statistics of the table (SQLite's ``INDEXED
        BY``; a plan picked by a rule of thumb is the one query a table's
        growth turns from microseconds to a scan). Empty where the planner
        keeps statistics (PostgreSQL)."""
        ...

    def try_lock(self, name: str) -> bool:
        """Take the lock of the work called ``name`` (``"evict"``,
        ``"clock"``: see :data:`LOCKS`) for this transaction if no other
        holds it, without waiting: the work one writer does for all, which
        the others skip. Always True where the engine has one writer at a
        time."""
        ...

    def notify(self, notice: str) -> None:
        """Send ``notice`` to the subscribers of every process, once this
        transaction commits (never if it rolls back). An engine that
        cannot sends nothing: its subscribers learn by polling."""
        ...

    def horizon(self, *, bound: bool) -> tuple[int, int] | None:
        """Where writers side by side number events before they commit
        (PostgreSQL), what tells a number missing for good from one a
        transaction in flight may still commit (``store.events``): an id
        below which every transaction has ended, as of this transaction's
        snapshot; and, given ``bound``, an id above that of every
        transaction that had one when the snapshot was taken (it takes an
        id for this one: asked only when a number is missing), else 0. None
        where one writer at a time numbers events as it commits (SQLite)."""
        ...

    @property
    def functions(self) -> bool:
        """Whether the schema's server functions run here (PostgreSQL's
        ``store_create_jobs``, ``store_record``, ``store_queue_run``): an
        operation that has one calls it, in one statement, rather than
        taking its Python path."""
        ...


#: What a store's ``tracer`` is called with: each statement as the store
#: writes it (``?`` placeholders), and its parameters (for ``executemany``,
#: the list of every row's).
Tracer = Callable[[str, Sequence[Any]], None]


class _Traced:
    """A transaction that tells ``tracer`` of each statement before it runs."""

    __slots__ = ("_tracer", "_tx")

    def __init__(self, tx: Tx, tracer: Tracer) -> None:
        self._tx, self._tracer = tx, tracer

    @property
    def now(self) -> float:
        return self._tx.now

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        self._tracer(sql, args)
        return self._tx.execute(sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        rows = list(rows)
        self._tracer(sql, rows)
        return self._tx.executemany(sql, rows)

    def finish(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        self._tracer(sql, args)
        return self._tx.finish(sql, args)

    def locking(self, *, skip: bool = False) -> str:
        return self._tx.locking(skip=skip)

    def indexed(self, index: str) -> str:
        return self._tx.indexed(index)

    def try_lock(self, name: str) -> bool:
        return self._tx.try_lock(name)

    def notify(self, notice: str) -> None:
        self._tx.notify(notice)

    def horizon(self, *, bound: bool) -> tuple[int, int] | None:
        return self._tx.horizon(bound=bound)

    @property
    def functions(self) -> bool:
        return self._tx.functions


class Database(abc.ABC):
    """An opened store location. Safe to share between threads.

    :meth:`write` and :meth:`read` run a function inside one transaction and
    return what it returns: commit on success, roll back on any exception
    (which propagates; the engine's own errors as ``StoreError``, a unique
    violation as ``Conflict``). The function may be run more than once,
    when the engine meets contention it can only resolve by trying again,
    so it changes nothing but the database.

    Each engine takes, besides its location, ``readonly`` and ``clock``:
    the store's clock given to ``store.open`` (seconds since the epoch),
    read for each transaction's time; None for the engine's own (the
    host's, or the server's).
    """

    #: Where the store is: the file path, or the URL without its password.
    path: str
    readonly: bool
    #: Told of every statement the store runs, if set (``Store.tracer``).
    tracer: Tracer | None = None
    #: Whether one transaction writes at a time, whatever it writes (SQLite's
    #: lock of the file): work done in many transactions (a prune) leaves
    #: the others room between them.
    one_writer = False
    #: Whether every transaction's :attr:`Tx.functions` holds: an operation
    #: may choose, before it writes, the one round trip of a server function.
    functions = False

    @property
    def notifies(self) -> bool:
        """Whether :meth:`Tx.notify` reaches the subscribers of every process
        (and a lost notice is followed by ``"resync"``): watchers then look
        at the store when told, rather than by a short poll. (It may turn
        False while the store is open: never back.)"""
        return False

    @abc.abstractmethod
    def write(self, fn: Callable[[Tx], T], *, fenced: bool = False) -> T:
        """Run ``fn`` in a transaction that may write. Serial writers take
        turns on one lock of the whole store (the run queue's order needs
        it); a ``fenced`` one takes none: its own statements keep it correct
        (the rows it decides on locked with ``Tx.locking``, the lease it
        writes under named in its predicates), and it writes the rows that
        every such write updates last. Where the engine has one writer at a
        time (SQLite), every write is serial."""

    @abc.abstractmethod
    def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a transaction that only reads; it waits for no writer."""

    @abc.abstractmethod
    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(notice)`` for each notice sent from now on (on a
        thread of the engine's; it must not block); returns what cancels
        the subscription. Best effort: a notice can be lost (a connection
        drops), so a subscriber also polls. After a gap, subscribers get
        the notice ``"resync"``."""

    def schema_version(self) -> int:
        """The version of the store's schema now: a newer library may have
        stepped it on since this one opened the store."""
        return self.read(self.read_version)

    @abc.abstractmethod
    def read_version(self, tx: Tx) -> int:
        """The schema's version, read in ``tx``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection; later transactions raise ``StoreError``. Idempotent."""


def traced(tx: Tx, tracer: Tracer | None) -> Tx:
    """``tx``, telling ``tracer`` (if set) of each statement: what each
    engine hands the function a transaction runs."""
    return tx if tracer is None else _Traced(tx, tracer)


#: The locks of :meth:`Tx.try_lock`, by name, and the number each has where
#: the engine numbers its locks (PostgreSQL's advisory locks; a server
#: function that tries one itself is given it).
LOCKS = {"evict": 0x6273746F7265 + 1, "clock": 0x6273746F7265 + 2}


def in_list(column: str, values: Sequence[object]) -> tuple[str, tuple[object, ...]]:
    """``column IN (?, ?, ...)`` for these values, and its arguments; false
    for none (both dialects refuse ``IN ()``)."""
    if not values:
        return "1 = 0", ()
    return f"{column} IN ({', '.join('?' * len(values))})", tuple(values)


#: Rows of one ``VALUES`` list at most (a power of two): a statement binds
#: well under the parameters either engine allows, however many rows a
#: caller has.
VALUES_ROWS = 256


def values(rows: Sequence[Sequence[object]]) -> Iterator[tuple[str, tuple[object, ...]]]:
    """``(VALUES (?, ?), (?, ?)) AS v`` for these rows, and its arguments, a
    chunk of at most ``VALUES_ROWS`` rows at a time, for a lookup that joins
    it (both dialects name its columns ``v.column1``, ``v.column2``, ...).

    Each chunk is padded to a power of two rows by repeating its last row,
    which a lookup answers twice alike: the statement's text then takes one
    of nine shapes, which each engine prepares once and keeps, instead of
    one per number of rows."""
    for start in range(0, len(rows), VALUES_ROWS):
        chunk = list(rows[start : start + VALUES_ROWS])
        chunk += [chunk[-1]] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        row = f"({', '.join('?' * len(chunk[0]))})"
        yield (
            f"(VALUES {', '.join([row] * len(chunk))}) AS v",
            tuple(value for r in chunk for value in r),
        )


def check_not_newer(path: str, version: int) -> None:
    """Refuse a store whose schema is newer than this library's."""
    if version > VERSION:
        raise StoreError(
            f"store {path!r} has schema version {version}, newer than this "
            f"library's {VERSION}: upgrade the library to open it"
        )


def check_readable(path: str, version: int) -> None:
    """Refuse to read a store whose schema is not this library's version."""
    if version < VERSION:
        raise StoreError(
            f"store {path!r} has schema version {version}, older than this library's"
            f" {VERSION}: open it once for writing to upgrade it"
        )
    check_not_newer(path, version)
