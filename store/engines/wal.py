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
import os
import sqlite3
import threading
import urllib.parse

__all__ = ["FOLD_EVERY", "IDLE_FOR", "Folder"]

log = logging.getLogger("store")

#: Seconds between folds while writes go on.
FOLD_EVERY = 0.2
#: Seconds without a write after which the thread ends (the next write
#: starts another): a handle that stopped writing, or that was dropped
#: without ``close``, keeps no thread.
IDLE_FOR = 60.0


class Folder:
    """Folds the log of the file at ``path`` after writes (:meth:`wrote`),
    at most every ``FOLD_EVERY`` seconds, until :meth:`close`.

    The thread starts with a write and ends after ``IDLE_FOR`` seconds
    without one, so a handle that only reads never has one. ``_cond``
    guards ``_due`` (a write since the last fold began), ``_closed`` and
    ``_thread`` (the running thread, None once it is ending)."""

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
        try:
            # mode=rw: a file removed meanwhile is not made again, empty.
            uri = f"file:{urllib.parse.quote(os.path.abspath(self._path))}?mode=rw"
            conn = sqlite3.connect(uri, timeout=self._busy_timeout, isolation_level=None, uri=True)
        except sqlite3.Error:
            log.debug("cannot open %s to fold its log", self._path, exc_info=True)
            self._end()
            return
        try:
            while self._next():
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    # A file gone or locked for long: the next write tries again.
                    log.debug("cannot fold the log of %s", self._path, exc_info=True)
        finally:
            conn.close()

    def _next(self) -> bool:
        """Wait until a fold is due, and ``FOLD_EVERY`` more seconds for the
        writes that go on meanwhile: True then; False for the thread to end
        (closed, or idle ``IDLE_FOR`` seconds)."""
        with self._cond:
            while not self._due:
                if self._closed or not self._cond.wait(IDLE_FOR):
                    self._end()
                    return False
            self._cond.wait(FOLD_EVERY)
            if self._closed:
                self._end()
                return False
            self._due = False
            return True

    def _end(self) -> None:
        """The thread ends: the next write starts another."""
        with self._cond:
            self._due, self._thread = False, None
