"""The event loop that runs a runner's ``async def`` fetch, and the thread
that records what they return.

An async runner has no worker threads. One thread runs an event loop of
its own (:func:`serve`; uvloop's where it is installed, ``Config.loop``)
with ``Config.workers`` coroutines (:class:`Workers`) that do what worker
threads do: take jobs from the rotation
(``worker.take``: the same order, one target in flight per job), await
their fetch, hand over the outcome; one with nothing to take parks, and the
loop is woken like an idle worker (``batch.idle``).
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
import collections
import functools
import importlib.util
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from . import commit, timeouts, tracing, worker
from .attempt import Outcome, attempt_async
from .clock import SYSTEM
from .context import Context
from .idle import Sleeper
from .model import Target
from .rotation import LiveJob
from .state import State

__all__ = ["AsyncFetch", "Workers", "new_loop", "serve", "write"]

log = logging.getLogger("batch")

C = TypeVar("C")

#: An ``async def`` fetch.
AsyncFetch = Callable[[Context, C, Target], Awaitable[object]]

#: Seconds between looks at a clock other than the system's while a retry
#: waits: the loop sleeps on its own clock, which such a clock does not move.
STEPPED_CLOCK_POLL = 0.002


class Workers(Generic[C]):
    """``Config.workers`` coroutines on the runner's event loop, each doing
    what a worker thread does: take a job, await its fetch, hand over the
    outcome, take the next. One that finds no job parks on a future of its
    own (``parked``), which a job taken for it resolves.

    Among the runner's idle workers (``State.idle``) the loop counts as one
    sleeper, registered whenever coroutines are parked: a wake (a job can
    start, a renewal, close) takes a job for the coroutine parked last and
    resumes it, then the next while jobs can start (``_woke``); a
    coroutine that takes a job while another can start wakes the loop's
    sleeper again (``State.pass_on``), as a worker thread wakes the next.
    The loop's sleeper keeps the retry timer as a thread would, with a
    timer of the loop's. Everything here but ``_wake`` runs on the loop.
    """

    def __init__(self, s: State[C], fetch: AsyncFetch[C]) -> None:
        self.s = s
        self.fetch = fetch
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()
        self.parked: collections.deque[asyncio.Future[LiveJob[C] | None]] = collections.deque()
        self.sleeper = LoopSleeper(self)
        self.asleep = False  # the sleeper is in s.idle (guarded by the runner's lock)
        self.timer: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        """Run the coroutines until the runner closes and none has a fetch."""
        await asyncio.gather(*(self._work() for _ in range(self.s.config.workers)))

    async def _work(self) -> None:
        s = self.s
        job: LiveJob[C] | None = None
        outcome = None
        limited = s.config.timeout is not None
        while True:
            with s.lock:
                if job is not None and outcome is not None:
                    if limited:
                        job.renew(s.ctx)
                    commit.finished(s, job, outcome)
                job = None if s.closed else worker.take(s)
                if job is None:
                    if s.closed:
                        return
                    park: asyncio.Future[LiveJob[C] | None] = self.loop.create_future()
                    self.parked.append(park)
                    self._sleep()
            if job is None:
                job = await park  # a job taken for it, or None: look again
                if job is None:
                    continue
            if self.s.config.tracing and tracing.fetches_recorded():
                with tracing.span(job) as told:
                    outcome = await self._attempt(job, limited)
                    told.append(outcome)
            else:
                outcome = await self._attempt(job, limited)

    def _attempt(self, job: LiveJob[C], limited: bool) -> Awaitable[Outcome]:
        """One fetch of ``job``'s next target, under the time limit if
        ``limited``."""
        if limited:
            run = functools.partial(
                attempt_async, self.fetch, job.ctx, job.caller, job.targets[job.next]
            )
            return timeouts.timed(self.s, job, run)
        return attempt_async(self.fetch, job.ctx, job.caller, job.targets[job.next])

    def _sleep(self) -> None:
        """Coroutines are parked: the loop's sleeper joins the idle workers,
        keeping the retry timer if it is the first to need it. Lock held."""
        if self.asleep:
            return
        s = self.s
        self.asleep = True
        timeout = s.idle.nap(self.sleeper, s.clock.monotonic(), worker.retry_in(s))
        if timeout is not None:
            if s.clock is not SYSTEM:
                timeout = min(timeout, STEPPED_CLOCK_POLL)
            self.timer = self.loop.call_later(timeout, self._woke)

    def _wake(self) -> None:
        """The sleeper was woken, from any thread (the lock held there): by
        a coroutine that took a job while another can start, on the loop
        itself, or by the writer, the keeper, a caller."""
        if threading.get_ident() == self.thread:
            self.loop.call_soon(self._woke)
        else:
            self.loop.call_soon_threadsafe(self._woke)

    def _woke(self) -> None:
        """On the loop, once woken or timed out: leave the idle workers and
        hand the parked coroutine parked last a job, taken for it; if others
        are parked, do so again once the loop has run what it has ready (so
        finished fetches reach the writer between the starts of a batch's
        jobs: starting them all in one call costs the async row a tenth of
        its rate). Once the runner closes, every parked coroutine resumes
        with none."""
        s = self.s
        with s.lock:
            if self.asleep:
                self.asleep = False
                s.idle.woke(self.sleeper, worker.retry_in(s) is not None)
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if s.closed:
                while (park := self._unpark()) is not None:
                    park.set_result(None)
                return
            park = self._unpark()
            if park is None:
                return
            job = worker.take(s)
            if job is None:
                self.parked.append(park)
                self._sleep()  # within reach of the next wake
                return
            park.set_result(job)
            if self.parked:
                self.loop.call_soon(self._woke)

    def _unpark(self) -> asyncio.Future[LiveJob[C] | None] | None:
        """The parked coroutine parked last (its frame is warm), taken off
        the parked; None if none is."""
        while self.parked:
            park = self.parked.pop()
            if not park.done():  # not cancelled with its task
                return park
        return None


class LoopSleeper(Sleeper):
    """The event loop's place among the idle workers."""

    __slots__ = ("workers",)

    def __init__(self, workers: Workers[Any]) -> None:
        super().__init__()
        self.workers = workers

    def wake(self) -> None:
        self.workers._wake()


