"""The batch jobs, a package of their own: their tables (jobs, targets,
runners, pauses, upstreams) and operations, for ``Store`` and the runner's
``Ledger``. Here, the jobs and their targets: what the runner stores, and
eviction; beside it, a batch of outcomes (``outcomes``), the fence of a
lease (``fence``), the runners and their leases (``runners``), jobs that
start later (``later``), pauses and the upstreams runners share.

Every function takes an open transaction (``Tx``, from ``Database.write``
or ``read``) and runs inside it; the caller owns commit and rollback. A job
is always read with its owner: another owner's job looks exactly like a
missing one.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..engines import WORK, Tx, in_list
from ..errors import NotFound
from ..shapes import JobRow, JobSummary, Later, Lease, NewJobs, TargetRow
from ..states import (
    ENDED_SQL,
    JOB_STATUSES,
    LIVE_JOB,
    LIVE_SQL,
    TARGET_STATES,
    TERMINAL_JOB,
    JobStatus,
    TargetState,
    ended_status,
)
from .fence import fenced, lease_args

__all__ = [
    "JOB_COLUMNS",
    "add_bytes",
    "byte_slot",
    "cancel_job",
    "create_jobs",
    "evict",
    "evict_past",
    "find_job",
    "find_targets",
    "get_job",
    "interrupt",
    "job_status",
    "list_jobs",
    "load_jobs",
    "set_job_status",
    "total_bytes",
    "touch_job",
    "with_targets",
]


#: A LIMIT that takes every row (both dialects accept it; PostgreSQL refuses -1).
NO_LIMIT = 2**62

# The statements that move one job, made once.
_END_JOB = (
    "UPDATE jobs SET status = ?1, updated_at = ?2, touched_at = ?2, lease_owner = NULL"
    f" WHERE id = ?3 AND status IN {LIVE_SQL}" + fenced(4, 5)
)
_MOVE_JOB = (
    "UPDATE jobs SET status = ?1, updated_at = ?2"
    f" WHERE id = ?3 AND status IN {LIVE_SQL}" + fenced(4, 5)
)


def create_jobs(tx: Tx, new: NewJobs) -> list[str]:
    """Store ``new`` jobs and their targets, ``queued`` and ``pending``,
    and tell the runners if any waits for room. Jobs deferred by
    ``new.later`` wait for no runner before ``later.not_before``, nor
    before the jobs of ``owner`` it names in ``later.after`` all ended
    (``NotFound`` for one there is not, and nothing is stored).

    Returns the id each job has in the store: its own, or, if the owner
    has a job with its key already (stored before, by any process, or
    earlier in ``new``), that job's, and then nothing of it is stored. The
    unique index decides.

    Where the schema's functions run (PostgreSQL), one call of
    ``store_create_jobs``, sent with the transaction's BEGIN and COMMIT:
    one round trip. Else a row of SQL each (``executemany``: a loop in C)."""
    if tx.functions:
        return _create_on_server(tx, new)
    ids = _create_here(tx, new, tx.now)
    if new.wait_for_room:
        tx.notify(WORK)
    return ids


def _create_on_server(tx: Tx, new: NewJobs) -> list[str]:
    """:func:`create_jobs` by one call of ``store_create_jobs`` (schema step
    19), the transaction's one statement. The jobs go as one JSON text."""
    later = new.later or Later()
    jobs = json.dumps(
        [
            {
                "id": job_id,
                "refs": list(refs),
                "name": new.names and new.names[k],
                "trace": new.traces and new.traces[k],
                "key": new.keys and new.keys[k],
            }
            for k, (job_id, refs) in enumerate(new.jobs)
        ]
    )
    ids, missing = tx.finish(
        "SELECT ids, missing FROM store_create_jobs(?::text, ?::json, ?::text, ?::float8,"
        " ?::int, ?::boolean, ?::float8, ?::text[], ?::boolean, ?::boolean, store_now())",
        (
            new.owner,
            jobs,
            new.runner_id,
            new.lease_for,
            new.held,
            new.later is not None,
            later.not_before if new.later is not None else None,
            list(later.after),
            later.after_ok,
            new.wait_for_room,
        ),
    ).fetchone()
    if missing is not None:
        raise NotFound(f"no job {missing!r} to wait after")
    return list(ids)


