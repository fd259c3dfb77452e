"""What a fetch sees of the runner: whether it should give up."""

from __future__ import annotations

import threading

__all__ = ["Context"]


class Context:
    """Cancellation as a fetch sees it. ``Runner.close()`` cancels it; it is
    never un-cancelled. A long fetch should check it, or wait on it instead of
    sleeping, and return (or raise) soon after it is cancelled."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancelled(self) -> bool:
        """True once the runner is closing."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or ``timeout`` seconds pass; True if cancelled."""
        return self._event.wait(timeout)

    def cancel(self) -> None:
        """Cancel: every ``wait`` returns True at once, now and later."""
        self._event.set()
