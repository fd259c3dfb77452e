"""Batch jobs and their targets: what the runner stores, and eviction.

Every function takes an open transaction's connection (``Database.transaction``)
and runs inside it; the caller owns commit and rollback. A job is always read
with its owner: another owner's job looks exactly like a missing one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import Conflict, NotFound
from .schema import LIVE_JOB, TERMINAL_JOB

__all__ = [
    "JobRow",
    "JobSummary",
    "Stored",
    "TargetOutcome",
    "TargetRow",
    "create_job",
    "end_jobs",
    "evict",
    "find_job",
    "get_job",
    "interrupt",
    "list_jobs",
    "load_jobs",
    "set_job_status",
    "start_jobs",
    "store_targets",
    "total_bytes",
    "touch_job",
]


@dataclass(frozen=True, slots=True)
class TargetRow:
    """One stored target. ``result`` is the JSON text as stored (or None)."""

    pos: int
    ref: str
    status: str
    result: str | None
    error: str | None
    hint: str | None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One stored job with its targets in submit order. Times are epoch seconds."""

    id: str
    owner: str
    status: str
    created_at: float
    updated_at: float
    touched_at: float
    nbytes: int
    targets: tuple[TargetRow, ...]


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    """What to store for one pending target: ``status`` ``done`` or
    ``failed`` with its texts, and, if it ends its job, the job's terminal
    ``job_status``."""

    job_id: str
    pos: int
    status: str
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    job_status: str | None = None

    def __post_init__(self) -> None:
        if self.status not in ("done", "failed"):
            raise ValueError(f"a target ends 'done' or 'failed', not {self.status!r}")
        if self.job_status is not None and self.job_status not in TERMINAL_JOB:
            raise ValueError(f"a job ends {', '.join(TERMINAL_JOB)}, not {self.job_status!r}")

    @property
    def nbytes(self) -> int:
        """UTF-8 bytes of the texts stored with the target."""
        return sum(len(t.encode()) for t in (self.result, self.error, self.hint) if t is not None)