def _create_here(conn: Tx, new: NewJobs, now: float) -> list[str]:
    """:func:`create_jobs` a row of SQL at a time, at ``now``: SQLite's way."""
    later, keys = new.later, new.keys
    held = new.held
    waits = 0 if later is None else _waits(conn, new.owner, later.after)
    deferred = (
        (0, None, 0, 0) if later is None else (1, later.not_before, waits, int(later.after_ok))
    )
    until = None if new.lease_for is None else now + new.lease_for
    rows = [
        (
            job_id,
            new.owner,
            now,
            now,
            now,
            new.runner_id,
            *lease,
            len(refs),
            new.names and new.names[k],
            new.traces and new.traces[k],
            keys and keys[k],
            *deferred,
        )
        for k, (job_id, refs) in enumerate(new.jobs)
        for lease in [(new.runner_id, 1, until) if k < held else (None, 0, None)]
    ]
    conn.executemany(_INSERT_JOB, rows)
    ids = [job_id for job_id, _ in new.jobs]
    if keys is not None:
        given = sorted({key for key in keys if key is not None})
        found: dict[str, str] = {}
        for start in range(0, len(given), 500):
            where, args = in_list("idempotency_key", given[start : start + 500])
            found.update(
                conn.execute(
                    f"SELECT idempotency_key, id FROM jobs WHERE owner = ? AND {where}",
                    (new.owner, *args),
                ).fetchall()
            )
        ids = [job_id if key is None else found[key] for job_id, key in zip(ids, keys, strict=True)]
    made = [job for job, got in zip(new.jobs, ids, strict=True) if got == job[0]]
    if later is not None and later.after:
        # Every job made waits after them.
        conn.executemany(
            "INSERT INTO job_after (job_id, after_id) VALUES (?, ?)",
            [(job_id, after_id) for job_id, _ in made for after_id in later.after],
        )
    conn.executemany(
        "INSERT INTO targets (job_id, pos, ref) VALUES (?, ?, ?)",
        [(job_id, pos, ref) for job_id, refs in made for pos, ref in enumerate(refs)],
    )
    return ids


_INSERT_JOB = (
    "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, runner_id,"
    " lease_owner, lease_token, lease_until, ntargets, name, trace, idempotency_key,"
    " deferred, not_before, waits, after_ok)"
    f" VALUES (?, ?, '{JobStatus.QUEUED}', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (owner, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
)


def _waits(conn: Tx, owner: str, after: Sequence[str]) -> int:
    """How many of the jobs ``after`` (of ``owner``) have not ended;
    ``NotFound`` naming one there is not. Their rows stay locked until the
    transaction ends: one that ends meanwhile does so after the new jobs'
    rows are there to be counted down by its end (``later``)."""
    status: dict[str, str] = {}
    for start in range(0, len(after), 500):
        where, args = in_list("id", sorted(after)[start : start + 500])
        status.update(
            conn.execute(
                f"SELECT id, status FROM jobs WHERE owner = ? AND {where}"
                f" ORDER BY id{conn.locking()}",
                (owner, *args),
            )
        )
    missing = [job_id for job_id in after if job_id not in status]
    if missing:
        raise NotFound(f"no job {missing[0]!r} to wait after")
    return sum(status[job_id] in LIVE_JOB for job_id in after)


def set_job_status(
    conn: Tx, job_id: str, status: JobStatus, now: float, lease: Lease | None = None
) -> bool:
    """Move a live job to ``status``; a terminal status also touches it and
    releases its lease. Given a ``lease``, only while the job is held with it.

    Returns False, changing nothing, when the job is gone, already terminal
    or (given a lease) held by another: a terminal status is final (a late
    ``running`` or ``done`` never overwrites ``cancelled``).
    """
    if status in TERMINAL_JOB:
        sql = _END_JOB
    elif status in LIVE_JOB:
        sql = _MOVE_JOB
    else:
        raise ValueError(f"unknown job status {status!r}")
    return conn.execute(sql, (status, now, job_id, *lease_args(lease))).rowcount == 1


def cancel_job(conn: Tx, job_id: str, owner: str, now: float) -> bool:
    """Cancel ``owner``'s live job, whichever runner holds it (that runner
    learns it at its next commit or beat, and releases the lease). False if
    there is no such live job of ``owner``'s. A job that waited to start
    later waits no more."""
    cur = conn.execute(
        f"UPDATE jobs SET status = '{JobStatus.CANCELLED}', updated_at = ?1, touched_at = ?1,"
        " deferred = 0"
        f" WHERE id = ?2 AND owner = ?3 AND status IN {LIVE_SQL}",
        (now, job_id, owner),
    )
    return cur.rowcount == 1


