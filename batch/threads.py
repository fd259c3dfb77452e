"""The runner's threads, from start to close: the workers (or the event loop
and its writer), the keeper, and the open runners of this process that a
cancel is told to."""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from . import aio, keeper, timeouts, worker
from .clock import SYSTEM
from .context import Context
from .model import Target
from .state import State
from .states import Reason

__all__ = ["Threads", "tell_others"]

C = TypeVar("C")

log = logging.getLogger("batch")

#: Seconds of each wait of a close for a thread to end.
JOIN_SLICE = 0.1
#: Seconds an interrupted close waits for the runner's lock to tell the
#: keeper to stop (a hook may hold it).
LET_GO = 1.0

#: The open runners of this process, so that a cancel through one reaches
#: the one holding the job at once; guarded by ``_OPEN_LOCK`` (runners open,
#: close and cancel on any thread).
_OPEN: weakref.WeakSet[State[Any]] = weakref.WeakSet()
_OPEN_LOCK = threading.Lock()


def tell_others(s: State[C], job_id: str) -> None:
    """``job_id`` was cancelled through the runner of ``s``: every other open
    runner of this process that holds it (a stale copy, if another runner
    took the job since) halts it now. Called without any runner's lock."""
    with _OPEN_LOCK:
        others = list(_OPEN)
    for other in others:
        if other is not s:
            other.cancelled_elsewhere(job_id)


