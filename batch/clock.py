"""The runner's sense of time, injectable so tests step it instead of waiting."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["SYSTEM", "Clock", "SystemClock"]


class Clock(Protocol):
    """What the runner reads time from, and how it waits on a condition.

    ``monotonic()`` times retries, leases and job seconds; ``wait(cond,
    timeout)`` is called with ``cond``'s lock held and returns once notified
    or once ``timeout`` seconds of this clock passed (None: only when
    notified). A test clock may return early, for instance whenever it is
    stepped: every wait is a loop on its predicate.
    """

    def monotonic(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float | None) -> None: ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``Condition.wait``."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        cond.wait(None if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX))


SYSTEM = SystemClock()
