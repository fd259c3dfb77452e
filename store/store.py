"""``Store``: the handle users and the runner hold. Each method is one
transaction, handed to the module that owns the operation."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from . import jobs
from .db import Database, Synchronous
from .jobs import JobRow

__all__ = ["Store", "open"]


class Store:
    """A store file, opened. Safe to share between threads; several ``Store``
    objects, in one process or several, may open the same file.

    Use :func:`open` to get one. Closing is idempotent; a closed store raises
    ``StoreError`` on every call.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    @property
    def path(self) -> str:
        """The file this store was opened on."""
        return self._db.path

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<store.Store {self.path!r}>"

    # -- batch jobs ---------------------------------------------------------

    def create_job(self, job_id: str, owner: str, refs: Sequence[str]) -> None:
        """Store a new job, ``queued``, with its targets ``pending`` in order."""
        with self._db.transaction() as conn:
            jobs.create_job(conn, job_id, owner, refs, time.time())

    def set_job_status(self, job_id: str, status: str) -> bool:
        """Move a live job to ``status``; False if it is gone or already terminal."""
        with self._db.transaction() as conn:
            return jobs.set_job_status(conn, job_id, status, time.time())

    def store_target(
        self,
        job_id: str,
        pos: int,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        hint: str | None = None,
        max_bytes: int | None = None,
        job_status: str | None = None,
    ) -> list[str]:
        """Store one target's outcome; then, given ``max_bytes``, evict terminal
        jobs past that budget; then, given ``job_status``, move the job to it.
        All in one transaction; returns the evicted ids.

        Raises ``NotFound`` if the job is gone, ``Conflict`` if the target was
        already stored; nothing is written then.
        """
        with self._db.transaction() as conn:
            now = time.time()
            jobs.store_target(conn, job_id, pos, status, now, result=result, error=error, hint=hint)
            evicted = [] if max_bytes is None else jobs.evict(conn, max_bytes)
            if job_status is not None:
                jobs.set_job_status(conn, job_id, job_status, now)
            return evicted

    def get_job(self, job_id: str, owner: str) -> JobRow | None:
        """The job and its targets, or None if ``owner`` has no such job."""
        with self._db.transaction(write=False) as conn:
            return jobs.get_job(conn, job_id, owner)

    def touch_job(self, job_id: str, owner: str) -> bool:
        """Mark the job used now, so eviction takes it last; False if unknown."""
        with self._db.transaction() as conn:
            return jobs.touch_job(conn, job_id, owner, time.time())

    def evict(self, max_bytes: int) -> list[str]:
        """Evict terminal jobs, least recently touched first, down to ``max_bytes``."""
        with self._db.transaction() as conn:
            return jobs.evict(conn, max_bytes)

    def total_bytes(self) -> int:
        """The stored bytes of every job, live and terminal."""
        with self._db.transaction(write=False) as conn:
            return jobs.total_bytes(conn)


def open(path: str | Path, *, synchronous: Synchronous = "NORMAL") -> Store:
    """Open (creating or migrating) the store file at ``path``.

    ``synchronous="NORMAL"`` (the default) survives a crash of the process;
    ``"FULL"`` also survives power loss, at the cost of an fsync per commit.
    Raises ``StoreError`` if the file cannot be used, naming it.
    """
    return Store(Database(path, synchronous=synchronous))