class Threads:
    """A runner's threads: started together, stopped by :meth:`stop`.

    For a plain ``fetch``, ``Config.workers`` worker threads; for an
    ``async def`` one, one event loop thread and one thread that records
    what it returns. Besides them, the keeper (leases, beats, cancels).
    """

    def __init__(self, s: State[Any], fetch: Callable[[Context, Any, Target], object]) -> None:
        self._s = s
        self.is_async = _is_async(fetch)
        if self.is_async:
            # One event loop for every fetch, one thread to record them.
            self._workers = [
                threading.Thread(target=aio.serve, args=(s, fetch), name="batch-loop", daemon=True),
                threading.Thread(target=aio.write, args=(s,), name="batch-writer", daemon=True),
            ]
        else:
            runs = s.config.max_live != 0  # a client's runs nothing
            self._workers = [self._worker(fetch, i) for i in range(s.config.workers * runs)]
        # Under a time limit, a threaded runner's watch (batch.timeouts).
        self._watch = (
            threading.Thread(
                target=timeouts.watch,
                args=(s, functools.partial(self._replace, fetch)),
                name="batch-watch",
                daemon=True,
            )
            if s.config.timeout is not None and not self.is_async
            else None
        )
        self._keeper = threading.Thread(
            target=keeper.keep, args=(s, s.config.resume), name="batch-keeper", daemon=True
        )
        for t in (*self._workers, *self._others()):
            t.start()
        with _OPEN_LOCK:
            _OPEN.add(s)
        self._unsubscribe = s.ledger.subscribe(functools.partial(keeper.on_notice, s))

    def workers(self) -> int:
        """Worker threads running, those abandoned in a fetch past its time
        limit not counted; for an async fetch, the fetches the event loop
        may run at once while it runs. Called with the lock held."""
        if self.is_async:
            loop = self._workers[0]
            return self._s.config.workers if loop.is_alive() and loop not in self._s.hung else 0
        return sum(t.is_alive() and t not in self._s.hung for t in self._workers)

    def _worker(self, fetch: Callable[[Context, Any, Target], object], i: int) -> threading.Thread:
        return threading.Thread(
            target=worker.work, args=(self._s, fetch), name=f"batch-worker-{i}", daemon=True
        )

    def _replace(self, fetch: Callable[[Context, Any, Target], object]) -> None:
        """A worker was abandoned in a fetch past its time limit: start a
        fresh one in its place (lock held)."""
        fresh = self._worker(fetch, len(self._workers))
        self._workers = [t for t in self._workers if t.is_alive()] + [fresh]
        fresh.start()

    def _others(self) -> list[threading.Thread]:
        """The threads beside the workers: the watch (if any), the keeper."""
        return [t for t in (self._watch, self._keeper) if t is not None]

    def stop(self, deadline: float, timeout: float | None, drain: float | None = None) -> None:
        """Close the runner: start no further target, cancel the fetch
        context, let the workers store what the fetches in flight return and
        join them, then stop the keeper, which releases the leases. Returns
        or raises ``TimeoutError`` by ``deadline`` (on the system clock;
        ``timeout`` seconds from the call); calling again waits again.

        A ``drain`` (a time on the system clock) makes it a drain: the
        fetch context is cancelled only once the fetches in flight have had
        until then to return; and should one still be in flight by
        ``deadline``, the runner's jobs are released to other runners
        (:meth:`_let_go`) before ``TimeoutError`` is raised."""
        s = self._s
        if drain is None:
            s.ctx.cancel()
        self._close(deadline, timeout, cancel=drain is None)
        if drain is not None:
            self._release_idle(deadline, timeout)
        me = threading.current_thread()
        # The watch ends once no fetch is in flight, the last outcomes of
        # those it abandoned recorded.
        waited = [t for t in (*self._workers, self._watch) if t is not None and t is not me]
        try:
            with _OPEN_LOCK:
                _OPEN.discard(s)
            self._unsubscribe()
            s.ends.stop(None if deadline == math.inf else _left(deadline))
            if drain is not None:
                for t in waited:
                    _join(t, min(deadline, drain), s.hung)
                self._cancel(deadline, timeout)
            for t in waited:
                _join(t, deadline, s.hung)
        except BaseException:
            # Interrupted while the fetches in flight finish (a second
            # Ctrl-C): let the jobs go now, as a closed runner does, so that
            # none stays leased to a runner that will never go on with it.
            self._let_go()
            raise
        busy = sum(t.is_alive() and t not in s.hung for t in self._workers if t is not me)
        if busy and drain is not None:
            self._let_go()
            raise TimeoutError(
                f"{busy} workers still in a fetch after {timeout}s: their jobs are released"
            )
        if busy:
            raise TimeoutError(f"{busy} workers still in a fetch after {timeout}s")
        self._retire(deadline, timeout)

    def _close(self, deadline: float, timeout: float | None, *, cancel: bool) -> None:
        """Start no further target (``cancel``: and cancel the context of
        every job), and wake whoever waits to learn it."""
        s = self._s
        if not s.lock.acquire(timeout=_left(deadline)):
            # Closing begins all the same: a worker reads ``closed`` under
            # the lock before it starts a target, so none starts once the
            # holder lets go. Waking the idle ones is left to the next call.
            s.closed = True
            raise TimeoutError(f"a hook held the runner for longer than {timeout}s")
        try:
            s.shut(cancel=cancel)
            s.draining = not cancel
        finally:
            s.lock.release()

    def _cancel(self, deadline: float, timeout: float | None) -> None:
        """A drain's grace is over: cancel the context of every fetch, and
        store no outcome the store refuses once (as a close does)."""
        s = self._s
        s.ctx.cancel()
        if not s.lock.acquire(timeout=_left(deadline)):
            raise TimeoutError(f"a hook held the runner for longer than {timeout}s")
        try:
            s.draining = False
            s.done.notify_all()  # a group commit's backoff gives up now
            for job in s.rotation:
                job.ctx.cancel(Reason.CLOSED)
        finally:
            s.lock.release()

    def _release_idle(self, deadline: float, timeout: float | None) -> None:
        """A drain began: the jobs with no fetch in flight go to the other
        runners at once (this one starts nothing more). Best effort: if the
        store fails, they go when the runner retires."""
        s = self._s
        if not s.lock.acquire(timeout=_left(deadline)):
            raise TimeoutError(f"a hook held the runner for longer than {timeout}s")
        try:
            idle = [job for job in s.rotation if not job.running]
            for job in idle:
                s.halt(job, lost=True)
        finally:
            s.lock.release()
        try:
            s.ledger.release_jobs(s.id, [job.id for job in idle])
        except Exception:  # noqa: BLE001 - whatever the store raises: released at retire
            log.warning("cannot release the %d idle job(s) of runner %s yet", len(idle), s.id)

    def _retire(self, deadline: float, timeout: float | None) -> None:
        """The workers are joined: stop the keeper, which releases the leases."""
        s = self._s
        if not s.lock.acquire(timeout=_left(deadline)):
            raise TimeoutError(f"a hook held the runner for longer than {timeout}s")
        try:
            s.stopping = True
            s.chores.notify_all()
        finally:
            s.lock.release()
        self._keeper.join(None if deadline == math.inf else _left(deadline))
        if self._keeper.is_alive():
            raise TimeoutError(f"the store did not let runner {s.id} go within {timeout}s")

    def _let_go(self) -> None:
        """Release every lease of this runner now, without waiting for its
        fetches in flight: what they return is refused by the store (the
        leases are gone) and fetched again by the runner that takes the
        jobs. The keeper is told to stop (it retires too, if it gets the
        chance). Best effort: the store may be away too."""
        s = self._s
        if s.lock.acquire(timeout=LET_GO):
            try:
                s.stopping = True
                s.chores.notify_all()
            finally:
                s.lock.release()
        try:
            s.ledger.retire_runner(s.id)
        except Exception:  # noqa: BLE001 - whatever the store raises: the leases lapse instead
            log.warning("cannot release the leases of runner %s; they lapse instead", s.id)
        else:
            log.warning(
                "runner %s interrupted while its fetches finished: its jobs are released", s.id
            )


def _is_async(fetch: object) -> bool:
    """Whether ``fetch`` is an ``async def`` function (or an object whose
    ``__call__`` is one, or a partial of one)."""
    return inspect.iscoroutinefunction(fetch) or inspect.iscoroutinefunction(
        getattr(fetch, "__call__", None)  # noqa: B004 - an object's async __call__
    )


def _join(thread: threading.Thread, deadline: float, hung: set[threading.Thread]) -> None:
    """Join ``thread`` by ``deadline`` (real time) in short waits: a signal
    that another thread received (a Ctrl-C) is then handled at once by the
    main thread joining, not when the thread ends. A worker abandoned in a
    fetch (in ``hung``, read between waits) is not waited for."""
    while thread.is_alive() and thread not in hung:
        left = JOIN_SLICE if deadline == math.inf else min(JOIN_SLICE, _left(deadline))
        thread.join(left)
        if deadline != math.inf and SYSTEM.monotonic() >= deadline:
            return


def _left(deadline: float) -> float:
    """Seconds from now to ``deadline`` (real time), at least 0, at most what
    a lock or a join takes (-1: no deadline, wait for good)."""
    if deadline == math.inf:
        return -1
    return min(max(0.0, deadline - SYSTEM.monotonic()), threading.TIMEOUT_MAX)
