"""Waiting for jobs to end: ``Runner.wait``, ``as_completed`` and
``wait_async``, for jobs this runner holds or any other runner on the store
does.

A job this runner holds is waited for without polling: a thread on the
``done`` condition, a coroutine on a future its job's end resolves
(``State.watchers``). A job another runner holds is looked up in the store
every :data:`WAIT_POLL` seconds (its end is seen that much later at most;
a notice from another process cannot reach a waiter sooner on SQLite).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection
from typing import TypeVar

from .errors import JobNotFound, RunnerClosed, store_failed
from .locks import unlocked
from .state import State
from .states import LIVE_JOB

__all__ = ["WAIT_POLL", "ended", "ended_async", "loop_deadline"]

C = TypeVar("C")

#: Seconds between looks at the store for a job another runner holds.
WAIT_POLL = 0.1


def ended(s: State[C], owner: str, ids: Collection[str], deadline: float, what: str) -> list[str]:
    """Block until some of ``owner``'s jobs ``ids`` are terminal; return
    those that are, in the order they ended. Raises ``JobNotFound`` for one
    that is not ``owner``'s (or not stored), ``RunnerClosed`` if this runner
    closed with one of them unfinished in its hands, and ``TimeoutError``
    (saying ``what`` did not end) once the monotonic ``deadline`` passes."""
    with s.lock:
        while True:
            elsewhere = _not_held(s, owner, ids)
            poll = None
            if elsewhere:
                with unlocked(s.lock), store_failed():
                    rows = {r.id: r for r in s.store.list_jobs(ids=elsewhere, owner=owner)}
                for job_id in elsewhere:
                    if job_id not in rows:
                        raise JobNotFound(f"no job {job_id!r}")
                over = [r for r in rows.values() if r.status not in LIVE_JOB]
                if over:
                    return [r.id for r in sorted(over, key=lambda r: r.updated_at)]
                if any(s.rotation.get(job_id) is not None for job_id in elsewhere):
                    continue  # taken by this runner meanwhile
                poll = WAIT_POLL
            remaining = deadline - s.clock.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what} did not end within the timeout")
            for job_id in ids:
                s.waited[job_id] = s.waited.get(job_id, 0) + 1
            try:
                s.wait(s.done, remaining if poll is None else min(poll, remaining))
            finally:
                for job_id in ids:
                    if s.waited[job_id] == 1:
                        del s.waited[job_id]
                    else:
                        s.waited[job_id] -= 1


async def ended_async(s: State[C], owner: str, job_id: str, deadline: float) -> None:
    """Return once ``owner``'s job is terminal, as :func:`ended` for one job,
    without blocking the event loop: the runner's lock is only ever taken
    for a few steps, the store is read on a thread of the loop's, and the
    wait is a future (for a job this runner holds) or a sleep between looks
    (for one another holds). ``deadline`` is on the event loop's clock."""
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[None] = loop.create_future()

        def wake(future: asyncio.Future[None] = future) -> None:
            loop.call_soon_threadsafe(_resolve, future)

        with s.lock:
            held = not _not_held(s, owner, (job_id,))
            if held:
                s.watchers.setdefault(job_id, []).append(wake)
        remaining = deadline - loop.time()
        if held:
            try:
                await asyncio.wait_for(future, max(remaining, 0.0))
            except TimeoutError:
                raise TimeoutError(f"job {job_id!r} did not end within the timeout") from None
            finally:
                with s.lock:
                    waiting = s.watchers.get(job_id, [])
                    if wake in waiting:
                        waiting.remove(wake)
                        if not waiting:
                            del s.watchers[job_id]
            continue
        with store_failed():
            status = await asyncio.to_thread(s.store.job_status, job_id, owner)
        if status is None:
            raise JobNotFound(f"no job {job_id!r}")
        if status not in LIVE_JOB:
            return
        with s.lock:
            taken = s.rotation.get(job_id) is not None
        if not taken:
            if remaining <= 0:
                raise TimeoutError(f"job {job_id!r} did not end within the timeout")
            await asyncio.sleep(min(WAIT_POLL, remaining))


def _not_held(s: State[C], owner: str, ids: Collection[str]) -> list[str]:
    """Those of ``ids`` this runner does not hold live for ``owner``: to be
    looked up in the store (a job cancelled through it is cancelled there
    already). Called with the lock held; ``RunnerClosed`` if the runner
    closed with one of them unfinished in its hands."""
    elsewhere = []
    for job_id in ids:
        job = s.rotation.get(job_id)
        if job is None or job.owner != owner or job.cancelled:
            elsewhere.append(job_id)
        elif s.closed and not job.running:
            raise RunnerClosed(f"the runner closed before job {job_id!r} ended")
    return elsewhere


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def loop_deadline(timeout: float | None) -> float:
    """The deadline ``timeout`` seconds from now on the running loop's clock."""
    if timeout is None:
        return math.inf
    return asyncio.get_running_loop().time() + timeout
