"""What a fetch sees of the runner: whether it should give up, and why."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from .states import Reason

__all__ = ["Context"]

#: Guards every context's ``_reason``, ``_event`` and ``_waiters``: taken
#: only to cancel one or to start waiting on one, never while waiting, so
#: one lock serves them all (a job's context costs no lock of its own).
_LOCK = threading.Lock()


class Context:
    """Cancellation as a fetch sees it: each job's fetches get the context of
    their job, cancelled once the job is cancelled, the runner closes, or
    the fetch runs past ``Config.timeout`` (``reason`` says which, the
    first to come; after a time limit the job's next fetch gets a fresh
    context). It is never un-cancelled. A
    long fetch should check it, or wait on it instead of sleeping, and
    return (or raise) soon after it is cancelled; what it returns then is
    stored as usual.

    ``parent``: a context whose cancelling this one follows, as a job's does
    its runner's.
    """

    __slots__ = ("_event", "_parent", "_reason", "_waiters")

    def __init__(self, parent: Context | None = None) -> None:
        self._parent = parent
        self._reason: Reason | None = None
        self._event: threading.Event | None = None  # made by the first wait
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None

    @property
    def reason(self) -> Reason | None:
        """None while not cancelled; then ``"closed"``, ``"cancelled"`` or
        ``"timed out"``."""
        if self._reason is not None or self._parent is None:
            return self._reason
        return self._parent.reason

    def cancelled(self) -> bool:
        """True once the runner is closing, the fetch's job was cancelled,
        or the fetch ran past its time limit."""
        return self.reason is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds pass; True if cancelled."""
        with _LOCK:
            if self.cancelled():
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout) or self.cancelled()

    async def wait_async(self, timeout: float | None = None) -> bool:
        """As :meth:`wait`, for a fetch that is an ``async def``: the event
        loop runs on meanwhile."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with _LOCK:
            if self.cancelled():
                return True
            if self._waiters is None:
                self._waiters = []
            self._waiters.append((loop, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            with _LOCK:
                if self._waiters is not None and (loop, future) in self._waiters:
                    self._waiters.remove((loop, future))
        return self.cancelled()

    def cancel(self, reason: Reason = Reason.CLOSED) -> None:
        """Cancel: every ``wait`` returns True at once, now and later. The
        first reason given stands."""
        with _LOCK:
            if self._reason is None:
                self._reason = reason
            event, waiters, self._waiters = self._event, self._waiters or [], None
        if event is not None:
            event.set()
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