def new_loop(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the event loop ``Config.loop`` names: uvloop's (for
    ``"auto"``, where it is installed) or asyncio's own."""
    if choice != "asyncio" and importlib.util.find_spec("uvloop") is not None:
        import uvloop  # noqa: PLC0415 - an optional extra, imported where used

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def serve(s: State[C], fetch: AsyncFetch[C]) -> None:
    """The loop thread: run fetches until the runner closes and none is in
    flight; then, if the fetch has an ``aclose()`` (an HTTP client it keeps
    open, say), await it on the loop its fetches ran on. Should the
    runner's own bookkeeping fail, the loop ends and the failure is logged
    (``statistics().workers`` shows 0)."""
    try:
        with asyncio.Runner(loop_factory=new_loop(s.config.loop)) as runner:
            runner.run(_serve(s, fetch))
    except BaseException:
        log.critical("the batch event loop ended on an error of the runner's own", exc_info=True)
        raise


async def _serve(s: State[C], fetch: AsyncFetch[C]) -> None:
    await Workers(s, fetch).run()
    with s.lock:
        if s.abandoned_tasks:
            # The loop's end waits for every task, and a task abandoned at
            # its time limit may never end: a close waits no longer for
            # this thread, as for a worker thread abandoned in a fetch.
            s.hung.add(threading.current_thread())
    aclose = getattr(fetch, "aclose", None)
    if callable(aclose):
        try:
            await aclose()
        except Exception:  # the user's: logged, and the runner closes all the same
            log.exception("the fetch's aclose() raised")


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
