"""The rotation: live jobs in submit order, and the cursor that makes it fair."""

from __future__ import annotations

import math
from typing import Generic, TypeVar

from .model import Target

__all__ = ["LiveJob", "Rotation"]

C = TypeVar("C")


class LiveJob(Generic[C]):
    """A job the runner still works on. Guarded by the runner's lock.

    ``next`` is the index of the next target to fetch; at most one target is in
    flight (``running``). ``retry_at`` (monotonic seconds, 0 when not waiting)
    holds back a target that came back busy; ``busy_since`` is when it first
    did (None when the current target has not been busy).
    """

    __slots__ = (
        "busy_since",
        "caller",
        "cancelled",
        "created",
        "done",
        "failed",
        "id",
        "next",
        "owner",
        "retry_at",
        "running",
        "started",
        "targets",
    )

    def __init__(
        self, job_id: str, owner: str, caller: C, targets: list[Target], created: float
    ) -> None:
        self.id = job_id
        self.owner = owner
        self.caller = caller
        self.targets = targets
        self.created = created
        self.next = 0
        self.running = False
        self.started = False
        self.cancelled = False
        self.retry_at = 0.0
        self.busy_since: float | None = None
        self.done = 0
        self.failed = 0

    def ready(self, now: float) -> bool:
        """Whether a worker may start this job's next target at ``now``."""
        return (
            not self.running
            and not self.cancelled
            and self.next < len(self.targets)
            and self.retry_at <= now
        )

    def waiting_retry(self, now: float) -> bool:
        """Whether the next target only waits for ``retry_at``."""
        return not self.running and not self.cancelled and self.retry_at > now


class Rotation(Generic[C]):
    """Live jobs in submit order, and ``cursor``: where the next scan starts.

    Not thread-safe: the runner's lock guards it. Invariants: ``0 <= cursor
    <= len(jobs)``; ``by_id`` indexes exactly the jobs in ``jobs``.
    """

    __slots__ = ("_by_id", "_cursor", "_jobs")

    def __init__(self) -> None:
        self._jobs: list[LiveJob[C]] = []
        self._by_id: dict[str, LiveJob[C]] = {}
        self._cursor = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: str) -> LiveJob[C] | None:
        """The live job with this id, if any."""
        return self._by_id.get(job_id)

    def add(self, job: LiveJob[C]) -> None:
        """Append a new job: it is last in the rotation."""
        self._jobs.append(job)
        self._by_id[job.id] = job

    def remove(self, job: LiveJob[C]) -> None:
        """Take a job out, keeping the cursor on the job that was to come next."""
        i = self._jobs.index(job)
        del self._jobs[i]
        del self._by_id[job.id]
        if i < self._cursor:
            self._cursor -= 1

    def pick(self, now: float) -> LiveJob[C] | None:
        """The first ready job from the cursor on, wrapping once; the cursor
        moves to the index after it.

        The cursor is not wrapped when it passes the end: a job appended while
        the last one was picked is then the next scan's first, so a newcomer
        takes its turn before the rotation starts over.
        """
        n = len(self._jobs)
        for k in range(n):
            i = (self._cursor + k) % n
            job = self._jobs[i]
            if job.ready(now):
                self._cursor = i + 1
                return job
        return None

    def next_retry_in(self, now: float) -> float | None:
        """Seconds until the earliest held-back target may be tried, or None if
        no job waits on a retry."""
        at = min((j.retry_at for j in self._jobs if j.waiting_retry(now)), default=math.inf)
        return None if at == math.inf else at - now

    def waiting_retry(self, now: float) -> int:
        """How many jobs wait on a retry."""
        return sum(1 for j in self._jobs if j.waiting_retry(now))
