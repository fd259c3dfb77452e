"""The worker loop: pick the next job in the rotation, fetch one target, record it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from . import commit, timeouts, tracing
from .attempt import attempt
from .context import Context
from .hooks import call_hook
from .idle import ThreadSleeper
from .model import Target
from .rotation import LiveJob
from .state import State

__all__ = ["pick", "retry_in", "take", "work"]

log = logging.getLogger("batch")

C = TypeVar("C")


def work(s: State[C], fetch: Callable[[Context, C, Target], object]) -> None:
    """One worker thread: until the runner closes, pick a job, fetch its next
    target, and hand the outcome to the group commit.

    Only the worker running a job moves its ``next``, so its target is read
    outside the lock. ``attempt`` never raises, whatever the fetch does;
    should the library's own bookkeeping raise all the same, the job in
    hand is released (not left running) before the thread ends, and
    ``Runner.statistics().workers`` shows one fewer.
    """
    job: LiveJob[C] | None = None
    sleeper = ThreadSleeper(s.lock)
    limited = s.config.timeout is not None
    timed: timeouts.Fetch[C] | None = None
    try:
        with s.lock:
            job = pick(s, sleeper)
            if job is not None and limited:
                timed = timeouts.started(s, job)
        while job is not None:
            if s.config.tracing and tracing.fetches_recorded():
                with tracing.span(job) as told:
                    outcome = attempt(fetch, job.ctx, job.caller, job.targets[job.next])
                    told.append(outcome)
            else:
                outcome = attempt(fetch, job.ctx, job.caller, job.targets[job.next])
            with s.lock:
                if timed is None:
                    commit.finished(s, job, outcome)
                elif not timeouts.returned(s, timed, outcome):
                    return  # abandoned at its time limit, and replaced
                # Let go of the turn before waiting for the next one: a job
                # that leaves the rotation must not keep its caller alive here.
                job = None
                if not s.writing:
                    commit.record(s)
                job = pick(s, sleeper)
                if job is not None and limited:
                    timed = timeouts.started(s, job)
    except BaseException:
        log.critical("a batch worker thread ended on an error of the runner's own", exc_info=True)
        if job is not None:
            with s.lock:
                if timed is not None:
                    timeouts.forget(s, timed)
                if job.running and not (timed is not None and timed.abandoned):
                    s.settle(job)
        raise


def pick(s: State[C], sleeper: ThreadSleeper) -> LiveJob[C] | None:
    """Wait (as ``sleeper``) for a job that can start a target and mark it
    in flight; None once the runner is closed. Outcomes no worker recorded
    (those of fetches abandoned at their time limit) are recorded first.
    Called with the lock held."""
    while not s.closed:
        if s.finished and not s.writing:
            commit.record(s)
            continue
        job = take(s)
        if job is not None:
            return job
        # One timed wait on the earliest retry, not a timer per retry; past
        # valid_until, only a renewal (which wakes a worker) helps.
        s.sleep(sleeper, retry_in(s))
    return None


def take(s: State[C]) -> LiveJob[C] | None:
    """The next job that can start a target now, marked in flight (and to be
    stored ``running`` if it just started); None if none can. Called with
    the lock held; whoever takes the job fetches its next target."""
    now = s.clock.monotonic()
    job = None if now >= s.valid_until else s.rotation.pick(now)
    s.paced()
    if job is None:
        return None  # the caller sleeps, on the earliest time a job may start
    if s.rotation.paces is not None:
        s.keep_timer(now)
    s.pass_on(now)
    if job.start():
        if not s.starting:
            s.starting_since = now
            s.chores.notify()
        s.starting.append(job)
    s.inflight += 1
    call_hook(s.hooks.inflight, s.inflight)
    return job


def retry_in(s: State[C]) -> float | None:
    """Seconds until the earliest held-back target may be tried (None if
    none waits, or if no target may start before a renewal)."""
    now = s.clock.monotonic()
    return None if now >= s.valid_until else s.rotation.next_retry_in(now)