def job_status(conn: Tx, job_id: str, owner: str) -> JobStatus | None:
    """The status of ``owner``'s job, or None if there is none."""
    row = conn.execute(
        "SELECT status FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
    ).fetchone()
    return None if row is None else JOB_STATUSES[row[0]]


def total_bytes(conn: Tx) -> int:
    """The stored bytes of every job, live and terminal: the sum of the
    slots of ``job_bytes``."""
    (total,) = conn.execute("SELECT coalesce(sum(total), 0) FROM job_bytes").fetchone()
    return int(total)


#: Slots of the byte total (``job_bytes``): each writing thread adds to its
#: own, so that writers side by side seldom update one row.
SLOTS = 64


def byte_slot() -> int:
    """The slot of ``job_bytes`` this thread adds to."""
    return threading.get_native_id() % SLOTS


def add_bytes(conn: Tx, delta: int) -> None:
    """Add ``delta`` to the bytes stored in all, in this thread's slot.
    Written last, sent with the COMMIT (``executemany`` is not waited for),
    so that no transaction holds the slot between round trips."""
    if delta:
        conn.executemany(
            "INSERT INTO job_bytes (slot, total) VALUES (?, ?)"
            " ON CONFLICT (slot) DO UPDATE SET total = job_bytes.total + excluded.total",
            [(byte_slot(), delta)],
        )


def evict(conn: Tx, max_bytes: int) -> list[str]:
    """Delete terminal jobs, least recently touched first (creation order breaks
    ties), until the stored bytes are within ``max_bytes`` or no terminal job
    is left. Live jobs are never evicted. Returns the evicted ids, in order."""
    evicted, freed = evict_past(conn, max_bytes, total_bytes(conn))
    add_bytes(conn, -freed)
    return evicted


def evict_past(conn: Tx, max_bytes: int, total: int) -> tuple[list[str], int]:
    """:func:`evict` given the ``total`` bytes stored now, leaving the total
    to the caller: the evicted ids, and the bytes they held. Under budget
    this costs nothing.

    One writer evicts at a time (``Tx.try_lock``); another that finds it
    busy skips eviction, leaving it to the next write. A job another
    transaction holds is passed over. With writers side by side (on
    PostgreSQL), the total is as of this transaction's first look: the
    budget holds once the writes meanwhile are seen by the next eviction.
    """
    evicted: list[str] = []
    if total <= max_bytes or not conn.try_lock("evict"):
        return evicted, 0
    left = total
    while left > max_bytes:
        # Through jobs_evictable, in its order: SQLite would otherwise take
        # jobs_ended for its status and sort every ended job (100,000 ended
        # jobs: 17 ms an eviction instead of 35 us).
        row = conn.execute(
            f"SELECT id, nbytes FROM jobs{conn.indexed('jobs_evictable')}"
            f" WHERE {ENDED_SQL}"
            f" ORDER BY touched_at, seq LIMIT 1{conn.locking(skip=True)}"
        ).fetchone()
        if row is None:
            break
        job_id, nbytes = row
        conn.execute("DELETE FROM targets WHERE job_id = ?", (job_id,))
        conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        left -= nbytes
        evicted.append(job_id)
    return evicted, total - left


#: The most jobs one transaction of :func:`prune` deletes: a prune of a
#: million jobs is many short transactions, none holding much for long.
PRUNE_BATCH = 500


def prune(conn: Tx, status: JobStatus, older_than: float, limit: int) -> int:
    """Delete at most ``limit`` jobs that ended ``status`` (their last change)
    more than ``older_than`` seconds ago (by ``conn.now``), those that ended
    first first, with their targets;
    their bytes leave the total. A job another transaction holds is passed
    over. Returns how many were deleted."""
    rows = conn.execute(
        # ENDED_SQL, the condition of jobs_ended: a plan made before the
        # status is known (PostgreSQL's generic plan) cannot tell that
        # ``status = ?`` implies it, and would scan every job.
        f"SELECT id, nbytes FROM jobs WHERE {ENDED_SQL} AND status = ? AND updated_at < ?"
        f" ORDER BY updated_at LIMIT ?{conn.locking(skip=True)}",
        (status, conn.now - older_than, limit),
    ).fetchall()
    if not rows:
        return 0
    ids = [job_id for job_id, _ in rows]
    where, args = in_list("job_id", ids)
    conn.execute(f"DELETE FROM targets WHERE {where}", args)
    where, args = in_list("id", ids)
    conn.execute(f"DELETE FROM jobs WHERE {where}", args)
    add_bytes(conn, -sum(nbytes for _, nbytes in rows))
    return len(rows)


