"""Who runs which batch job: the runners table, the leases runners hold on
jobs, and take-over.

A live job is held by at most one runner at a time, through a lease: the
owner's id, an expiry by the store's clock, and a fencing token bumped
whenever the job changes owner. The owner renews all its leases in one
statement per beat; every write it makes for a job names the owner and
token (``shapes.Lease``), and the store refuses it once the job has another.

Guarantees (the numbered steps of ``docs/concurrency.md`` say why each is
safe):

1. A lease is taken only once it lapsed (or its owner closed, or its
   process is gone on this host), and taking it bumps the token: the old
   owner's writes for that job are refused from then on.
2. Lapse is counted in time the store could be written: a beat that finds
   the previous beat (by any runner) further back than half a lease knows
   every runner was blocked meanwhile, and adds that time to every lease.
   One beat at a time keeps that clock, and only it takes a lease by its
   lapse or judges a runner silent: the others may not yet see the time it
   gives back. A stall that blocked every runner costs no live runner its
   jobs.
3. A job no runner holds (``lease_owner`` NULL: waiting for room, or left
   by a runner that closed) is taken in submit order.

Functions take an open transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

from .. import events, jobs
from ..engines import Tx, in_list
from ..shapes import Beat, JobRow, Look, Whereabouts
from ..states import LIVE_JOB, LIVE_SQL
from . import NO_LIMIT, later, pauses, upstreams

__all__ = [
    "HOST",
    "Beat",
    "beat",
    "look",
    "pid_alive",
    "register",
    "retire",
    "whereabouts",
]

#: This machine's name, as runners record it.
HOST = socket.gethostname()

#: The most jobs of gone runners one beat ends or takes without room.
ORPHANS_PER_BEAT = 1000


def register(conn: Tx, runner_id: str, now: float, lapse: float) -> None:
    """Record a new runner of this process, alive as of ``now``, whose leases
    last ``lapse`` seconds."""
    conn.execute(
        "INSERT INTO runners (id, host, pid, started_at, heartbeat_at, lapse)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (runner_id, HOST, os.getpid(), now, now, lapse),
    )


def retire(conn: Tx, runner_id: str) -> None:
    """The runner closed: it holds no lease any more, so the next runner with
    room takes its live jobs at once."""
    # Jobs first, then the runner's row, as every writer locks them.
    release(conn, runner_id)
    conn.execute("UPDATE runners SET closed = 1 WHERE id = ?", (runner_id,))


def release(conn: Tx, runner_id: str, ids: Sequence[str] | None = None) -> None:
    """``runner_id`` lets go of its leases (only those of the jobs ``ids``,
    if given): the next runner with room takes those jobs at once."""
    only, args = ("", ()) if ids is None else in_list("id", ids)
    conn.execute(
        "UPDATE jobs SET lease_owner = NULL WHERE id IN (SELECT id FROM jobs"
        f" WHERE lease_owner = ?{' AND ' + only if only else ''} ORDER BY id{conn.locking()})",
        (runner_id, *args),
    )


def beat(
    conn: Tx,
    runner_id: str,
    now: float,
    lapse: float,
    *,
    room: int | None,
    foreign: bool,
    keep: Sequence[str] = (),
    release: bool = True,
) -> Beat:
    """One beat of ``runner_id``: give back to every lease the time the store
    could not be written, renew the runner's leases for ``lapse`` seconds,
    release the deferred jobs that are due (``later``; unless not
    ``release``: a runner closing takes none), and take jobs.

    It takes, in submit order, live jobs no live runner holds: at most
    ``room`` (None: no limit) of those it can run (any, if ``foreign``: it
    can resume other callers' jobs; else only those submitted through it),
    and, unless ``foreign``, up to ``ORPHANS_PER_BEAT`` of those whose
    submitting runner is gone, which it can only end. The lease of a job
    that is terminal is released, but for the jobs in ``keep`` (a target of
    them is in flight: its outcome is still to be stored under the lease).
    """
    # Only the beat that keeps the clock takes a lease by its expiry: the
    # beat that keeps it may be giving a stall back to that very lease in a
    # transaction not yet committed (guarantee 2).
    clock = _give_back_stall(conn, now, lapse)
    if clock:
        # The beat that keeps the clock does the store's chores for all.
        events.prune(conn, now - events.KEPT)
    held: dict[str, int] = {}
    ended: set[str] = set()
    # The one renewal statement: every lease of the runner, live or not; a
    # terminal job's lease is released unless kept. Its rows are locked in
    # id order, as every writer locks jobs. A renewal never brings a lease
    # nearer: its time was read as the transaction began, and a give-back
    # committed while it waited for the rows may have moved the lease on.
    kept, kept_args = in_list("id", keep)
    until = now + lapse
    for job_id, token, status in conn.execute(
        "UPDATE jobs SET lease_until = CASE WHEN lease_until > ? THEN lease_until ELSE ? END,"
        f" lease_owner = CASE WHEN status IN {LIVE_SQL} OR {kept}"
        " THEN lease_owner END"
        " WHERE lease_owner = ? AND id IN"
        f" (SELECT id FROM jobs WHERE lease_owner = ? ORDER BY id{conn.locking()})"
        " RETURNING id, lease_token, status",
        (until, until, *kept_args, runner_id, runner_id),
    ):
        if status in LIVE_JOB:
            held[job_id] = token
        else:
            ended.add(job_id)
    # The runner's row after its jobs, as every writer locks them. A write
    # whose answer nothing waits for (``executemany``) goes out with the
    # next statement, on PostgreSQL (pipeline mode): no round trip of its own.
    conn.executemany(
        "UPDATE runners SET heartbeat_at = ?, lapse = ? WHERE id = ?", [(now, lapse, runner_id)]
    )
    # Deferred jobs due now join those to take, after the renewal: the
    # runner's own rows are its first to lock.
    cancelled = later.release(conn, now) if release else []
    ended_runners, silent = _gone(conn, runner_id, now)
    if not clock:
        silent = []  # as with a lapsed lease: the stall may be given back
    # A lease is free once lapsed by its own expiry, or once its owner closed
    # or died; a waiting job is an orphan once the runner it was submitted
    # through is gone, silent runners included.
    dead, dead_args = in_list("lease_owner", ended_runners)
    gone, gone_args = in_list("runner_id", ended_runners + silent)
    lapsed = " OR lease_until < ?" if clock else ""
    free = f"(lease_owner IS NULL OR {dead}{lapsed})"
    free_args = (*dead_args, *((now,) if clock else ()))
    ids: list[str] = []
    if room is None or room > 0:
        home = "" if foreign else " AND runner_id = ?"
        taken = _ids(
            conn,
            f"{free}{home}",
            (*free_args, *(() if foreign else (runner_id,))),
            NO_LIMIT if room is None else room,
        )
        ids += [job_id for _, job_id in taken]
    if not foreign:
        # Two looks, each down the index of its runner ids: one "IS NULL OR
        # IN (...)" would walk every waiting job, however many (a million
        # waiting behind max_live took 0.1 s a beat).
        orphans = _ids(conn, f"{free} AND runner_id IS NULL", free_args, ORPHANS_PER_BEAT)
        if gone_args:
            orphans += _ids(conn, f"{free} AND {gone}", (*free_args, *gone_args), ORPHANS_PER_BEAT)
        ids += [job_id for _, job_id in sorted(orphans)[:ORPHANS_PER_BEAT]]
    return Beat(
        held,
        frozenset(ended),
        _lease(conn, runner_id, ids, now + lapse),
        pauses.read(conn),
        later.next_due(conn, now),
        cancelled,
    )


def look(conn: Tx, runner_id: str, work: bool) -> Look:
    """The ids of the jobs leased to ``runner_id`` that are terminal
    already, what is paused, and (``work``) whether a job waits that no
    runner holds: one statement, the read's last (on PostgreSQL its one
    round trip carries the COMMIT too). The last walks the waiting jobs
    in submit order to the first one free: past no more than the jobs the
    runners hold."""
    free = (
        " UNION ALL SELECT 'work', '', 0.0 WHERE EXISTS (SELECT 1 FROM jobs"
        f" WHERE status IN {LIVE_SQL} AND deferred = 0 AND lease_owner IS NULL)"
        if work
        else ""
    )
    rows = conn.finish(
        f"SELECT '', id, 0.0 FROM jobs WHERE lease_owner = ? AND status NOT IN {LIVE_SQL}"
        f" UNION ALL SELECT kind, name, since FROM paused{free} ORDER BY 2",
        (runner_id,),
    ).fetchall()
    halted = [name for kind, name, _ in rows if not kind]
    waiting = any(kind == "work" for kind, _, _ in rows)
    return Look(halted, pauses.gathered(row for row in rows if row[0] in pauses.KINDS), waiting)


def whereabouts(conn: Tx, job_id: str) -> Whereabouts | None:
    """Where the job ``job_id`` stands (see ``Whereabouts``); None if it
    is not stored."""
    job = jobs.find_job(conn, job_id)
    if job is None:
        return None
    holder, until = conn.execute(
        "SELECT lease_owner, lease_until FROM jobs WHERE id = ?", (job_id,)
    ).fetchone()
    now = conn.now
    ended, silent = _gone(conn, "", now)
    gone = {*ended, *silent}
    open_ = [rid for (rid,) in conn.execute("SELECT id FROM runners WHERE closed = 0")]
    return Whereabouts(
        job,
        holder,
        None if holder is None else float(until),
        holder is not None and holder not in gone and float(until) >= now,
        sum(rid not in gone for rid in open_),
        pauses.read(conn),
        {view.name: view for view in upstreams.view(conn)},
        now,
    )


def _give_back_stall(conn: Tx, now: float, lapse: float) -> bool:
    """Add to every lease the time since the last beat, if that is more than
    half a lease: no runner could beat meanwhile (runners beat three times a
    lease), so the store could not be written (guarantee 2).

    One beat at a time keeps the clock; a beat that finds another at it
    skips it (that one moves the clock on) and returns False."""
    if not conn.try_lock("clock"):
        return False
    (last,) = conn.execute("SELECT beat_at FROM lease_clock").fetchone()
    gap = now - last
    if last and gap > lapse / 2:
        # Jobs, then runners, each in id order, as every writer locks them:
        # two never wait in a circle.
        conn.executemany(
            "UPDATE jobs SET lease_until = lease_until + ? WHERE id IN (SELECT id FROM jobs"
            f" WHERE lease_owner IS NOT NULL ORDER BY id{conn.locking()})",
            [(gap,)],
        )
        conn.executemany(
            "UPDATE runners SET heartbeat_at = heartbeat_at + ? WHERE id IN (SELECT id"
            f" FROM runners WHERE closed = 0 ORDER BY id{conn.locking()})",
            [(gap,)],
        )
    conn.executemany("UPDATE lease_clock SET beat_at = ?", [(now,)])
    return True


def _gone(conn: Tx, runner_id: str, now: float) -> tuple[list[str], list[str]]:
    """The runners other than ``runner_id`` that are gone: those that closed
    or whose process has exited on this host, and those silent for longer
    than their own lease."""
    ended: list[str] = []
    silent: list[str] = []
    for other, host, pid, heartbeat_at, lapse, closed in conn.execute(
        "SELECT id, host, pid, heartbeat_at, lapse, closed FROM runners WHERE id != ?",
        (runner_id,),
    ):
        if closed or (host == HOST and not pid_alive(pid)):
            ended.append(other)
        elif heartbeat_at < now - lapse:
            silent.append(other)
    return ended, silent


def _ids(conn: Tx, where: str, args: tuple[object, ...], limit: int) -> list[tuple[int, str]]:
    """The place in submit order and id of live jobs matching ``where``, in
    that order, at most ``limit``; their rows locked until the transaction
    ends, but for those another transaction holds, which are passed over
    (two runners never take one job, nor wait for each other to)."""
    return [
        (seq, job_id)
        for seq, job_id in conn.execute(
            f"SELECT seq, id FROM jobs WHERE status IN {LIVE_SQL} AND deferred = 0 AND {where}"
            f" ORDER BY seq LIMIT ?{conn.locking(skip=True)}",
            (*args, limit),
        )
    ]


def _lease(conn: Tx, runner_id: str, ids: list[str], until: float) -> list[tuple[JobRow, int]]:
    """Lease these jobs to ``runner_id`` until ``until``, with a new token
    each; return them, oldest first, with that token. One statement per 500
    jobs, and one read of their targets."""
    rows: list[Any] = []
    for start in range(0, len(ids), 500):
        where, args = in_list("id", ids[start : start + 500])
        rows += conn.execute(
            "UPDATE jobs SET lease_owner = ?, lease_token = lease_token + 1, lease_until = ?"
            f" WHERE {where} RETURNING seq, lease_token, {jobs.JOB_COLUMNS}",
            (runner_id, until, *args),
        ).fetchall()
    rows.sort()
    taken = jobs.with_targets(conn, [row[2:] for row in rows])
    return [(job, row[1]) for job, row in zip(taken, rows, strict=True)]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True