@dataclass(frozen=True, slots=True)
class Stored:
    """What came of storing several outcomes, by their index: ``refused``
    (``NotFound``: the job is gone; ``Conflict``: the target was stored
    already), ``ended`` (their job moved to its ``job_status``), and the
    jobs ``evicted`` meanwhile."""

    refused: dict[int, NotFound | Conflict]
    ended: frozenset[int]
    evicted: list[str]


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One stored job without its targets: how many are in each status."""

    id: str
    owner: str
    status: str
    created_at: float
    updated_at: float
    nbytes: int
    done: int
    failed: int
    pending: int


def create_job(
    conn: sqlite3.Connection,
    job_id: str,
    owner: str,
    refs: Sequence[str],
    now: float,
    *,
    runner_id: str | None = None,
) -> None:
    """Store a new job ``queued`` with every target ``pending``, owned by the
    runner ``runner_id`` (if any)."""
    conn.execute(
        "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, runner_id)"
        " VALUES (?, ?, 'queued', ?, ?, ?, ?)",
        (job_id, owner, now, now, now, runner_id),
    )
    conn.executemany(
        "INSERT INTO targets (job_id, pos, ref) VALUES (?, ?, ?)",
        ((job_id, pos, ref) for pos, ref in enumerate(refs)),
    )


def set_job_status(conn: sqlite3.Connection, job_id: str, status: str, now: float) -> bool:
    """Move a live job to ``status``; a terminal status also touches it.

    Returns False, changing nothing, when the job is gone or already terminal:
    a terminal status is final (a late ``running`` or ``done`` never
    overwrites ``cancelled``).
    """
    if status in TERMINAL_JOB:
        sql = "UPDATE jobs SET status = ?, updated_at = ?, touched_at = ? WHERE id = ?"
        args: tuple[object, ...] = (status, now, now, job_id)
    elif status in LIVE_JOB:
        sql = "UPDATE jobs SET status = ?, updated_at = ? WHERE id = ?"
        args = (status, now, job_id)
    else:
        raise ValueError(f"unknown job status {status!r}")
    cur = conn.execute(sql + " AND status IN ('queued', 'running')", args)
    return cur.rowcount == 1


def store_targets(
    conn: sqlite3.Connection, outcomes: Sequence[TargetOutcome], now: float
) -> dict[int, NotFound | Conflict]:
    """Store the outcomes of pending targets, adding their bytes to their
    jobs' and to the total. Returns, by index in ``outcomes``, those not
    stored: ``NotFound`` when the job is gone (evicted meanwhile),
    ``Conflict`` when that target is no longer pending. Terminal statuses are
    left to :func:`end_jobs`, so that eviction can come between.
    """
    refused: dict[int, NotFound | Conflict] = {}
    added = 0
    for i, o in enumerate(outcomes):
        cur = conn.execute(
            "UPDATE targets SET status = ?, result = ?, error = ?, hint = ?"
            " WHERE job_id = ? AND pos = ? AND status = 'pending'",
            (o.status, o.result, o.error, o.hint, o.job_id, o.pos),
        )
        if cur.rowcount != 1:
            refused[i] = (
                NotFound(f"no job {o.job_id!r}")
                if conn.execute("SELECT 1 FROM jobs WHERE id = ?", (o.job_id,)).fetchone() is None
                else Conflict(f"target {o.pos} of job {o.job_id!r} is not pending")
            )
            continue
        conn.execute(
            "UPDATE jobs SET nbytes = nbytes + ?, updated_at = ? WHERE id = ?",
            (o.nbytes, now, o.job_id),
        )
        added += o.nbytes
    if added:
        conn.execute("UPDATE job_bytes SET total = total + ?", (added,))
    return refused


def start_jobs(conn: sqlite3.Connection, job_ids: Sequence[str], now: float) -> None:
    """Move these jobs from ``queued`` to ``running`` (those in another status
    stay as they are)."""
    if job_ids:
        conn.execute(
            "UPDATE jobs SET status = 'running', updated_at = ?"
            f" WHERE status = 'queued' AND id IN ({', '.join(['?'] * len(job_ids))})",
            (now, *job_ids),
        )


def end_jobs(
    conn: sqlite3.Connection,
    outcomes: Sequence[TargetOutcome],
    refused: Container[int],
    now: float,
) -> frozenset[int]:
    """Move the job of every stored outcome that carries a ``job_status`` to
    it; return the indexes of those that did (not those already terminal)."""
    return frozenset(
        i
        for i, o in enumerate(outcomes)
        if o.job_status is not None
        and i not in refused
        and set_job_status(conn, o.job_id, o.job_status, now)
    )


def total_bytes(conn: sqlite3.Connection) -> int:
    """The stored bytes of every job, live and terminal."""
    (total,) = conn.execute("SELECT total FROM job_bytes").fetchone()
    return int(total)


def evict(conn: sqlite3.Connection, max_bytes: int) -> list[str]:
    """Delete terminal jobs, least recently touched first (creation order breaks
    ties), until the stored bytes are within ``max_bytes`` or no terminal job
    is left. Live jobs are never evicted. Returns the evicted ids, in order.

    Under budget this costs one row read.
    """
    evicted: list[str] = []
    total = total_bytes(conn)
    while total > max_bytes:
        row = conn.execute(
            "SELECT id, nbytes FROM jobs"
            " WHERE status IN ('done', 'failed', 'partial', 'cancelled')"
            " ORDER BY touched_at, seq LIMIT 1"
        ).fetchone()
        if row is None:
            break
        job_id, nbytes = row
        conn.execute("DELETE FROM targets WHERE job_id = ?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        total -= nbytes
        evicted.append(job_id)
    if evicted:
        conn.execute("UPDATE job_bytes SET total = ?", (total,))
    return evicted


def get_job(conn: sqlite3.Connection, job_id: str, owner: str) -> JobRow | None:
    """The job with its targets, or None if there is none of this owner's."""
    row = conn.execute(
        "SELECT id, owner, status, created_at, updated_at, touched_at, nbytes"
        " FROM jobs WHERE id = ? AND owner = ?",
        (job_id, owner),
    ).fetchone()
    return None if row is None else _with_targets(conn, row)


