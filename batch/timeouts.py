"""The time limit per target (``Config.timeout``): the fetch's context
cancelled at the limit, and a fetch that still has not returned
``GRACE`` seconds later abandoned.

A worker thread cannot be stopped, so an abandoned fetch's thread is left
to return when it will: its target is stored ``failed`` with the error
``timed out`` (not retried: a fetch that hangs past its limit says nothing
of whether a retry would fare better, and each retry could leave one more
thread behind), the job goes on, and a fresh worker takes the abandoned
one's place. At most ``Config.workers`` abandoned threads are replaced at
once; one that returns after all rejoins the workers if one is missing,
or ends. A runner whose workers are all abandoned renews no lease
(``all_hung``), so its jobs go to another runner. An ``async def`` fetch's
task is cancelled instead, and nothing is left behind but a task that
swallows its cancel.

Time limits are kept on the system clock, as the seconds a fetch took
are (``attempt``), whatever clock the runner was given.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from . import commit
from .attempt import TIMED_OUT, Outcome
from .hooks import call_hook
from .rotation import LiveJob
from .state import State
from .states import TargetState

__all__ = [
    "GRACE",
    "TIMED_OUT",
    "Fetch",
    "all_hung",
    "forget",
    "returned",
    "started",
    "timed",
    "watch",
]

log = logging.getLogger("batch")

C = TypeVar("C")

#: Seconds a fetch whose context was cancelled at its limit has to return
#: before it is abandoned.
GRACE = 0.5


class Fetch(Generic[C]):
    """One fetch under a time limit, from its start until it returns or is
    abandoned. Guarded by the runner's lock."""

    __slots__ = ("abandoned", "cancelled", "deadline", "job", "started", "thread")

    def __init__(self, job: LiveJob[C], started: float, limit: float) -> None:
        self.job = job
        self.started = started
        self.deadline = started + limit
        self.cancelled = False  # its context was cancelled at the limit
        self.abandoned = False  # its target is stored timed out; its thread left behind
        self.thread = threading.current_thread()


def started(s: State[C], job: LiveJob[C]) -> Fetch[C]:
    """A worker starts a fetch of ``job``: keep its time (lock held)."""
    assert s.config.timeout is not None
    fetch = Fetch(job, time.monotonic(), s.config.timeout)
    if not s.fetching:
        s.limits.notify()  # the watch sleeps untimed while nothing is fetched
    s.fetching[fetch] = None
    return fetch


def returned(s: State[C], fetch: Fetch[C], outcome: Outcome) -> bool:
    """``fetch`` returned ``outcome`` (lock held): hand it to the group
    commit, unless it was abandoned meanwhile. Returns whether its thread
    goes on as a worker: always, unless it was abandoned and no worker is
    missing."""
    if not fetch.abandoned:
        forget(s, fetch)
        _finished(s, fetch.job, outcome)
        return True
    s.hung.discard(fetch.thread)
    call_hook(s.hooks.abandoned, len(s.hung))
    log.info("a fetch abandoned at its time limit returned after %.1fs", _since(fetch))
    if s.short:
        s.short -= 1  # it takes the place no fresh worker took
        s.chores.notify()  # the keeper beats again, if it stopped
        return True
    return False


def forget(s: State[C], fetch: Fetch[C]) -> None:
    """``fetch`` is over, or its worker failed (lock held): no time limit
    of it is kept; the watch, which ends once the runner is closed and no
    fetch is in flight, is told when the last one goes."""
    s.fetching.pop(fetch, None)
    if s.closed and not s.fetching:
        s.limits.notify()


