"""What happens on the store, as a stream: ``Store.watch``.

Each change a watcher may want writes an event row in the transaction that
makes it: triggers of the schema write them, whichever statement makes the
change (``store.schema``; PostgreSQL's in ``store.engines.postgres``). So an event
is there if and only if its change committed, and the events of one job or
run come in the order of its changes.

Order. On SQLite one writer at a time numbers the events (``seq``) as it
commits: commit order, without gaps that ever fill. On PostgreSQL writers
commit side by side, and a number is drawn before its transaction commits:
a number can show up after a greater one. A reader never passes over a
number it has not seen until every transaction that could still commit it
has ended (:meth:`Feed._settle`): after that the gap is for good (a
transaction that rolled back). Numbers are drawn after the rows of the
change are locked, so two changes of one job or run are numbered in the
order they committed.

Waking. One thread per ``Store`` takes what is new for all its watchers
(a hundred watchers cost the store one reader). On PostgreSQL the notice
of a commit that wrote events carries them (when they fit in one): the
thread reads the store only when a notice did not, when a number is still
missing after :data:`GAP_POLL` seconds, and every :data:`TOLD_POLL`
seconds without a notice (one may be lost). On SQLite it reads every
:data:`POLL` seconds.

Events older than :data:`KEPT` seconds are pruned by the runners' beats,
:data:`PRUNE_ROWS` at a time; a watch from a number pruned since raises
``EventsPruned``.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .engines import EVENT, RESYNC, TOLD, Database, Tx
from .errors import EventsPruned, StoreError
from .shapes import Event

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["KEPT", "KINDS", "POLL", "PRUNE_ROWS", "TOLD_POLL", "Feed", "Watch", "prune"]

log = logging.getLogger("store")

#: The kinds of events, in the order of a job's or a run's life.
KINDS = (
    "job.submitted",
    "job.started",
    "target.stored",
    "job.ended",
    "run.queued",
    "run.started",
    "run.ended",
)
#: Seconds an event is kept.
KEPT = 3600.0
#: Events pruned in one transaction at most: with a beat every second or
#: two, some ten thousand events a second are kept up with.
PRUNE_ROWS = 20_000
#: Seconds between looks for new events where no notice says there are
#: some (SQLite).
POLL = 0.05
#: Seconds between looks where notices say so (PostgreSQL): in case one is
#: lost (a dropped connection is followed by a ``resync`` notice).
TOLD_POLL = 1.0
#: Seconds at least between two times watchers are told of new events
#: (PostgreSQL): under a stream of commits they wake a hundred times a
#: second, not once a commit.
TOLD_SPACING = 0.01
#: Seconds between looks while a number is missing that a transaction in
#: flight may still commit (it commits within milliseconds).
GAP_POLL = 0.002
#: Seconds a missing number is waited for before it is passed over.
GAP_TIMEOUT = 30.0
#: Events read in one transaction at most.
READ_ROWS = 1000
#: Events a feed keeps in memory at most for its watchers (at each read of
#: the store it lets go of those every open watch was given); one that
#: falls further behind reads the store.
RECENT = 10_000

_SELECT = "SELECT seq, kind, id, at, data FROM events"

#: A number missing: the first one, the bound of the transactions that may
#: still commit it (0: not known yet), and since when (monotonic seconds).
Gap = tuple[int, int, float]


def _ended(gap: Gap, horizon: tuple[int, int], now: float) -> bool:
    """Whether the transactions ``gap`` waits for have ended (or it has
    waited :data:`GAP_TIMEOUT`)."""
    return horizon[0] >= gap[1] or now - gap[2] >= GAP_TIMEOUT


def _events(rows: list[tuple[int, str, str, float, str]]) -> list[Event]:
    return [Event(seq, kind, id_, at, json.loads(data)) for seq, kind, id_, at, data in rows]


def prune(tx: Tx, before: float) -> int:
    """Delete up to :data:`PRUNE_ROWS` of the oldest events written before
    ``before``, but never the newest (SQLite numbers the next one past it);
    how many. The oldest event is read first: a store whose oldest is
    young costs one row read."""
    oldest = tx.execute(f"{_SELECT} ORDER BY seq LIMIT 1").fetchone()
    if oldest is None or oldest[3] >= before:
        return 0
    gone = [
        seq
        for (seq,) in tx.execute(
            "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE at < ?"
            " AND seq < (SELECT max(seq) FROM events) ORDER BY seq LIMIT ?) RETURNING seq",
            (before, PRUNE_ROWS),
        )
    ]
    if gone:
        tx.execute("UPDATE events_pruned SET below = ? WHERE below < ?", (max(gone), max(gone)))
    return len(gone)


class Feed:
    """The events of one store as this process reads them, for every watcher
    of one ``Store``: one thread reads while any watcher is left.

    ``_cond`` guards ``_seq`` (every number at or below it is settled, but
    for those at or below ``_unsettled[0]`` while that is not None: read,
    or missing for good), ``_recent`` (the events read last, up to
    ``_seq``, in order), ``_from`` (every settled event above it is in
    ``_recent``), ``_read_to`` (by the id of each open watch, the last
    number it was given: each read of the store lets go of the events of
    ``_recent`` every watch has),
    ``_watchers``, ``_thread`` (the reading thread; another
    one left over from before stops at its next look), ``_woken`` (a
    notice came), ``_told`` (the events notices carried, above ``_seq``),
    ``_look`` (a read of the store is due), ``_missing_since`` (when the
    thread found a number missing among ``_told``), ``_gap`` and
    ``_failed`` (what the last read raised, if it failed). Watchers wait on
    it for ``_seq`` to move; the reading thread waits on ``_woke`` (its
    lock) for a notice, so that a notice wakes no watcher.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._woke = threading.Condition(lock)
        self._seq = self._from = 0
        self._recent: collections.deque[Event] = collections.deque(maxlen=RECENT)
        self._read_to: dict[int, int] = {}
        self._watchers = 0
        self._thread: threading.Thread | None = None
        self._woken = False
        self._look = False
        self._told: dict[int, Event] = {}
        self._missing_since: float | None = None
        self._failed: StoreError | None = None
        self._unsubscribe: Callable[[], None] | None = None
        #: The gap being waited out (``_settle``).
        self._gap: Gap | None = None
        #: When the thread started, the last number it found, the bound of
        #: the transactions that may still commit a number below it, and
        #: when: until they have ended, every watch waits (one from now
        #: starts at that number, one from an earlier number reads below it).
        self._unsettled: Gap | None = None
        self._closed = False

    def watch(self, since: int | None, timeout: float | None) -> Watch:
        """A :class:`Watch` of the events after ``since`` (None: from now on)."""
        if since is not None and (not isinstance(since, int) or isinstance(since, bool)):
            raise TypeError(f"since is an event's seq (an int) or None, not {since!r}")
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0
        ):
            raise ValueError(f"timeout is seconds >= 0 or None, not {timeout!r}")
        start = self._join()
        # From now on: no wait for the transactions in flight when the
        # reader started (one may be held open for long, as a stopped
        # process holds it); an event of theirs below the start is not told
        # to a watch from now (``Store.watch`` says so).
        watch = Watch(self, start if since is None else since, timeout)
        with self._cond:
            self._read_to[id(watch)] = watch.seq
        return watch

    def close(self) -> None:
        """The store closed: every watch raises ``StoreError``, the thread stops."""
        with self._cond:
            self._closed = True
            self._thread = None
            self._cond.notify_all()
            self._woke.notify_all()

    def next(self, watch: Watch, timeout: float | None) -> list[Event]:
        """The settled events after ``watch.seq`` (a batch of them), waiting
        up to ``timeout`` for one; none once it passes, or once the watch
        is closed."""
        seq = watch.seq
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if not watch.open:
                    return []
                if self._closed:
                    raise StoreError("the store is closed")
                if self._failed is not None:
                    raise self._failed
                ready = self._unsettled is None or seq >= self._unsettled[0]
                if ready and self._seq > seq:
                    if seq >= self._from:
                        given = _after(self._recent, seq)
                        self._read_to[id(watch)] = given[-1].seq
                        return given
                    upto = self._seq
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)
        # Behind what is kept in memory: settled events, read at once.
        return self._db.read(lambda tx: _behind(tx, seq, upto))

    # -- the reading thread -------------------------------------------------

    def _join(self) -> int:
        """Count one more watcher, and return where the events stand; the
        first starts the thread, once it has read that."""
        with self._cond:
            if self._closed:
                raise StoreError("the store is closed")
            self._watchers += 1
            if self._thread is not None:
                return self._seq
        try:
            seq, horizon = self._db.read(self._last)
            # Outside the lock: subscribing may wait for the listener.
            unsubscribe: Callable[[], None] | None = self._db.subscribe(self._notice)
        except BaseException:
            self._drop()
            raise
        with self._cond:
            if self._thread is None and not self._closed:
                self._seq = self._from = seq
                self._recent.clear()
                self._gap = self._failed = self._missing_since = None
                self._told.clear()
                self._look = True
                self._unsettled = None if horizon is None else (seq, horizon[1], time.monotonic())
                self._unsubscribe, unsubscribe = unsubscribe, None
                self._thread = threading.Thread(target=self._read, name="store-events", daemon=True)
                self._thread.start()
            start = self._seq
        if unsubscribe is not None:  # another watcher started the thread meanwhile
            unsubscribe()
        return start

    def leave(self, watch: Watch) -> None:
        """``watch`` closes: wake its reader, if one waits."""
        with self._cond:
            if not watch.open:
                return
            watch.open = False
            self._read_to.pop(id(watch), None)
            self._cond.notify_all()
        self._drop()

    def _drop(self) -> None:
        """Count one watcher less; the last stops the thread."""
        with self._cond:
            self._watchers -= 1
            if self._watchers:
                return
            self._thread = None
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            self._cond.notify_all()
            self._woke.notify_all()
        if unsubscribe is not None:
            unsubscribe()

    def _last(self, tx: Tx) -> tuple[int, tuple[int, int] | None]:
        (seq,) = tx.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        return seq, tx.horizon(bound=True)

    def _notice(self, notice: str) -> None:
        told = None
        if notice.startswith(TOLD):
            try:
                told = _events(json.loads(notice.removeprefix(TOLD)))
            except (ValueError, TypeError):
                log.warning("store events: a notice that is not events: %.80r", notice)
        elif notice not in (EVENT, RESYNC):
            return
        with self._cond:
            if told is None:
                self._look = True
            else:
                self._told.update((e.seq, e) for e in told if e.seq > self._seq)
            if not self._woken:  # the first notice since the thread waited for one
                self._woken = True
                self._woke.notify_all()

    def _take_told(self) -> None:
        """Settle the events notices told that follow ``_seq`` (lock held)."""
        settled: list[Event] = []
        while (event := self._told.pop(self._seq + 1 + len(settled), None)) is not None:
            settled.append(event)
        if settled:
            self._add(settled)

    def _add(self, settled: list[Event]) -> None:
        """Keep ``settled`` (the events after ``_seq``, in order) for the
        watchers, and let go of those every watch was given (lock held)."""
        recent = self._recent
        recent.extend(settled)
        self._seq = settled[-1].seq
        if len(recent) == recent.maxlen:
            self._from = recent[0].seq - 1
        read = min(self._read_to.values(), default=self._seq)
        while recent and recent[0].seq <= read:
            self._from = recent.popleft().seq
        self._cond.notify_all()

    def _read(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                if self._thread is not me:
                    return
                if not self._due(me):
                    continue
                self._woken = self._look = False
                seq, gap = self._seq, self._gap
            failed = None
            try:
                rows, horizon = self._db.read(functools.partial(self._new, seq=seq, gap=gap))
            except StoreError as e:
                failed = e
            with self._cond:
                if self._thread is not me:
                    return
                self._failed = failed
                if failed is None:
                    now = time.monotonic()
                    settled, self._gap = _settle(seq, rows, horizon, self._gap, now)
                    if self._unsettled and horizon and _ended(self._unsettled, horizon, now):
                        self._unsettled = None
                    if settled:
                        self._add(settled)
                        self._told = {k: e for k, e in self._told.items() if k > self._seq}
                    if settled and len(rows) == READ_ROWS:
                        self._look = True  # more to read
                        continue
                    rows = settled = []  # not held while this thread waits
                self._cond.notify_all()
                if failed is not None or not self._told_next():
                    self._look = not self._woke.wait_for(
                        lambda: self._woken or self._thread is not me,
                        GAP_POLL if self._gap is not None else POLL,
                    )

    def _told_next(self) -> bool:
        """Whether notices will tell what is new (lock held): on PostgreSQL,
        once nothing is left to settle."""
        return self._db.notifies and self._gap is None and self._unsettled is None

    def _due(self, me: threading.Thread) -> bool:
        """Whether to read the store now (lock held). Where notices tell
        what is new, settle that instead and wait for the next: read only
        when a number is missing for longer than a commit takes, when a
        notice did not carry its events, or when none came for
        :data:`TOLD_POLL` seconds (one may be lost)."""
        if self._look or not self._told_next():
            return True
        seq = self._seq
        self._take_told()
        if self._seq != seq:
            # Watchers told: the commits that follow gather meanwhile,
            # their notices waking no one.
            self._woken = True
            self._woke.wait_for(lambda: self._thread is not me, TOLD_SPACING)
            return False
        if not self._told:
            self._missing_since = None
            timeout = TOLD_POLL
        else:
            now = time.monotonic()
            self._missing_since = self._missing_since or now
            timeout = self._missing_since + GAP_POLL - now
            if timeout <= 0:
                return True
        self._woken = False
        self._look = not self._woke.wait_for(lambda: self._woken or self._thread is not me, timeout)
        return False

    def _new(
        self, tx: Tx, *, seq: int, gap: Gap | None
    ) -> tuple[list[Event], tuple[int, int] | None]:
        events = _events(
            tx.execute(f"{_SELECT} WHERE seq > ? ORDER BY seq LIMIT ?", (seq, READ_ROWS)).fetchall()
        )
        # A bound costs a transaction id: asked for a number newly missing only.
        missing = _first_missing(seq, events)
        new = missing is not None and (gap is None or gap[0] != missing or not gap[1])
        return events, tx.horizon(bound=new)


class Watch(Iterator[Event]):
    """The events after a number, in order, as they commit (``Store.watch``):
    an iterator that ends once ``timeout`` seconds pass without one.
    ``seq`` is the number of the last event it gave (where a new watch
    resumes). Close it (or leave a ``with`` block) to stop watching, from
    any thread: a reader waiting in it returns at once. It also stops once
    unreferenced.

    Read by one thread at a time; ``open`` is guarded by the feed's lock."""

    def __init__(self, feed: Feed, seq: int, timeout: float | None) -> None:
        self._feed = feed
        self.seq = seq
        self._timeout = timeout
        self._batch: collections.deque[Event] = collections.deque()
        self.open = True

    def __next__(self) -> Event:
        event = self.get(self._timeout)
        if event is None:
            self.close()
            raise StopIteration
        return event

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, waiting up to ``timeout`` seconds for it (None:
        for ever); None if none came, or once the watch is closed. The
        watch stays open: for a loop that also looks at something else."""
        if not self._batch:
            try:
                self._batch.extend(self._feed.next(self, timeout))
            except BaseException:
                self.close()
                raise
            if not self._batch:
                return None
        event = self._batch.popleft()
        self.seq = event.seq
        return event

    def close(self) -> None:
        """Stop watching. Idempotent."""
        self._feed.leave(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _after(recent: collections.deque[Event], seq: int) -> list[Event]:
    """The events of ``recent`` after ``seq``, read from the newest end: a
    watcher that keeps up costs what it is given."""
    new = []
    for event in reversed(recent):
        if event.seq <= seq:
            break
        new.append(event)
    new.reverse()
    return new


def _behind(tx: Tx, seq: int, upto: int) -> list[Event]:
    """The events after ``seq`` up to ``upto`` (all settled), a batch of them."""
    (below,) = tx.execute("SELECT below FROM events_pruned").fetchone()
    if below > seq:
        raise EventsPruned(
            f"events after {seq} were pruned (those up to {below} are gone): watch from"
            " None, and read the store's state afresh"
        )
    return _events(
        tx.execute(
            f"{_SELECT} WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
            (seq, upto, READ_ROWS),
        ).fetchall()
    )


def _first_missing(seq: int, events: list[Event]) -> int | None:
    """The first number missing among ``events`` (read after ``seq``, in
    order), if any is."""
    for event in events:
        if event.seq != seq + 1:
            return seq + 1
        seq = event.seq
    return None


def _settle(
    seq: int,
    events: list[Event],
    horizon: tuple[int, int] | None,
    gap: Gap | None,
    now: float,
) -> tuple[list[Event], Gap | None]:
    """Those of ``events`` (read after ``seq``, in order) that are settled,
    and the gap still waited out (``Gap``). ``horizon``: ``Database.horizon``
    of the read, its bound asked for when a number is newly missing (0 when
    not asked); None where numbers come in commit order. ``now``: the
    monotonic time of the read.

    A number missing before one that was read was drawn before it, by a
    transaction that had its id already (numbers are drawn after the
    change's own writes): below the bound of a read that found it missing.
    Once a read's first id reaches that bound, that transaction has ended,
    and the number is missing for good. One missing for :data:`GAP_TIMEOUT`
    seconds is passed over all the same (logged): a transaction that long
    in flight is not the store's, and must not stall every watcher."""
    settled: list[Event] = []
    for event in events:
        if horizon is not None and event.seq != seq + 1:
            if gap is None or gap[0] != seq + 1:
                gap = (seq + 1, horizon[1], now)
            elif not gap[1]:
                gap = (gap[0], horizon[1], gap[2])
            if not gap[1]:
                return settled, gap  # no bound yet: the next read asks for one
            if horizon[0] < gap[1]:
                if now - gap[2] < GAP_TIMEOUT:
                    return settled, gap
                log.warning(
                    "store events: number %d still missing after %g s: passed over",
                    gap[0],
                    now - gap[2],
                )
        gap = None
        settled.append(event)
        seq = event.seq
    return settled, gap
