"""Store calls a runner thread makes again and again while they fail: logged
as one line now and then, not a traceback per try.

A runner's threads never die of what the store raises: the keeper's beat,
its cancel poll, its ``running`` writes and the group commit each catch any
``Exception`` from the store (a ``StoreError``, a driver's own exception
that escaped it, a bug), back off and go on. A store that is away for a
minute is tried hundreds of times meanwhile; :class:`Trouble` keeps the log
readable through it.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["REMIND", "Trouble"]

log = logging.getLogger("batch")

#: Seconds between the warnings that say a store call still fails (the
#: failures in between are logged at debug level).
REMIND = 60.0


class Trouble:
    """The failures of one kind of store call of one runner.

    A failure is logged as a one-line warning (what failed, what comes
    next, and the error's class and first line), unless one of the same
    kind was within the last :data:`REMIND` seconds: then at debug level,
    and counted in the next warning. Its traceback goes to debug level
    either way: a fault the runner retries and recovers from is not a
    crash, and should not read as one. So a store away for a minute, tried
    hundreds of times, or one whose connections drop every second, leaves a
    line a minute. Once calls succeed again after a failure that was warned
    of, that is said too, with how many tries failed in a row.

    Each kind is used by one thread at a time (the keeper, or the one
    worker recording), with the runner's lock held (``State.trouble``
    keeps them), so it needs no lock of its own. Call :meth:`failed` inside
    the ``except`` block that caught the failure: its traceback is the one
    logged.
    """

    __slots__ = ("_failures", "_loud", "_quiet", "_warned", "what")

    def __init__(self, what: str) -> None:
        self.what = what  # what the calls are, for the message that they work again
        self._failures = 0  # in a row, up to now
        self._quiet = 0  # logged at debug level since the last warning
        self._warned = -REMIND  # time.monotonic() of the last warning
        self._loud = False  # the failures in a row were warned of

    def failed(self, msg: str, *args: object) -> None:
        """Log one failure: ``msg % args`` says what failed and what comes next."""
        self._failures += 1
        now = time.monotonic()
        log.debug(msg, *args, exc_info=True, stacklevel=2)
        if now - self._warned < REMIND:
            self._quiet += 1
            return
        if self._quiet:
            msg += f" ({self._quiet} more failure(s) logged at debug level since the last warning)"
        self._warned, self._quiet, self._loud = now, 0, True
        log.warning(msg + ": %s", *args, _brief(sys.exc_info()[1]), stacklevel=2)

    @property
    def failing(self) -> bool:
        """The last call failed."""
        return self._failures > 0

    def ok(self) -> None:
        """The call succeeded: failures in a row, if any, are over."""
        if self._loud:
            log.warning(
                "%s: the store answers again, after %d failed tries",
                self.what,
                self._failures,
                stacklevel=2,
            )
        self._failures, self._loud = 0, False


def _brief(exc: BaseException | None) -> str:
    """The error's class and the first line of its text."""
    if exc is None:
        return "no error"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
