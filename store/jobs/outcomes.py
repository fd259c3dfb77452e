"""A batch of target outcomes stored in one transaction: what a busy
runner's group commit writes. Each engine has its own way, with one
meaning:

- :func:`record`, the portable way (SQLite's): one read decides every
  outcome, then one statement per kind of write runs over all its rows
  (``executemany``, a loop in C on SQLite);
- ``store_record``, PostgreSQL's: a function the schema installs (step 9),
  called by :func:`record_on_server` with the batch as arrays. It locks,
  decides, writes and evicts on the server, and the call goes out with the
  transaction's BEGIN and COMMIT: one round trip per batch, however many
  outcomes and jobs it holds.

What a batch does, on either engine, in this order: the jobs' rows are
locked in id order (where the engine has writers side by side); the
``starting`` jobs still ``queued`` become ``running``, and so do those of
outcomes stored under a lease (a runner ran their first target); each
outcome is stored if its job is there, held with its lease and its target
pending (the first of two for one target wins); the jobs whose stored
outcome carries a ``job_status`` end; then, given ``max_bytes``, terminal
jobs are evicted past that budget (the jobs just ended were touched last,
so they go last); the byte total changes last. An outcome refused does not
stop the others.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from ..engines import LOCKS, Tx, in_list, values
from ..errors import Conflict, NotFound
from ..shapes import Lease, Stored, TargetOutcome
from ..states import LIVE_JOB, JobStatus, TargetState
from . import add_bytes, byte_slot, evict_past, total_bytes
from .fence import holds, lease_args

__all__ = ["record"]

#: What became of one outcome: stored, or refused because its job is
#: ``gone``, held under another ``lease``, or its target ``stored`` already.
Verdict = Literal["ok", "gone", "lease", "stored"]

#: What :func:`record` reads of one target: its job's status, lease owner
#: and token (all None if the job is gone), and its own status (None if the
#: job has no such target).
_Seen = tuple[str | None, str | None, int | None, str | None]


def record(
    tx: Tx,
    outcomes: Sequence[TargetOutcome],
    starting: Sequence[tuple[str, Lease | None]],
    max_bytes: int | None,
    *,
    final: bool = True,
) -> Stored:
    """Store a batch (see the module's docstring), as the transaction's
    last statements: by the schema's function where it runs, else the
    portable way. Not ``final``: the caller may yet roll the transaction
    back (where the engine would send its COMMIT with the function's call,
    it does not)."""
    if tx.functions:
        return _record_on_server(tx, outcomes, starting, max_bytes, final=final)
    return _record_here(tx, outcomes, starting, max_bytes)


def _record_here(
    conn: Tx,
    outcomes: Sequence[TargetOutcome],
    starting: Sequence[tuple[str, Lease | None]],
    max_bytes: int | None,
) -> Stored:
    """Store a batch the portable way (see the module's docstring): a
    fixed number of calls however many outcomes the batch holds."""
    keys = [(o.job_id, o.pos) for o in outcomes] + [(j, -1) for j, _ in starting]
    _lock(conn, sorted({job_id for job_id, _ in keys}))
    seen, total = _look(conn, keys)
    now = conn.now
    verdicts = _decide(outcomes, seen)
    statuses = [seen[o.job_id, o.pos][0] for o in outcomes]
    stored = [o for o, v in zip(outcomes, verdicts, strict=True) if v == "ok"]
    start = {
        job_id: None
        for job_id, lease in starting
        if (h := seen.get((job_id, -1))) is not None
        and h[0] == JobStatus.QUEUED
        and holds(*h[:3], lease)
    }
    start.update(
        (o.job_id, None)
        for o in stored
        if o.lease is not None and seen[o.job_id, o.pos][0] == JobStatus.QUEUED
    )
    if start:
        conn.executemany(
            f"UPDATE jobs SET status = '{JobStatus.RUNNING}', updated_at = ?"
            f" WHERE id = ? AND status = '{JobStatus.QUEUED}'",
            [(now, job_id) for job_id in start],
        )
    if stored:
        conn.executemany(
            "UPDATE targets SET status = ?, result = ?, error = ?, hint = ?"
            " WHERE job_id = ? AND pos = ?",
            [(o.status, o.result, o.error, o.hint, o.job_id, o.pos) for o in stored],
        )
    by_job: dict[str, list[int]] = {}  # bytes, done, failed
    for o in stored:
        added = by_job.setdefault(o.job_id, [0, 0, 0])
        added[0] += o.nbytes
        added[1 if o.status == TargetState.DONE else 2] += 1
    if by_job:
        conn.executemany(
            "UPDATE jobs SET nbytes = nbytes + ?, ndone = ndone + ?, nfailed = nfailed + ?,"
            " updated_at = ? WHERE id = ?",
            [(*added, now, job_id) for job_id, added in by_job.items()],
        )
    added_bytes = sum(added[0] for added in by_job.values())
    ending = _ending(outcomes, verdicts, statuses)
    if ending:
        conn.executemany(
            "UPDATE jobs SET status = ?, updated_at = ?, touched_at = ?, lease_owner = NULL"
            " WHERE id = ?",
            [(outcomes[i].job_status, now, now, outcomes[i].job_id) for i in ending],
        )
    evicted, freed = (
        ([], 0) if max_bytes is None else evict_past(conn, max_bytes, total + added_bytes)
    )
    add_bytes(conn, added_bytes - freed)
    return _stored(outcomes, verdicts, statuses, ending, evicted)


def _lock(conn: Tx, job_ids: Sequence[str]) -> None:
    """Lock these jobs' rows until the transaction ends, in the order
    given (every writer locks jobs in id order, so two never wait on each
    other in a circle): what a fenced write decides on then stays as read.
    Nothing to do where the engine has one writer at a time."""
    locking = conn.locking()
    for start in range(0, len(job_ids) if locking else 0, 500):
        where, args = in_list("id", job_ids[start : start + 500])
        conn.execute(f"SELECT id FROM jobs WHERE {where} ORDER BY id{locking}", args)


def _look(conn: Tx, keys: Sequence[tuple[str, int]]) -> tuple[dict[tuple[str, int], _Seen], int]:
    """For each (job id, position): what :func:`record` needs to know of it
    (position -1 asks about the job alone); and the bytes stored in all."""
    if not keys:
        return {}, total_bytes(conn)
    rows = [
        row
        for table, args in values(keys)
        for row in conn.execute(
            "SELECT v.column1, v.column2, jobs.status, jobs.lease_owner, jobs.lease_token,"
            f" targets.status, (SELECT sum(total) FROM job_bytes) FROM {table}"
            " LEFT JOIN jobs ON jobs.id = v.column1"
            " LEFT JOIN targets ON targets.job_id = v.column1 AND targets.pos = v.column2",
            args,
        )
    ]
    seen = {
        (job_id, pos): (status, owner, token, target)
        for job_id, pos, status, owner, token, target, _ in rows
    }
    return seen, int(rows[-1][6] or 0)


def _decide(outcomes: Sequence[TargetOutcome], seen: dict[tuple[str, int], _Seen]) -> list[Verdict]:
    """What becomes of each outcome, given what was seen of its target."""
    verdicts: list[Verdict] = []
    kept: set[tuple[str, int]] = set()
    for o in outcomes:
        h = seen[o.job_id, o.pos]
        if h[0] is None:
            verdicts.append("gone")
        elif not holds(*h[:3], o.lease):
            verdicts.append("lease")
        elif h[3] != TargetState.PENDING or (o.job_id, o.pos) in kept:
            verdicts.append("stored")
        else:
            kept.add((o.job_id, o.pos))
            verdicts.append("ok")
    return verdicts


def _ending(
    outcomes: Sequence[TargetOutcome], verdicts: Sequence[Verdict], statuses: Sequence[str | None]
) -> list[int]:
    """The outcomes that end their job: of each live job, the first stored
    outcome that carries a ``job_status``."""
    ending: dict[str, int] = {}
    for i, (o, verdict, status) in enumerate(zip(outcomes, verdicts, statuses, strict=True)):
        if verdict == "ok" and o.job_status is not None and status in LIVE_JOB:
            ending.setdefault(o.job_id, i)
    return list(ending.values())


def _stored(
    outcomes: Sequence[TargetOutcome],
    verdicts: Sequence[Verdict],
    statuses: Sequence[str | None],
    ending: Sequence[int],
    evicted: list[str],
) -> Stored:
    """What came of the batch, from each outcome's verdict, the status its
    job had when the batch decided, and the outcomes that ended their job
    (:func:`_ending`)."""
    refused: dict[int, NotFound | Conflict] = {}
    for i, (o, verdict) in enumerate(zip(outcomes, verdicts, strict=True)):
        if verdict == "gone":
            refused[i] = NotFound(f"no job {o.job_id!r}")
        elif verdict == "lease":
            owner = None if o.lease is None else o.lease.owner
            refused[i] = Conflict(f"job {o.job_id!r} is no longer leased to runner {owner}")
        elif verdict == "stored":
            refused[i] = Conflict(f"target {o.pos} of job {o.job_id!r} is not pending")
    return Stored(
        refused,
        frozenset(ending),
        evicted,
        frozenset(
            i
            for i, (verdict, status) in enumerate(zip(verdicts, statuses, strict=True))
            if verdict == "ok" and status not in LIVE_JOB
        ),
    )


# -- PostgreSQL: the batch in one call ---------------------------------------------------


def _record_on_server(
    conn: Tx,
    outcomes: Sequence[TargetOutcome],
    starting: Sequence[tuple[str, Lease | None]],
    max_bytes: int | None,
    *,
    final: bool,
) -> Stored:
    """Store a batch by one call of ``store_record`` (schema step 9), the
    transaction's last statement; ``final``: its COMMIT goes with it
    (``Tx.finish``), else the caller may still roll it back.

    The batch goes as two JSON texts, not as arrays: encoded in C, and
    bound as two quoted strings (binding ten arrays element by element
    cost the client more than the rest of the batch)."""
    batch = json.dumps(
        [
            {
                "job": o.job_id,
                "pos": o.pos,
                "status": o.status,
                "result": o.result,
                "error": o.error,
                "hint": o.hint,
                "nbytes": o.nbytes,
                "job_end": o.job_status,
                **_lease(o.lease),
            }
            for o in outcomes
        ]
    )
    jobs = json.dumps([{"job": job_id, **_lease(lease)} for job_id, lease in starting])
    row = (conn.finish if final else conn.execute)(
        "SELECT verdicts, seen, evicted FROM store_record(?::json, ?::json, ?, ?, ?, store_now())",
        (batch, jobs, max_bytes, LOCKS["evict"], byte_slot()),
    ).fetchone()
    verdicts, statuses, evicted = row
    return _stored(
        outcomes, verdicts, statuses, _ending(outcomes, verdicts, statuses), list(evicted)
    )


def _lease(lease: Lease | None) -> dict[str, object]:
    """The owner and token of ``lease`` as the function reads them."""
    owner, token = lease_args(lease)
    return {"owner": owner, "token": token}
