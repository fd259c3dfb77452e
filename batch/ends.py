"""The ends of jobs other runners hold, as the store's events tell them: what
``Runner.wait``, ``as_completed`` and ``wait_async`` wait on for such a job
(``batch.waits``), instead of looking at the store again and again.

One thread per runner watches the store (``Store.watch``) from the first
wait that finds such a job live until the runner closes, and at each
``job.ended`` of a job waited for tells its waiters (``State.changed``);
a runner whose waits only ever find jobs it holds, or jobs ended
already, reads no events. A job's end is seen as
soon as its event is: on PostgreSQL as its notice arrives, on SQLite
within the store's poll.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import store

if TYPE_CHECKING:
    from .state import State

__all__ = ["RETRY", "Ends"]

log = logging.getLogger("batch")

#: Seconds before watching again after the store failed to be read.
RETRY = 0.5


class Ends:
    """The watching thread of one runner's waits for jobs held elsewhere.

    ``_lock`` guards ``_watch`` (the watch the thread reads, None before the
    first wait), ``_thread`` and ``_stopped``; it is never taken with the
    runner's lock held. The count ``told`` is guarded by the runner's lock:
    it moves at each end told, so a waiter that read the store notes it
    before, and looks again rather than waits if it moved meanwhile.
    """

    def __init__(self, s: State[Any]) -> None:
        self._s = s
        self._lock = threading.Lock()
        self._watch: store.events.Watch | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self.told = 0

    @property
    def watching(self) -> bool:
        """Whether the thread was started (ends committed since are told)."""
        with self._lock:
            return self._watch is not None

    def start(self) -> None:
        """Watch from now on, if not watching yet: an end committed after
        this returns is told, but one of a transaction already in flight
        when the store's reader began (PostgreSQL), which the waiter's next
        look (``WAIT_POLL``) finds. Called without the runner's lock (it
        reads the store); raises ``StoreError`` if the store cannot be read."""
        with self._lock:
            if self._watch is not None or self._stopped.is_set():
                return
            self._watch = self._s.store.watch()
            self._thread = threading.Thread(target=self._run, name="batch-ends", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None) -> None:
        """Stop watching (the runner closes). Idempotent."""
        with self._lock:
            self._stopped.set()
            watch, thread = self._watch, self._thread
        if watch is not None:
            watch.close()
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        with self._lock:
            watch: store.events.Watch | None = self._watch
        assert watch is not None
        since: int | None = watch.seq
        while not self._stopped.is_set():
            try:
                if watch is None:
                    with self._lock:
                        if self._stopped.is_set():
                            return
                        watch = self._watch = self._s.store.watch(since)
                for event in watch:
                    since = event.seq
                    if event.kind == "job.ended":
                        self._tell(event.id)
            except store.EventsPruned:
                # Ends were missed: every waiter looks at the store again.
                self._tell(None)
                since = None
            except store.StoreError as e:
                log.warning("cannot watch the store for the ends of jobs: %s", e)
                self._stopped.wait(RETRY)
            watch = None

    def _tell(self, job_id: str | None) -> None:
        """Tell the waiters of ``job_id`` (None: all) that it ended."""
        s = self._s
        with s.lock:
            if job_id is None:
                self.told += 1
                s.done.notify_all()
                for wakes in list(s.watchers.values()):
                    for wake in wakes:
                        wake()
                s.watchers.clear()
            else:
                # Counted whoever waits: a waiter between its look at the
                # store and its wait is not in ``waited`` yet.
                self.told += 1
                if job_id in s.waited or job_id in s.watchers:
                    s.changed(job_id)
