"""The group commit: finished fetches recorded a batch at a time, one
transaction each, with the runner's lock released while the store writes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import store

from .attempt import Outcome
from .errors import RetryLater
from .hooks import call_hook
from .locks import unlocked
from .pacing import Answer
from .rotation import LiveJob
from .state import State
from .states import LIVE_JOB, JobStatus, TargetState, ended_status
from .trouble import Trouble

__all__ = ["finished", "gather", "give_back_starting", "record", "take_starting"]

log = logging.getLogger("batch")

C = TypeVar("C")
T = TypeVar("T")

#: What an upstream's pace learns of an outcome.
_ANSWERS = {
    TargetState.DONE: Answer.DONE,
    TargetState.FAILED: Answer.FAILED,
    TargetState.PENDING: Answer.BUSY,
}

#: Seconds between tries of a store write the store refused: doubling from
#: the first to the most.
BACKOFF_FIRST = 0.01
BACKOFF_MAX = 1.0


#: The longest the group commit waits for quick fetches in flight before it
#: writes (seconds): see :func:`gather`.
GATHER_FOR = 0.001
#: The weight of the latest fetch in ``State.fetch_seconds``.
_LATEST = 1 / 16


def finished(s: State[C], job: LiveJob[C], outcome: Outcome) -> None:
    """A fetch of ``job`` is done: its upstream learns the answer, and its
    outcome waits to be recorded (whoever waits on ``writes`` is told).
    Called with the lock held."""
    s.inflight -= 1
    call_hook(s.hooks.inflight, s.inflight)
    s.fetch_seconds += (outcome.seconds - s.fetch_seconds) * _LATEST
    if job.pace is not None:
        now = s.clock.monotonic()
        s.rotation.returned(job, _ANSWERS[outcome.status], outcome.seconds, outcome.after, now)
        s.pass_on(now)  # a job parked on that upstream may start now
        s.paced()
    s.finished.append((job, outcome))
    if len(s.finished) == 1 or not s.inflight:
        s.writes.notify()  # the first to record, or the last a batch may gather


def record(s: State[C]) -> None:
    """Record every finished fetch, a batch at a time, until none is left.
    Called with the lock held, by one worker at a time (``s.writing``).

    Each batch is stored in one transaction with the lock released: the
    group commit that lets the other workers pick and fetch meanwhile, and
    share the next commit. Nothing the write depends on can change
    meanwhile: its jobs stay running (no other worker touches them), what it
    stores was decided under the lock, and they move on only once the lock
    is taken again. Before each batch, quick fetches about to finish are
    waited for (:func:`gather`).
    """
    s.writing = True
    try:
        while s.finished:
            gather(s)
            finished, s.finished = s.finished, []
            now = s.clock.monotonic()
            _save(s, [(j, o) for j, outcome in finished if (o := _ended(s, j, outcome, now))])
            if s.closed:
                # A waiter must learn that its job will not end.
                s.changed_all()
    finally:
        s.writing = False


def gather(s: State[C]) -> None:
    """Before a batch is written: while fetches take less than
    ``GATHER_FOR`` (by their moving average) and more outcomes are coming
    (a fetch is in flight, or a job can start and an idle worker is there
    to take it), wait for them, lock released, ``GATHER_FOR`` at most by
    the system's clock.

    Without it, quick fetches fall into a rhythm of two batches: while one
    is written, the jobs of the other fetch again and wait, and are
    written alone next (10 jobs of no-op targets: a commit of 9 outcomes,
    then one of 1, over and over). Waiting, they share one commit, which
    costs about what either did alone. Slower fetches are not waited for:
    a commit that waited for them would hold up the outcomes in hand.
    """
    if s.fetch_seconds < GATHER_FOR:
        s.writes.wait_for(lambda: not _coming(s), GATHER_FOR)


def _coming(s: State[C]) -> bool:
    """Whether more outcomes are on their way: a fetch is in flight, or a
    job can start and an idle worker is there to take it."""
    if s.closed:
        return False
    if s.inflight:
        return True
    idle = s.idle.sleeping or s.idle.waking
    return bool(idle) and s.rotation.ready(s.clock.monotonic())


def _ended(s: State[C], job: LiveJob[C], outcome: Outcome, now: float) -> Outcome | None:
    """The outcome to store for ``job``'s target, or None when it came back
    busy and is to be tried again (rule 3): then the job waits on
    ``retry_at``, or leaves if halted meanwhile."""
    if outcome.status is not TargetState.PENDING:
        return outcome
    if job.halted:
        s.settle(job)  # it leaves: nothing more of it will be tried
        return None
    since = job.busy(now)
    retry_for = s.config.retry_for
    if now - since > retry_for:
        return outcome.busy_too_long(retry_for)
    if now + outcome.after - since > retry_for:
        return outcome.busy_too_long(retry_for, asked=True)
    wait = max(s.config.retry_wait, outcome.after)
    job.hold_until(now + wait)
    s.retrying(outcome.err or RetryLater(), wait)
    s.settle(job)
    return None


def _save(s: State[C], ended: list[tuple[LiveJob[C], Outcome]]) -> None:
    """Store these outcomes in one transaction, each job's terminal status
    with its last target, and the jobs starting as running; then move the
    jobs on. Called with the lock held; releases it while the store writes.

    A store that fails the write (locked, disk full, connection lost, or
    anything else it or its driver raises) is asked again with backoff
    until it accepts; the jobs stay running, so none starts its next target
    before its outcome is stored. Once the runner is closing it is not asked
    again: the outcomes are dropped and the targets stay pending, for the
    next runner.

    A write reported failed may have committed all the same (the answer to
    its COMMIT was lost): the next try then finds its targets stored, and
    the store refuses them. So a refused outcome is not taken for a lost
    lease: the store is asked who holds the job (:func:`_resync`).
    """
    starting = take_starting(s)
    if not ended and not starting:
        return

    def write() -> tuple[list[store.TargetOutcome], store.Stored]:
        # Cancel may come while the store refuses: decide each time, under
        # the lock; store with it released.
        outcomes = [_stored(job, o) for job, o in ended]
        with unlocked(s.lock):
            stored = s.ledger.store_targets(
                outcomes, max_bytes=s.config.max_bytes, starting=starting
            )
        return outcomes, stored

    answer = _ask(
        s,
        s.trouble("the group commit"),
        write,
        again=bool(ended),
        failing=("cannot store %d outcome(s)", len(ended)),
        closing=(
            "runner closing: %d outcome(s) dropped; their targets stay pending for the next runner",
            len(ended),
        ),
    )
    if answer is None:
        if s.closed:
            for job, _ in ended:
                s.settle(job)
        else:
            give_back_starting(s, starting)
        return
    outcomes, stored = answer
    refused: list[tuple[LiveJob[C], Outcome, store.StoreError]] = []
    for i, (job, outcome) in enumerate(ended):
        why = stored.refused.get(i)
        if why is not None:
            refused.append((job, outcome, why))  # still running: no worker picks it
            continue
        end = outcomes[i].job_status if i in stored.ended else None
        if i in stored.cancelled:
            job.cancel()
        _advance(s, job, outcome, end)
    if refused:
        _resync(s, refused)


def _resync(s: State[C], refused: list[tuple[LiveJob[C], Outcome, store.StoreError]]) -> None:
    """The store refused these outcomes (the job's lease is another's, the
    job is gone, or the target is stored already): ask it, in one read made
    with the lock released, who holds each job and what of it is stored,
    and go on from there. Called with the lock held by the recording
    worker; the jobs are running until then, so nothing else moves them.

    - The job is gone (evicted once cancelled), or another runner holds it
      (its token is not this runner's): it is lost here and leaves, with no
      hook: the job is the other's to report.
    - This runner holds it still: the store's targets are the truth. A
      commit whose answer was lost stored this very outcome (it was
      refused as "not pending"): its ``target`` hook is called now, once,
      as its commit had succeeded. The job goes on from its first pending
      target; if the store has it terminal, it leaves as the store says
      (``cancelled``: the cancel reported it; ended by that lost commit:
      its ``job`` hooks are called now, once).

    A store that cannot be read is asked again with backoff, as the commit
    is; once the runner is closing, the jobs leave as lost instead (their
    leases are released as the runner retires, so the next runner finds
    them as the store has them).
    """
    ids = [job.id for job, _, _ in refused]

    def read() -> dict[str, tuple[store.JobRow, str | None, int]]:
        with unlocked(s.lock):
            return s.ledger.job_leases(ids)

    seen = _ask(
        s,
        s.trouble("reading the jobs of refused outcomes"),
        read,
        failing=("cannot learn who holds %d job(s) whose outcome the store refused", len(ids)),
        closing=(
            "runner closing: cannot learn who holds %d job(s) whose outcome the store"
            " refused; they leave this runner",
            len(ids),
        ),
    )
    if seen is None:
        for job, _, _ in refused:
            job.lose()
            s.settle(job)
        return
    for job, outcome, why in refused:
        _resync_one(s, job, outcome, why, seen.get(job.id))


def _ask(
    s: State[C],
    trouble: Trouble,
    call: Callable[[], T],
    *,
    failing: tuple[str, int],
    closing: tuple[str, int],
    again: bool = True,
) -> T | None:
    """``call()``'s answer (``call`` is made with the lock held, and
    releases it while the store works), asked again while the store fails
    it (whatever it or its driver raises: no worker dies of it), after
    ``BACKOFF_FIRST`` seconds, doubling up to ``BACKOFF_MAX``, each failure
    logged as ``failing`` (its message and count). None once the runner is
    closing (the failure logged as ``closing``), or, not asked ``again``,
    at the first failure (not logged: the caller gives back what it was
    for). ``call`` never answers None. Called with the lock held, which it
    holds again when it returns."""
    delay = BACKOFF_FIRST
    while True:
        try:
            answer = call()
        except Exception:  # whatever the store or its driver raises: no worker dies of it
            if s.closed and not s.draining:
                log.exception(*closing)
                return None
            if not again:
                return None
            msg, count = failing
            trouble.failed(msg + "; trying again in %.2gs", count, delay)
            s.wait(s.done, delay)
            delay = min(2 * delay, BACKOFF_MAX)
            continue
        trouble.ok()
        return answer


def _resync_one(
    s: State[C],
    job: LiveJob[C],
    outcome: Outcome,
    why: store.StoreError,
    seen: tuple[store.JobRow, str | None, int] | None,
) -> None:
    """Move ``job``, whose ``outcome`` the store refused (``why``), to what
    the store has of it (``seen``, None if it is gone): see :func:`_resync`."""
    if seen is None:
        log.warning("target %d of job %s not stored: %s; the job is gone", job.next, job.id, why)
        job.lose()
        s.settle(job)
        return
    row, owner, token = seen
    live = row.status in LIVE_JOB
    # Held by this runner with this lease; a terminal job's lease may be
    # released already (by the commit that ended it, or by a beat once it
    # was cancelled), and it keeps its last token.
    if token != job.lease.token or not (owner == s.id or (owner is None and not live)):
        log.warning(
            "target %d of job %s not stored: %s; runner %s holds it (token %d)",
            job.next,
            job.id,
            why,
            owner,
            token,
        )
        job.lose()
        s.settle(job)
        return
    pending = next(
        (t.pos for t in row.targets if t.status == TargetState.PENDING), len(row.targets)
    )
    if pending == job.next + 1:
        # This outcome was stored by a try whose answer was lost.
        log.info("job %s: target %d was stored by a commit reported failed", job.id, job.next)
        s.stored(outcome.err, outcome.seconds, outcome.nbytes)
    elif pending != job.next:
        log.error(
            "job %s: the store has %d target(s) stored where this runner had %d; it goes on"
            " as the store says",
            job.id,
            pending,
            job.next,
        )
    job.resume_at(pending, sum(t.status == TargetState.DONE for t in row.targets[:pending]))
    if row.status == JobStatus.CANCELLED:
        job.cancel()  # the cancel called the job hook
    elif not live:
        # Ended by the commit whose answer was lost: reported now, once.
        s.ended(job.id, job.owner, row.status, s.clock.monotonic() - job.created)
        job.lose()  # in case a target is pending all the same: it leaves
    elif job.finished:
        # Live with no target pending: no write of this runner leaves a job
        # so. It leaves; the next beat finds its lease held here with no job
        # in the rotation, and ends it by its targets.
        log.error("job %s: every target is stored and the job is still live", job.id)
        job.lose()
    s.settle(job)


def take_starting(s: State[C]) -> list[tuple[str, store.Lease | None]]:
    """The jobs to be stored as running, taken from ``s.starting``: the
    caller stores them, or gives them back with :func:`give_back_starting`."""
    starting, s.starting = s.starting, []
    return [(job.id, job.lease) for job in starting if not job.halted]


def give_back_starting(s: State[C], starting: list[tuple[str, store.Lease | None]]) -> None:
    """The running status of these jobs could not be stored: the next batch
    (or the keeper) tries again."""
    jobs = [job for job_id, _ in starting if (job := s.rotation.get(job_id)) is not None]
    if jobs:
        # Not before BACKOFF_MAX: a store that refuses is not asked in a loop.
        s.starting_since = s.clock.monotonic() + BACKOFF_MAX
        s.starting[:0] = jobs


def _stored(job: LiveJob[C], outcome: Outcome) -> store.TargetOutcome:
    """What to store for ``job``'s next target: ``outcome``, with the job's
    status by its targets (rule 3) if that is its last and it is not
    cancelled."""
    end = None
    if not job.cancelled and job.next + 1 == len(job.targets):
        done = job.done + (outcome.status is TargetState.DONE)
        end = ended_status(done, job.next + 1 - done)
    return store.TargetOutcome(
        job.id,
        job.next,
        outcome.status,
        outcome.result,
        outcome.error,
        outcome.hint,
        end,
        job.lease,
    )


def _advance(s: State[C], job: LiveJob[C], outcome: Outcome, end: JobStatus | None) -> None:
    """Move ``job`` past the target whose ``outcome`` was just stored, and
    out of the rotation if that ended it (``end``) or it was halted; then
    tell the hooks (target, then job, then depth) and the waiters.

    The walk goes forward: the job's transitions first (``rotation``), what
    is reported of them after (``state``). No hook sees the rotation in
    between: hooks run under the lock, and cannot call the runner."""
    nbytes = outcome.nbytes
    job.advance(outcome.status is TargetState.DONE)
    left = s.rotation.settle(job)
    s.stored(outcome.err, outcome.seconds, nbytes)
    if end is not None:
        s.ended(job.id, job.owner, end, s.clock.monotonic() - job.created)
    s.settled(job, left)