def get_job(conn: Tx, job_id: str, owner: str) -> JobRow | None:
    """The job with its targets, or None if there is none of this owner's."""
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ? AND owner = ?",
        (job_id, owner),
    ).fetchone()
    return None if row is None else _with_targets(conn, row)


def find_job(conn: Tx, job_id: str) -> JobRow | None:
    """The job with its targets, whoever owns it, or None."""
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?",
        (job_id,),
    ).fetchone()
    return None if row is None else _with_targets(conn, row)


def list_jobs(
    conn: Tx,
    *,
    owner: str | None = None,
    status: JobStatus | None = None,
    ids: Sequence[str] | None = None,
    newest: int | None = None,
) -> list[JobSummary]:
    """Every job (of ``owner``, in ``status``, among ``ids``, when given; the
    ``newest`` so many, when given) in creation order, with its counts: one
    row read per job."""
    sql = (
        f"SELECT {_SUMMARY_COLUMNS} FROM jobs"
        " WHERE (?1 IS NULL OR owner = ?1) AND (?2 IS NULL OR status = ?2)"
    )
    if ids is None and newest is not None:
        last = conn.execute(sql + " ORDER BY seq DESC LIMIT ?3", (owner, status, newest))
        return [_summary(row) for row in reversed(last.fetchall())]
    if ids is None:
        return [_summary(row) for row in conn.execute(sql + " ORDER BY seq", (owner, status))]
    rows: list[Any] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ", ".join(f"?{k}" for k in range(3, 3 + len(chunk)))
        rows += conn.execute(
            sql.replace("SELECT id,", "SELECT seq, id,") + f" AND id IN ({marks})",
            (owner, status, *chunk),
        ).fetchall()
    return [_summary(row[1:]) for row in sorted(rows)]


def _summary(row: Sequence[Any]) -> JobSummary:
    """A row of :func:`list_jobs`, in its columns' order."""
    job_id, owner, status, created, updated, nbytes, done, failed, pending, *rest = row
    return JobSummary(
        job_id,
        owner,
        JOB_STATUSES[status],
        created,
        updated,
        nbytes,
        done,
        failed,
        pending,
        **_read(_SUMMARY_FIELDS, rest),
    )


#: The columns of ``jobs`` a :class:`JobRow` is made of, in its order.
def _marked(shape: type) -> tuple[tuple[str, str, Callable[[Any], Any] | None], ...]:
    """The fields of ``shape`` kept each in a column of ``jobs``
    (``shapes.column``): each one's name, column and how it is read."""
    return tuple(
        (f.name, f.metadata["column"], f.metadata["read"])
        for f in dataclasses.fields(shape)
        if "column" in f.metadata
    )


def _read(
    marked: tuple[tuple[str, str, Callable[[Any], Any] | None], ...], values: Sequence[Any]
) -> dict[str, Any]:
    """The fields ``marked`` of a job, from the values of their columns."""
    return {
        name: value if read is None else read(value)
        for (name, _, read), value in zip(marked, values, strict=True)
    }


_ROW_FIELDS = _marked(JobRow)
_SUMMARY_FIELDS = _marked(JobSummary)
#: The columns a :class:`JobRow` is read from, in the order :func:`_job` takes them.
JOB_COLUMNS = "id, owner, status, created_at, updated_at, touched_at, nbytes, " + ", ".join(
    column for _, column, _ in _ROW_FIELDS
)
#: The columns a :class:`JobSummary` is read from (:func:`_summary`).
_SUMMARY_COLUMNS = (
    "id, owner, status, created_at, updated_at, nbytes, ndone, nfailed,"
    " ntargets - ndone - nfailed, " + ", ".join(column for _, column, _ in _SUMMARY_FIELDS)
)


