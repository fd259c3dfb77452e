"""The event loop that runs a runner's ``async def`` fetch, and the thread
that records what they return.

An async runner has no worker threads. One thread runs an event loop of
its own (:func:`serve`): it takes jobs from the rotation as the worker
threads would (``worker.take``: the same order, one target in flight per
job), starts a task for each, at most ``Config.workers`` at once, and
sleeps while none can start, woken like an idle worker (``batch.idle``).
A fetch's outcome joins ``finished`` as a worker's would, and one more
thread (:func:`write`) records them in batches (``commit.record``): the
store is never written from the loop, so no commit holds up a fetch.

Close: no task starts once the runner is closed; the fetches in flight see
their context cancelled, and what they return is recorded; the loop ends
once none is left (awaiting the fetch's ``aclose()`` if it has one), and
the writer once everything finished is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from . import commit, worker
from .attempt import attempt_async
from .clock import SYSTEM
from .context import Context
from .idle import Sleeper
from .model import Target
from .rotation import LiveJob
from .state import State

__all__ = ["AsyncFetch", "serve", "write"]

log = logging.getLogger("batch")

C = TypeVar("C")

#: An ``async def`` fetch.
AsyncFetch = Callable[[Context, C, Target], Awaitable[object]]

#: Seconds between looks at a clock other than the system's while a retry
#: waits: the loop sleeps on its own clock, which such a clock does not move.
STEPPED_CLOCK_POLL = 0.002


class LoopSleeper(Sleeper):
    """The event loop's place among the idle workers: a wake sets its event
    from whatever thread wakes it."""

    __slots__ = ("event", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.event = asyncio.Event()

    def wake(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


def serve(s: State[C], fetch: AsyncFetch[C]) -> None:
    """The loop thread: run fetches until the runner closes and none is in
    flight; then, if the fetch has an ``aclose()`` (an HTTP client it keeps
    open, say), await it on the loop its fetches ran on. Should the
    runner's own bookkeeping fail, the loop ends and the failure is logged
    (``statistics().workers`` shows 0)."""
    try:
        asyncio.run(_serve_then_close(s, fetch))
    except BaseException:
        log.critical("the batch event loop ended on an error of the runner's own", exc_info=True)
        raise


async def _serve_then_close(s: State[C], fetch: AsyncFetch[C]) -> None:
    await _serve(s, fetch)
    aclose = getattr(fetch, "aclose", None)
    if callable(aclose):
        try:
            await aclose()
        except Exception:  # the user's: logged, and the runner closes all the same
            log.exception("the fetch's aclose() raised")


async def _serve(s: State[C], fetch: AsyncFetch[C]) -> None:
    sleeper = LoopSleeper(asyncio.get_running_loop())
    tasks: set[asyncio.Task[None]] = set()
    while True:
        sleeper.event.clear()
        with s.lock:
            jobs: list[LiveJob[C]] = []
            while not s.closed and len(tasks) + len(jobs) < s.config.workers:
                job = worker.take(s)
                if job is None:
                    break
                jobs.append(job)
            if s.closed and not tasks and not jobs:
                return
            idle = not s.closed and len(tasks) + len(jobs) < s.config.workers
            timeout = s.idle.nap(sleeper, s.clock.monotonic(), worker.retry_in(s)) if idle else None
        for job in jobs:
            task = asyncio.create_task(_one(s, fetch, job))
            tasks.add(task)
            task.add_done_callback(functools.partial(_ended, tasks, sleeper))
        try:
            await _sleep(sleeper, s, timeout)
        finally:
            if idle:
                with s.lock:
                    s.idle.woke(sleeper, worker.retry_in(s) is not None)


def _ended(tasks: set[asyncio.Task[None]], sleeper: LoopSleeper, task: asyncio.Task[None]) -> None:
    """A fetch's task ended: room for another."""
    tasks.discard(task)
    sleeper.event.set()


async def _sleep(sleeper: LoopSleeper, s: State[C], timeout: float | None) -> None:
    """Until woken (a job can start, a task ended, the runner closes), or
    ``timeout`` seconds of the runner's clock pass."""
    if timeout is not None and s.clock is not SYSTEM:
        timeout = min(timeout, STEPPED_CLOCK_POLL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(sleeper.event.wait(), timeout)


async def _one(s: State[C], fetch: AsyncFetch[C], job: LiveJob[C] | None) -> None:
    """Fetch ``job``'s next target; its outcome joins ``finished``. Then,
    as a worker thread would, take the next job that can start, if any,
    and fetch its target in turn: a task goes on while there is work."""
    while job is not None:
        outcome = await attempt_async(fetch, job.ctx, job.caller, job.targets[job.next])
        with s.lock:
            commit.finished(s, job, outcome)
            s.writes.notify()
            job = None if s.closed else worker.take(s)


def write(s: State[C]) -> None:
    """The writer thread: record what the fetches return, a batch at a
    time, until the runner is closed and nothing is in flight or left."""
    try:
        with s.lock:
            while True:
                while not s.finished and not (s.closed and not s.inflight):
                    s.wait(s.writes, None)
                if not s.finished:
                    return
                commit.record(s)
    except BaseException:
        log.critical("the batch writer thread ended on an error of the runner's own", exc_info=True)
        raise
