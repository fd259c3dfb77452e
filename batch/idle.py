"""Idle workers: who sleeps, who is woken, and who keeps the retry timer.

Guarantees (all under the runner's lock, which guards an :class:`Idle`):

1. A wake reaches one chosen sleeper, never all of them: each sleeps on
   something of its own (a worker thread's condition, the event loop's
   event), and is told whether it was woken or timed out (``woken``).
2. At most one woken sleeper is on its way at a time (``waking``): it takes
   a job and wakes the next itself if another can start, so a batch that
   makes five jobs ready does not have every idle worker queue on the lock.
3. The last to go idle is woken first: its stack and caches are warm.
4. While retries wait, one sleeper keeps the timer: it sleeps until the
   earliest retry is due (``timer_at``); the others sleep untimed. A timer
   keeper that goes (woken for a job, or due) hands the timer on by waking
   another sleeper, which takes it when it sleeps again.
"""

from __future__ import annotations

import math
import threading

__all__ = ["Idle", "Sleeper", "ThreadSleeper"]


class Sleeper:
    """An idle worker's place. ``woken``: set by whoever woke it, cleared
    when it takes the lock back."""

    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = False

    def wake(self) -> None:
        """Wake this sleeper (the runner's lock held)."""
        raise NotImplementedError


class ThreadSleeper(Sleeper):
    """A worker thread's place: a condition of its own on the runner's lock."""

    __slots__ = ("cond",)

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__()
        self.cond = threading.Condition(lock)

    def wake(self) -> None:
        self.cond.notify()


class Idle:
    """The sleepers, and the timer. See the module's guarantees."""

    __slots__ = ("sleeping", "timer", "timer_at", "waking")

    def __init__(self) -> None:
        # The last to go idle last: dicts pop their last item first.
        self.sleeping: dict[Sleeper, None] = {}
        self.waking = 0
        self.timer: Sleeper | None = None
        self.timer_at = math.inf

    def wake_one(self) -> None:
        """Wake one sleeper, if any and none is on its way already."""
        if self.sleeping and not self.waking:
            self._wake()

    def wake_all(self) -> None:
        """Wake every sleeper: the runner closes."""
        for sleeper in self.sleeping:
            sleeper.woken = True
            sleeper.wake()
        self.waking += len(self.sleeping)
        self.sleeping.clear()

    def nap(self, sleeper: Sleeper, now: float, retry_in: float | None) -> float | None:
        """``sleeper`` goes idle at ``now``; the earliest retry is due in
        ``retry_in`` seconds (None: no retry waits). Returns how long it
        may sleep: until that retry if it keeps the timer, else for good."""
        timeout = None
        if retry_in is not None and (self.timer is None or now + retry_in < self.timer_at):
            self.timer, self.timer_at, timeout = sleeper, now + retry_in, retry_in
        self.sleeping[sleeper] = None
        return timeout

    def woke(self, sleeper: Sleeper, retries: bool) -> None:
        """``sleeper`` has the lock again, woken or timed out; ``retries``:
        whether retries still wait (then the timer is handed on)."""
        if sleeper.woken:
            sleeper.woken = False
            self.waking -= 1
        else:
            del self.sleeping[sleeper]
        if self.timer is sleeper:
            self.timer, self.timer_at = None, math.inf
            if self.sleeping and retries:
                self._wake()

    def _wake(self) -> None:
        sleeper, _ = self.sleeping.popitem()
        if sleeper is self.timer and self.sleeping:
            # The timer keeper sleeps on: another is woken.
            other, _ = self.sleeping.popitem()
            self.sleeping[sleeper] = None
            sleeper = other
        sleeper.woken = True
        self.waking += 1
        sleeper.wake()
