"""The keeper thread: the runner's leases renewed, jobs taken and ended, and
``running`` stored promptly when no batch carries it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import store

from .commit import give_back_starting, take_starting, unlocked
from .context import Context
from .errors import TargetError
from .model import Target
from .rotation import LiveJob
from .state import State

__all__ = ["INTERRUPTED_HINT", "beat", "keep", "on_notice"]

log = logging.getLogger("batch")

C = TypeVar("C")

#: Seconds a job's ``running`` status waits for a batch of outcomes to carry
#: it before the keeper writes it on its own (the store shows it within 0.1 s).
START_DELAY = 0.02

#: Seconds between looks for this runner's jobs cancelled through a runner of
#: another process (one of this process tells it at once, and so does the
#: store's notice on PostgreSQL; the look is for a notice lost).
CANCEL_POLL = 0.1

#: Seconds before a beat the store refused is tried again (at most).
RETRY_BEAT = 0.5

#: The hint stored with a target left pending by a runner that is gone.
INTERRUPTED_HINT = (
    "its runner stopped before fetching it: fetch it again with batch-runner requeue"
    " or Runner.requeue_failed, or give runners Config(resume=...) to go on with such jobs"
)

Resume = Callable[[str], Any] | None


def keep(s: State[C], resume: Resume) -> None:
    """The keeper thread, until the runner's workers are joined: beat three
    times per lease (and at once when room frees under ``max_live``), store
    ``running`` for jobs no batch carried within ``START_DELAY``, look for
    jobs cancelled elsewhere; at the end, retire (release every lease)."""
    interval = s.config.takeover_after / 3
    with s.lock:
        next_beat = s.clock.monotonic() + interval
        next_poll = 0.0
        while not s.stopping:
            now = s.clock.monotonic()
            if s.starting and now >= s.starting_since + START_DELAY:
                _store_starting(s)
            elif now >= next_beat or s.want_room:
                # A beat the store refused is tried again soon: the gap a
                # stall leaves must be seen by the first beat after it.
                again = interval if beat(s, resume) else min(interval, RETRY_BEAT)
                next_beat = s.clock.monotonic() + again
            elif now >= next_poll and len(s.rotation):
                _poll_cancels(s)
                next_poll = s.clock.monotonic() + CANCEL_POLL
            else:
                due = [next_beat] + ([next_poll] if len(s.rotation) else [])
                if s.starting:
                    due.append(s.starting_since + START_DELAY)
                s.wait(s.chores, min(due) - now)
        with unlocked(s.lock):
            try:
                s.store.retire_runner(s.id)
            except store.StoreError:
                log.exception("cannot release the leases of runner %s; they lapse instead", s.id)


def on_notice(s: State[C], notice: str) -> None:
    """A notice of the store's (on PostgreSQL, sent by any process; called
    on the store's thread): a job cancelled, which this runner stops at
    once if it holds it; or jobs waiting for a runner with room, or notices
    lost, either of which calls for a beat now rather than at its time."""
    if notice.startswith(store.CANCELLED):
        s.cancelled_elsewhere(notice.removeprefix(store.CANCELLED))
    elif notice in (store.WORK, store.RESYNC):
        with s.lock:
            if not s.closed and s.room() != 0:
                s.want_room = True
                s.chores.notify()


def _store_starting(s: State[C]) -> None:
    """Store ``running`` for the jobs started since the last batch."""
    starting = take_starting(s)
    try:
        with unlocked(s.lock):
            s.store.store_targets((), starting=starting)
    except store.StoreError:
        log.warning("cannot store %d job(s) as running; trying again", len(starting))
        give_back_starting(s, starting)


def _poll_cancels(s: State[C]) -> None:
    """Halt the jobs this runner holds that were cancelled through another."""
    try:
        with unlocked(s.lock):
            ids = s.store.halted_jobs(s.id)
    except store.StoreError:
        log.warning("cannot look for cancelled jobs; trying again", exc_info=True)
        return
    for job_id in ids:
        job = s.rotation.get(job_id)
        if job is not None:
            s.halt(job)


def beat(s: State[C], resume: Resume) -> bool:
    """Renew this runner's leases and take the jobs it can; called with the
    lock held (released while the store works).

    Jobs the store no longer leases to this runner are halted (their lease
    lapsed and another runner took them); jobs cancelled elsewhere too. Only
    jobs known before the beat are judged by it: one submitted meanwhile may
    have been stored after the renewal. A job in flight that is not renewed
    is halted too: either this runner's own commit ended it meanwhile (and
    released its lease), or it is lost; either way no further target of it
    may start here. Returns whether the store answered.
    """
    lapse = s.config.takeover_after
    started = s.clock.monotonic()
    known = {job.id for job in s.rotation}
    in_flight = [job.id for job in s.rotation if job.running]
    room = s.room()
    s.want_room = False
    s.reserved += room or 0
    s.cancelled_in_beat = set()
    try:
        with unlocked(s.lock):
            got = s.store.beat_runner(
                s.id, lapse, room=room, foreign=resume is not None, keep=in_flight
            )
    except store.StoreError:
        log.warning("cannot renew the leases of runner %s; trying again", s.id, exc_info=True)
        return False
    finally:
        s.reserved -= room or 0
        cancelled, s.cancelled_in_beat = s.cancelled_in_beat, None
    if s.closed:
        return True  # what it took is released when the runner retires
    s.valid_until = started + lapse
    s.wake_worker()
    for job in s.rotation:
        if job.id not in known or job.lost:
            continue
        if job.id in got.ended:
            s.halt(job)
        elif job.id not in got.held:
            if job.running:
                # Its outcome may be in a commit of this runner's that ended
                # it (and released the lease), or it is lost: either way
                # nothing more of it starts here.
                log.info("job %s: lease not renewed while in flight; it stops here", job.id)
            else:
                log.warning("runner %s lost the lease of job %s to another runner", s.id, job.id)
            s.halt(job, lost=True)
    for row, token in got.taken:
        adopted = _adopt(s, row, store.Lease(s.id, token), resume)
        if adopted is not None and adopted.id in cancelled:
            s.halt(adopted)
    return True


def _adopt(s: State[C], row: store.JobRow, lease: store.Lease, resume: Resume) -> LiveJob[C] | None:
    """Run a job just leased to this runner, from its first pending target
    (returns it), or end it ``interrupted`` if no caller can be had for it."""
    caller = _caller(s, row, resume)
    pending = [t.pos for t in row.targets if t.status == "pending"]
    age = max(0.0, time.time() - row.created_at)
    if caller is None or not pending:
        try:
            with unlocked(s.lock):
                ended = s.store.interrupt_job(row.id, INTERRUPTED_HINT, lease)
        except store.StoreError:
            log.warning("cannot end job %s; it lapses for the next runner", row.id)
            return None
        if ended is not None:
            status, count = ended
            for _ in range(count):
                s.stored(TargetError("interrupted", INTERRUPTED_HINT), 0.0, 0)
            s.ended(row.id, row.owner, status, age)
        return None
    job = LiveJob(
        row.id,
        row.owner,
        caller,
        [Target(t.ref) for t in row.targets],
        s.clock.monotonic() - age,
        lease,
        Context(s.ctx),
    )
    job.next = pending[0]
    job.started = row.status == "running"
    job.done = sum(t.status == "done" for t in row.targets[: job.next])
    job.failed = job.next - job.done
    s.add([job])
    return job


def _caller(s: State[C], row: store.JobRow, resume: Resume) -> C | None:
    """The caller to run ``row`` for: the one it was submitted with, if it
    waited for room here; else what ``Config.resume`` gives; else None."""
    if row.runner_id == s.id and row.owner in s.waiting:
        return s.unwait(row.owner)
    if resume is None:
        return None
    try:
        caller = resume(row.owner)
    except BaseException:
        log.exception("Config.resume(%r) raised; that caller's jobs end interrupted", row.owner)
        return None
    if caller is not None and getattr(caller, "id", None) != row.owner:
        log.error(
            "Config.resume(%r) gave a caller with another id; jobs end interrupted", row.owner
        )
        return None
    return caller  # type: ignore[no-any-return]  # resume is the user's: it gives their C
