"""Waiting for jobs to end: ``Runner.wait``, ``as_completed`` and
``wait_async``, for jobs this runner holds or any other runner on the store
does.

Neither polls: a thread waits on the ``done`` condition, a coroutine on a
future (``State.watchers``), each told when a job this runner holds leaves
its rotation, and when the store's events say a job another runner holds
ended (``batch.ends``). Such a job is looked up in the store once the
watching began, so no end slips between the look and the wait; and again
every :data:`WAIT_POLL` seconds, should the watching fail.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection
from typing import TypeVar

import store

from .errors import JobNotFound, RunnerClosed, store_failed
from .locks import unlocked
from .state import State
from .states import LIVE_JOB

__all__ = ["WAIT_POLL", "ended", "ended_async", "loop_deadline"]

C = TypeVar("C")

#: Seconds between looks at the store for a job another runner holds, in
#: case the store's events fail to tell its end.
WAIT_POLL = 1.0


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
                told = s.ends.told
                with unlocked(s.lock), store_failed():
                    rows = _watched(s, elsewhere, owner)
                for job_id in elsewhere:
                    if job_id not in rows:
                        raise JobNotFound(f"no job {job_id!r}")
                over = [r for r in rows.values() if r.status not in LIVE_JOB]
                if over:
                    return [r.id for r in sorted(over, key=lambda r: r.updated_at)]
                if s.ends.told != told or any(
                    s.rotation.get(job_id) is not None for job_id in elsewhere
                ):
                    continue  # ended, or taken by this runner, meanwhile
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
    wait is a future, resolved when the job leaves this runner's rotation
    or the store tells its end. ``deadline`` is on the event loop's clock."""
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[None] = loop.create_future()

        def wake(future: asyncio.Future[None] = future) -> None:
            loop.call_soon_threadsafe(_resolve, future)

        with s.lock:
            held = not _not_held(s, owner, (job_id,))
            s.watchers.setdefault(job_id, []).append(wake)
        try:
            if not held:
                with store_failed():
                    status = await asyncio.to_thread(_look, s, job_id, owner)
                if status is None:
                    raise JobNotFound(f"no job {job_id!r}")
                if status not in LIVE_JOB:
                    return
                with s.lock:
                    held = s.rotation.get(job_id) is not None
                if held:
                    continue  # taken by this runner meanwhile
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"job {job_id!r} did not end within the timeout")
            try:
                await asyncio.wait_for(future, remaining if held else min(WAIT_POLL, remaining))
            except TimeoutError:
                if held or loop.time() >= deadline:
                    raise TimeoutError(f"job {job_id!r} did not end within the timeout") from None
        finally:
            with s.lock:
                waiting = s.watchers.get(job_id, [])
                if wake in waiting:
                    waiting.remove(wake)
                    if not waiting:
                        del s.watchers[job_id]


def _look(s: State[C], job_id: str, owner: str) -> store.JobStatus | None:
    """The status of a job another runner holds, once its end would be told."""
    row = _watched(s, [job_id], owner).get(job_id)
    return None if row is None else row.status


def _watched(s: State[C], ids: list[str], owner: str) -> dict[str, store.JobSummary]:
    """``owner``'s jobs of ``ids`` as the store has them, by id, read while
    the runner's events are watched should one of them be live: an end
    committed after the read is then told (``Ends``). Watching starts only
    then, and the store is read again once it has (an end between the two
    reads is in the second): waits that find only ended jobs start none."""
    watching = s.ends.watching
    rows = {r.id: r for r in s.store.list_jobs(ids=ids, owner=owner)}
    if not watching and any(r.status in LIVE_JOB for r in rows.values()):
        s.ends.start()
        rows = {r.id: r for r in s.store.list_jobs(ids=ids, owner=owner)}
    return rows


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