def load_jobs(conn: Tx, job_ids: Sequence[str]) -> list[JobRow]:
    """These jobs, with their targets, in creation order."""
    rows: list[Any] = []
    for start in range(0, len(job_ids), 500):
        where, args = in_list("id", job_ids[start : start + 500])
        rows += conn.execute(f"SELECT seq, {JOB_COLUMNS} FROM jobs WHERE {where}", args).fetchall()
    return with_targets(conn, [row[1:] for row in sorted(rows)])


def with_targets(conn: Tx, rows: Sequence[Any]) -> list[JobRow]:
    """The jobs of these rows (:data:`JOB_COLUMNS`), in this order, with
    their targets: one read of targets per 500 jobs, however many."""
    targets: dict[str, list[TargetRow]] = {row[0]: [] for row in rows}
    for start in range(0, len(rows), 500):
        where, args = in_list("job_id", [row[0] for row in rows[start : start + 500]])
        for job_id, pos, ref, status, result, error, hint in conn.execute(
            f"SELECT job_id, pos, ref, status, result, error, hint FROM targets WHERE {where}"
            " ORDER BY job_id, pos",
            args,
        ):
            targets[job_id].append(
                _new_row(TargetRow, (pos, ref, TARGET_STATES[status], result, error, hint))
            )
    return [_job(row, tuple(targets[row[0]])) for row in rows]


def interrupt(
    conn: Tx, job_id: str, hint: str, now: float, lease: Lease | None = None
) -> tuple[JobStatus, int] | None:
    """End a live job that no runner will go on with: its pending targets
    ``failed`` with error ``interrupted`` and ``hint``, then its status by its
    targets (rule 3). Given a ``lease``, only while the job is held with it.
    Returns that status and how many targets were interrupted, or None if
    the job is not live (or not held with ``lease``)."""
    error = "interrupted"
    if not set_job_status(conn, job_id, JobStatus.RUNNING, now, lease):
        return None
    cur = conn.execute(
        f"UPDATE targets SET status = '{TargetState.FAILED}', error = ?, hint = ?"
        f" WHERE job_id = ? AND status = '{TargetState.PENDING}'",
        (error, hint, job_id),
    )
    nbytes = cur.rowcount * len((error + hint).encode())
    done, failed = conn.execute(
        "UPDATE jobs SET nbytes = nbytes + ?1, nfailed = nfailed + ?2 WHERE id = ?3"
        " RETURNING ndone, nfailed",
        (nbytes, cur.rowcount, job_id),
    ).fetchone()
    status = ended_status(done, failed)
    set_job_status(conn, job_id, status, now)
    add_bytes(conn, nbytes)
    return status, cur.rowcount


def find_targets(
    conn: Tx, job_id: str, start: int = 0, limit: int | None = None
) -> tuple[TargetRow, ...]:
    """The targets of a job, whoever owns it, from position ``start`` on, at
    most ``limit`` of them (None: all); none if there is no such job."""
    rows = conn.execute(
        "SELECT pos, ref, status, result, error, hint FROM targets"
        " WHERE job_id = ? AND pos >= ? ORDER BY pos LIMIT ?",
        (job_id, start, NO_LIMIT if limit is None else limit),
    )
    states = TARGET_STATES
    return tuple(
        [
            _new_row(TargetRow, (pos, ref, states[status], result, error, hint))
            for pos, ref, status, result, error, hint in rows
        ]
    )


#: Builds a row past ``NamedTuple``'s own ``__new__``: a job of many targets,
#: read often, costs half as much.
_new_row = tuple.__new__


def _with_targets(conn: Tx, row: Any) -> JobRow:
    return _job(row, find_targets(conn, row[0]))


def _job(row: Any, targets: tuple[TargetRow, ...]) -> JobRow:
    job_id, owner, status, created_at, updated_at, touched_at, nbytes, *rest = row
    return JobRow(
        job_id,
        owner,
        JOB_STATUSES[status],
        created_at,
        updated_at,
        touched_at,
        nbytes,
        targets,
        **_read(_ROW_FIELDS, rest),
    )


def touch_job(conn: Tx, job_id: str, owner: str, now: float) -> bool:
    """Mark the job as just used, so eviction takes it last; False if there is
    none of this owner's."""
    cur = conn.execute(
        "UPDATE jobs SET touched_at = ? WHERE id = ? AND owner = ?", (now, job_id, owner)
    )
    return cur.rowcount == 1