def watch(s: State[C], replace: Callable[[], None]) -> None:
    """The watch thread of a threaded runner with a time limit: cancel each
    fetch's context at its limit, abandon the fetch ``GRACE`` seconds later
    (``replace`` starts a fresh worker), and have the outcome recorded (by
    a worker; by the watch itself once the runner is closed, or every
    worker is abandoned, when none may be left to); until the runner is
    closed and no fetch is in flight. While a worker is left it makes no
    store call, so a store away holds up no time limit."""
    try:
        with s.lock:
            while True:
                now = time.monotonic()
                wake = None
                for fetch in list(s.fetching):
                    if not fetch.cancelled and now >= fetch.deadline:
                        fetch.cancelled = True
                        fetch.job.time_out()
                    if fetch.cancelled and now >= fetch.deadline + GRACE:
                        _abandon(s, fetch, replace)
                    else:
                        due = fetch.deadline + (GRACE if fetch.cancelled else 0.0)
                        wake = due if wake is None else min(wake, due)
                if (s.closed or all_hung(s)) and s.finished and not s.writing:
                    commit.record(s)  # no worker is left to
                    continue
                if s.closed and not s.fetching:
                    return
                s.limits.wait(None if wake is None else max(0.0, wake - time.monotonic()))
    except BaseException:
        log.critical(
            "the batch time-limit thread ended on an error of the runner's own", exc_info=True
        )
        raise


def all_hung(s: State[C]) -> bool:
    """Whether every worker of a threaded runner is a thread abandoned in a
    fetch (lock held): the runner can run none of its jobs, and should not
    hold their leases."""
    return s.short >= s.config.workers


async def timed(s: State[C], job: LiveJob[C], run: Callable[[], Awaitable[Outcome]]) -> Outcome:
    """Await ``run()`` (one fetch of ``job``) under the time limit, on the
    runner's event loop: at the limit the job's context is cancelled,
    ``GRACE`` seconds later the fetch's task is, and its outcome is
    ``timed out``. The task is counted abandoned until it ends."""
    limit = s.config.timeout
    assert limit is not None
    start = time.monotonic()
    task = asyncio.ensure_future(run())
    done, _ = await asyncio.wait((task,), timeout=limit)
    if not done:
        job.time_out()
        done, _ = await asyncio.wait((task,), timeout=GRACE)
    if done:
        return task.result()
    task.cancel()
    with s.lock:
        s.abandoned_tasks += 1
        call_hook(s.hooks.abandoned, s.abandoned_tasks)
    task.add_done_callback(lambda _: _task_ended(s))
    log.warning(_PAST, job.id, limit, TIMED_OUT)
    return _timed_out(limit, time.monotonic() - start)


#: The warning of a fetch abandoned: its job, the limit, what is stored.
_PAST = "a fetch of job %s ran past its time limit of %gs; its target is stored %r"


def _finished(s: State[C], job: LiveJob[C], outcome: Outcome) -> None:
    job.renew(s.ctx)
    commit.finished(s, job, outcome)


def _abandon(s: State[C], fetch: Fetch[C], replace: Callable[[], None]) -> None:
    """Store ``fetch``'s target timed out and leave its thread behind; a
    fresh worker takes its place while no more threads than workers are
    abandoned."""
    limit = s.config.timeout
    assert limit is not None
    del s.fetching[fetch]
    fetch.abandoned = True
    s.hung.add(fetch.thread)
    call_hook(s.hooks.abandoned, len(s.hung))
    log.warning(_PAST, fetch.job.id, limit, TIMED_OUT)
    _finished(s, fetch.job, _timed_out(limit, _since(fetch)))
    s.wake_worker()  # an idle worker records it (``worker.pick``)
    if s.closed:
        return  # no worker is wanted any more
    if len(s.hung) <= s.config.workers:
        replace()
    else:
        s.short += 1
        if all_hung(s):
            log.error(
                "every worker of runner %s is in a fetch past its time limit:"
                " its jobs are left to other runners",
                s.id,
            )


def _timed_out(limit: float, seconds: float) -> Outcome:
    return Outcome(
        TargetState.FAILED,
        seconds,
        error=TIMED_OUT,
        hint=f"the fetch did not return within timeout={limit:g}s",
    )


def _task_ended(s: State[C]) -> None:
    with s.lock:
        s.abandoned_tasks -= 1
        call_hook(s.hooks.abandoned, s.abandoned_tasks)


def _since(fetch: Fetch[C]) -> float:
    return time.monotonic() - fetch.started