def find_job(conn: sqlite3.Connection, job_id: str) -> JobRow | None:
    """The job with its targets, whoever owns it, or None."""
    row = conn.execute(
        "SELECT id, owner, status, created_at, updated_at, touched_at, nbytes"
        " FROM jobs WHERE id = ?",
        (job_id,),
    ).fetchone()
    return None if row is None else _with_targets(conn, row)


def list_jobs(
    conn: sqlite3.Connection, *, owner: str | None = None, status: str | None = None
) -> list[JobSummary]:
    """Every job (of ``owner``, in ``status``, when given) in creation order."""
    rows = conn.execute(
        "SELECT id, owner, jobs.status, created_at, updated_at, nbytes,"
        " count(*) FILTER (WHERE targets.status = 'done'),"
        " count(*) FILTER (WHERE targets.status = 'failed'),"
        " count(*) FILTER (WHERE targets.status = 'pending')"
        " FROM jobs JOIN targets ON targets.job_id = jobs.id"
        " WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR jobs.status = ?2)"
        " GROUP BY jobs.seq ORDER BY jobs.seq",
        (owner, status),
    )
    return [JobSummary(*row) for row in rows]


def load_jobs(conn: sqlite3.Connection, job_ids: Sequence[str]) -> list[JobRow]:
    """These jobs, with their targets, in creation order."""
    rows: list[Any] = []
    for start in range(0, len(job_ids), 500):
        chunk = job_ids[start : start + 500]
        rows += conn.execute(
            "SELECT seq, id, owner, status, created_at, updated_at, touched_at, nbytes FROM jobs"
            f" WHERE id IN ({', '.join('?' * len(chunk))})",
            chunk,
        ).fetchall()
    return [_with_targets(conn, row[1:]) for row in sorted(rows)]


def interrupt(conn: sqlite3.Connection, job_id: str, hint: str, now: float) -> str:
    """End a live job that no runner will go on with: its pending targets
    ``failed`` with error ``interrupted`` and ``hint``, then its status by its
    targets (all done: ``done``; all failed: ``failed``; else ``partial``).
    Returns that status."""
    error = "interrupted"
    cur = conn.execute(
        "UPDATE targets SET status = 'failed', error = ?, hint = ?"
        " WHERE job_id = ? AND status = 'pending'",
        (error, hint, job_id),
    )
    nbytes = cur.rowcount * len((error + hint).encode())
    conn.execute("UPDATE jobs SET nbytes = nbytes + ? WHERE id = ?", (nbytes, job_id))
    conn.execute("UPDATE job_bytes SET total = total + ?", (nbytes,))
    done, failed = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'failed')"
        " FROM targets WHERE job_id = ?",
        (job_id,),
    ).fetchone()
    status = "done" if not failed else "failed" if not done else "partial"
    set_job_status(conn, job_id, status, now)
    return status


def _with_targets(conn: sqlite3.Connection, row: Any) -> JobRow:
    job_id, owner, status, created_at, updated_at, touched_at, nbytes = row
    targets = tuple(
        TargetRow(*t)
        for t in conn.execute(
            "SELECT pos, ref, status, result, error, hint FROM targets"
            " WHERE job_id = ? ORDER BY pos",
            (job_id,),
        )
    )
    return JobRow(job_id, owner, status, created_at, updated_at, touched_at, nbytes, targets)


def touch_job(conn: sqlite3.Connection, job_id: str, owner: str, now: float) -> bool:
    """Mark the job as just used, so eviction takes it last; False if there is
    none of this owner's."""
    cur = conn.execute(
        "UPDATE jobs SET touched_at = ? WHERE id = ? AND owner = ?", (now, job_id, owner)
    )
    return cur.rowcount == 1
