"""The thread that folds an SQLite store's write-ahead log into the file.

SQLite folds the log (a checkpoint) in the commit that finds it past a
thousand pages, and that commit waits while the pages are copied and the
file synced: on a big file, near a tenth of a second, which every other
user of the handle waits out too (a runner's beat, a due job's start).
A handle that writes folds from a thread of its own as well, on a
connection of its own, a passive checkpoint at most every ``FOLD_EVERY``
seconds while writes go on: it copies what no reader still needs while
writers go on appending, so that what a commit is left to fold, should it
get past the thousand pages, is a few pages. The last connection to close
folds what is left, as always.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

__all__ = ["FOLD_EVERY", "Folder"]

log = logging.getLogger("store")

#: Seconds between folds while writes go on.
FOLD_EVERY = 0.2


class Folder:
    """Folds the log of the file at ``path`` after writes (:meth:`wrote`),
    at most every ``FOLD_EVERY`` seconds, until :meth:`close`.

    The thread starts with the first write, so a handle that only reads
    never has one. ``_cond`` guards ``_due`` (a write since the last fold
    began), ``_closed`` and ``_thread``."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._cond = threading.Condition()
        self._due = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def wrote(self) -> None:
        """A write was committed: fold the log soon."""
        with self._cond:
            if self._due or self._closed:
                return
            self._due = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"store-wal {self._path}", daemon=True
                )
                self._thread.start()
            else:
                self._cond.notify()

    def close(self) -> None:
        """Stop folding (the last connection to close folds what is left).
        Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(
            self._path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            while True:
                with self._cond:
                    while not self._due and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    # Writes go on meanwhile: one fold for all of them.
                    self._cond.wait(FOLD_EVERY)
                    if self._closed:
                        return
                    self._due = False
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    # A file gone or locked for long: the next write tries again.
                    log.debug("cannot fold the log of %s", self._path, exc_info=True)
        finally:
            conn.close()
