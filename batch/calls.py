"""The store calls a runner makes with its lock let go mid-transition.

A beat, a look, a submit storing its jobs and a beat's reading of the jobs
it holds and does not run each let the lock go while the store works, and
take it again to apply what the store answered. Meanwhile the runner goes
on, and two things must hold:

- What the call brings is counted before it arrives: the places in the
  rotation it holds for the jobs it brings (``Config.max_live`` counts
  them, so no one else takes that room), and the jobs a submit stores
  leased to this runner (a beat meanwhile finds them held, and must not
  take them up as jobs this runner holds and does not run).
- What the runner did meanwhile wins over what the call read, which may
  predate it: a job cancelled (a beat may have taken it before the
  cancel: it must not start), a pause this runner changed, the soonest
  time a job submitted meanwhile is due.

Each call under way is one :class:`StoreCall`, open from the moment the
transition begins until it is applied; :class:`Calls` holds the open ones
and notes each change in all of them. Both are used with the runner's lock
held (``State.lock``), which guards them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["Calls", "StoreCall"]


class StoreCall:
    """One store call under way with the lock let go: what it brings, and
    what happened meanwhile."""

    __slots__ = ("cancelled", "due", "jobs", "paused", "places")

    def __init__(self, places: int, jobs: Iterable[str]) -> None:
        self.places = places  # held in the rotation for the jobs it brings
        self.jobs = frozenset(jobs)  # stored by it, leased to this runner
        self.cancelled: set[str] = set()  # jobs cancelled through this process since
        self.paused = False  # this runner paused or unpaused since
        self.due = math.inf  # the soonest a job submitted since is due (monotonic)


class Calls:
    """The store calls under way; invariant: each is open from its
    transition's start to its end, whatever the call raised."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: list[StoreCall] = []

    def open(self, places: int = 0, jobs: Iterable[str] = ()) -> StoreCall:
        """A call begins, holding ``places`` for the ``jobs`` it brings."""
        call = StoreCall(places, jobs)
        self._open.append(call)
        return call

    def close(self, call: StoreCall) -> None:
        """The call's answer is applied (or it failed): it holds nothing more."""
        self._open.remove(call)

    @contextmanager
    def under_way(self, places: int = 0) -> Iterator[StoreCall]:
        """A call open for the ``with`` block, closed however it ends."""
        call = self.open(places)
        try:
            yield call
        finally:
            self.close(call)

    def places(self) -> int:
        """The places in the rotation the calls under way hold."""
        return sum(call.places for call in self._open)

    def storing(self, job_id: str) -> bool:
        """Whether a submit under way stores ``job_id``."""
        return any(job_id in call.jobs for call in self._open)

    def cancelled(self, job_id: str) -> None:
        """``job_id`` was cancelled through this process."""
        for call in self._open:
            call.cancelled.add(job_id)

    def paused(self) -> None:
        """This runner changed what is paused."""
        for call in self._open:
            call.paused = True

    def due(self, at: float) -> None:
        """A job submitted is due at ``at`` (monotonic)."""
        for call in self._open:
            call.due = min(call.due, at)
