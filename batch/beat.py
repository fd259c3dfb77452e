"""The beat: a runner's leases renewed, and the jobs it takes (from a runner
gone, or waiting for room) adopted, or ended ``interrupted`` when no
caller can go on with them. The keeper thread beats (``keeper``); so does
a new runner, once, before its first job."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import store

from .calls import StoreCall
from .context import Context
from .errors import TargetError
from .locks import unlocked
from .model import Target
from .rotation import LiveJob
from .state import State
from .states import LIVE_JOB, JobStatus, TargetState

__all__ = ["INTERRUPTED_HINT", "PER_LEASE", "TROUBLE", "Resume", "answering", "beat"]

log = logging.getLogger("batch")

C = TypeVar("C")

#: The hint stored with a target left pending by a runner that is gone.
INTERRUPTED_HINT = (
    "its runner stopped before fetching it: fetch it again with batch-runner requeue"
    " or Runner.requeue_failed, or give runners Config(resume=...) to go on with such jobs"
)

Resume = Callable[[str], Any] | None

#: The kind of store call a beat is, for its failures (``State.trouble``).
TROUBLE = "the beat"

#: Beats a runner makes within each lease (``Config.takeover_after``).
PER_LEASE = 3


def answering(s: State[Any]) -> bool:
    """Whether the store answers the runner's beats (lock held): the last
    one did, and the one after it, due a beat's interval later, has not
    been waiting for an answer for more than half an interval more."""
    interval = s.config.takeover_after / PER_LEASE
    renewed = s.valid_until - s.config.takeover_after  # when the last answered beat began
    return not s.trouble(TROUBLE).failing and s.clock.monotonic() - renewed <= 1.5 * interval


def beat(s: State[C], resume: Resume) -> bool:
    """Renew this runner's leases and take the jobs it can; called with the
    lock held (released while the store works, and while ``Config.resume``
    runs).

    Jobs the store no longer leases to this runner are halted (their lease
    lapsed and another runner took them); jobs cancelled elsewhere too. Only
    jobs known before the beat are judged by it: one submitted meanwhile may
    have been stored after the renewal. A job in flight that is not renewed
    is halted too: either this runner's own commit ended it meanwhile (and
    released its lease), or it is lost; either way no further target of it
    may start here. Jobs the store says this runner holds and that it does
    not run are taken up (:func:`_take_up`). A store that fails is logged
    (once for a run of failures) and tried again by the keeper, whatever it
    raises. Returns whether the store answered.
    """
    lapse = s.config.takeover_after
    started = s.clock.monotonic()
    known = {job.id for job in s.rotation}
    in_flight = [job.id for job in s.rotation if job.running]
    room = 0 if s.closed else s.room()  # a closing runner takes nothing
    s.want_room = False
    trouble = s.trouble(TROUBLE)
    # Holds the room for the jobs this beat takes until they join the
    # rotation; notes a cancel meanwhile until they are adopted.
    with s.calls.under_way(room or 0) as call:
        try:
            with unlocked(s.lock):
                newer = s.ledger.newer_schema()
                got = None
                if newer is None:
                    got = s.ledger.beat_runner(
                        s.id,
                        lapse,
                        room=room,
                        # A runner that runs nothing (max_live=0) takes no
                        # job, not even one to end: as one that resumes any.
                        foreign=resume is not None or s.config.max_live == 0,
                        keep=in_flight,
                        release=not s.closed,
                    )
        except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
            trouble.failed("cannot renew the leases of runner %s; trying again", s.id)
            # No due time is known until a beat reads it again, but for
            # those submitted meanwhile: the keeper tries again at its own
            # pace, or then.
            s.due_at = call.due
            return False
        trouble.ok()
        if got is None:
            assert newer is not None
            _outdated(s, newer)
            return True
        s.due_at = min(math.inf if got.due is None else started + got.due, call.due)
        for job_id, owner, home in got.cancelled:
            # Never ran: told here, once, as a cancel through this runner is.
            s.ended(job_id, owner, JobStatus.CANCELLED, None)
            if home == s.id and owner in s.waiting:
                s.unwait(owner)
        if s.closed:
            return True  # what it took is released when the runner retires
        s.valid_until = started + lapse
        s.paused_in_store(got.paused, call)
        s.wake_worker()
        for job in s.rotation:
            if job.id not in known or job.lost:
                continue
            if job.id in got.ended:
                s.halt(job)
            elif job.id not in got.held:
                if job.running:
                    # Its outcome may be in a commit of this runner's that
                    # ended it (and released the lease), or it is lost:
                    # either way nothing more of it starts here.
                    log.info("job %s: lease not renewed while in flight; it stops here", job.id)
                else:
                    log.warning(
                        "runner %s lost the lease of job %s to another runner", s.id, job.id
                    )
                s.halt(job, lost=True)
        _adopt(s, [(row, store.Lease(s.id, token)) for row, token in got.taken], resume, call)
        call.places = 0  # the jobs it took joined
        _take_up(s, got.held, known, resume)
        return True


def _outdated(s: State[C], version: int) -> None:
    """A newer library stepped the store's schema on (a deploy under way):
    this runner, which may not write it right any more, stops taking
    targets, and its keeper releases its jobs to the newer runners."""
    s.shut(cancel=True)  # before the reason shows: closed_reason is read without the lock
    s.outdated = (
        f"the store's schema is at version {version}, newer than this library's:"
        f" runner {s.id} stops; upgrade batch-store to run on it"
    )
    log.error("%s", s.outdated)


def _take_up(s: State[C], held: dict[str, int], known: set[str], resume: Resume) -> None:
    """Adopt the jobs the store leases to this runner (``held``, by the beat
    just made) that it does not run: in no rotation, not being stored by a
    submit under way (``State.calls``), and not known before the beat (one that left
    meanwhile ended or was lost; should its lease be held here all the
    same, the next beat, which does not know it, takes it up).

    A write whose answer was lost leaves such jobs: a submit that raised
    after its jobs were stored, a beat whose takes never reached memory, an
    ``interrupt_job`` reported failed. Only a beat would ever see them
    again, and it would renew their leases for ever: live, with no runner
    going on with them. So each is read back (lock released) and adopted as
    a job just taken: run from its first pending target with its caller
    (kept for it if it waited for room here, else from ``Config.resume``),
    or ended ``interrupted``. Adopting rather than releasing it: the lease
    is this runner's already, so the writes that end or run it are fenced
    by it like any other; a release would only have the next beat with
    room take it and do the same. As room allows under ``max_live``: the
    others wait, renewed, for a beat with room, as jobs waiting for room
    do. Lock held; released for the read.
    """
    orphans = [
        job_id
        for job_id in held
        if job_id not in known and not s.calls.storing(job_id) and s.rotation.get(job_id) is None
    ]
    room = s.room()
    if room is not None:
        orphans = orphans[:room]
    if not orphans:
        return
    trouble = s.trouble("reading the jobs a runner holds and does not run")
    with s.calls.under_way(len(orphans)) as call:
        try:
            with unlocked(s.lock):
                seen = s.ledger.job_leases(orphans)
        except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
            trouble.failed(
                "cannot read the %d job(s) runner %s holds and does not run; the next beat"
                " tries again",
                len(orphans),
                s.id,
            )
            return
        trouble.ok()
        if s.closed:
            return  # they are released when the runner retires
        taken = []
        for job_id in orphans:
            got = seen.get(job_id)
            if got is None:
                continue  # gone
            row, owner, token = got
            if owner != s.id or token != held[job_id] or row.status not in LIVE_JOB:
                continue  # another's now; or terminal, and the next beat releases it
            log.warning(
                "runner %s holds job %s and does not run it (a store write whose answer was"
                " lost?): it takes it up",
                s.id,
                job_id,
            )
            taken.append((row, store.Lease(s.id, token)))
        _adopt(s, taken, resume, call)


def _adopt(
    s: State[C],
    taken: list[tuple[store.JobRow, store.Lease]],
    resume: Resume,
    call: StoreCall,
) -> None:
    """Run each job just leased to this runner (with that lease) from its
    first pending target, or end it ``interrupted`` if no caller can be had
    for it or nothing is pending. Its caller is the one it was submitted
    with, if it waited for room here; else what ``Config.resume`` gives
    (asked once per caller id, with the lock released: user code never runs
    under it); else None. A job cancelled since ``call`` (which took it)
    began joins halted. Lock held; released while
    ``resume`` runs and while the store ends jobs.
    """
    if not taken:
        return
    kept: dict[int, C] = {}
    ask: dict[str, None] = {}  # the caller ids to ask resume for, in order
    for k, (row, _) in enumerate(taken):
        if row.runner_id == s.id and row.owner in s.waiting:
            kept[k] = s.unwait(row.owner)
        elif resume is not None:
            ask[row.owner] = None
    resumed: dict[str, C | None] = {}
    if ask and resume is not None:
        with unlocked(s.lock):
            resumed = {owner: _resume(resume, owner) for owner in ask}
    for k, (row, lease) in enumerate(taken):
        if s.closed:
            return  # what it took is released when the runner retires
        job = _run_or_end(s, row, lease, kept[k] if k in kept else resumed.get(row.owner))
        if job is not None and job.id in call.cancelled:
            s.halt(job)


def _run_or_end(
    s: State[C], row: store.JobRow, lease: store.Lease, caller: C | None
) -> LiveJob[C] | None:
    """Run a job just leased to this runner, from its first pending target
    (returns it), or end it ``interrupted`` if there is no ``caller`` for
    it or nothing pending. Lock held; released while the store ends it."""
    pending = [t.pos for t in row.targets if t.status == TargetState.PENDING]
    age = max(0.0, time.time() - row.created_at)
    if caller is None or not pending:
        trouble = s.trouble("ending jobs no runner goes on with")
        try:
            with unlocked(s.lock):
                ended = s.ledger.interrupt_job(row.id, INTERRUPTED_HINT, lease)
        except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
            # Its lease stays this runner's: the next beat takes it up again.
            trouble.failed("cannot end job %s; the next beat tries again", row.id)
            return None
        trouble.ok()
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
        row.trace,
    )
    job.resume_at(
        pending[0],
        sum(t.status == TargetState.DONE for t in row.targets[: pending[0]]),
        started=row.status == JobStatus.RUNNING,
    )
    s.add([job])
    return job


def _resume(resume: Callable[[str], Any], owner: str) -> Any:
    """What ``Config.resume`` gives for the caller id ``owner``, checked:
    None if it gives None, raises, or gives a caller with another id.
    Called without the runner's lock (it is user code)."""
    try:
        caller = resume(owner)
    except BaseException:
        log.exception("Config.resume(%r) raised; that caller's jobs end interrupted", owner)
        return None
    if caller is not None and getattr(caller, "id", None) != owner:
        log.error("Config.resume(%r) gave a caller with another id; jobs end interrupted", owner)
        return None
    return caller
