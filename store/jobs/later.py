"""Jobs that start later (SPEC §2f): stored deferred by a submit with
``not_before`` or ``after`` (``jobs.create_jobs``), and released here once
their time came and the jobs they wait after all ended. Released, a job is
like one waiting for a runner with room: the next beat with room takes
it, in submit order.

A deferred job is in no index the runners take from (their indexes leave
``deferred`` jobs out), so a million of them cost a beat nothing; the
``jobs_due`` index holds those whose waits are over, soonest first, and
a trigger counts ``waits`` down as the jobs waited after end (on
PostgreSQL it also tells the runners when one is free to go). Functions
take an open transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

from ..engines import Tx, in_list
from ..states import LIVE_SQL, JobStatus

__all__ = ["RELEASE_PER_BEAT", "after_of", "next_due", "release"]

#: The most deferred jobs one beat releases (the next beat comes at once
#: while more are due).
RELEASE_PER_BEAT = 1000


def release(conn: Tx, now: float) -> list[tuple[str, str, str | None]]:
    """Release the deferred jobs due at ``now`` (at most
    ``RELEASE_PER_BEAT``, soonest first); those with ``after_ok`` whose
    jobs waited after did not all end ``done`` end ``cancelled`` instead,
    with the reason: returns those, each its id, owner and the runner it
    was submitted through. Rows another transaction holds are passed over."""
    rows = conn.execute(
        "SELECT id, after_ok, owner, runner_id FROM jobs"
        f" WHERE deferred = 1 AND waits = 0 AND not_before <= ? AND status IN {LIVE_SQL}"
        f" ORDER BY not_before LIMIT ?{conn.locking(skip=True)}",
        (now, RELEASE_PER_BEAT),
    ).fetchall()
    if not rows:
        return []
    unmet: dict[str, str] = {}
    checked = [job_id for job_id, after_ok, _, _ in rows if after_ok]
    if checked:
        where, args = in_list("a.job_id", checked)
        for job_id, after_id, status in conn.execute(
            "SELECT a.job_id, a.after_id, d.status FROM job_after a"
            f" LEFT JOIN jobs d ON d.id = a.after_id WHERE {where} ORDER BY a.job_id, a.after_id",
            args,
        ):
            if status != JobStatus.DONE and job_id not in unmet:
                ended = "is gone" if status is None else f"ended {status}"
                unmet[job_id] = f"job {after_id} it waited after {ended}"
    free = [job_id for job_id, _, _, _ in rows if job_id not in unmet]
    if free:
        where, args = in_list("id", free)
        conn.execute(f"UPDATE jobs SET deferred = 0 WHERE {where}", args)
    conn.executemany(
        "UPDATE jobs SET deferred = 0, status = ?, reason = ?, updated_at = ?, touched_at = ?"
        " WHERE id = ?",
        [(JobStatus.CANCELLED, reason, now, now, job_id) for job_id, reason in unmet.items()],
    )
    return [(job_id, owner, home) for job_id, _, owner, home in rows if job_id in unmet]


def next_due(conn: Tx, now: float) -> float | None:
    """Seconds from ``now`` until the next deferred job whose waits are over
    is due (0 if one is now), or None if there is none."""
    (due,) = conn.execute(
        "SELECT min(not_before) FROM jobs WHERE deferred = 1 AND waits = 0"
    ).fetchone()
    return None if due is None else max(0.0, due - now)


def after_of(conn: Tx, job_id: str) -> list[str]:
    """The ids of the jobs ``job_id`` waits (or waited) after, in id order."""
    return [
        after_id
        for (after_id,) in conn.execute(
            "SELECT after_id FROM job_after WHERE job_id = ? ORDER BY after_id", (job_id,)
        )
    ]
