"""PostgreSQL's notices: the one connection of a store that LISTENs, and
how it learns that notices do not reach it (``store.engines.postgres``)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from .. import EVENT, RESYNC
from .tx import CHANNEL, CONNECT_TIMEOUT

if TYPE_CHECKING:
    from . import PostgresDatabase

log = logging.getLogger("store")

#: The most bytes of events a notice carries (a notice's payload is under
#: 8,000 bytes).
TOLD_BYTES = 7_900
#: Seconds the listener waits for a notice before it looks whether to stop.
LISTEN_POLL = 0.25
#: Seconds before the listener connects again after losing its connection.
RETRY_LISTEN = 1.0
#: Seconds the listener waits for the notice it sent itself (see
#: ``Listener``): a notice takes a round trip or two.
PROBE_WAIT = 2.0


class Listener:
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
