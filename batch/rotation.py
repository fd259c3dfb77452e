"""The rotation: live jobs in submit order, and the cursor that makes it fair."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Generic, TypeVar

import store

from .context import Context
from .model import Target

__all__ = ["LiveJob", "Rotation"]

C = TypeVar("C")


class LiveJob(Generic[C]):
    """A job the runner still works on. Guarded by the runner's lock.

    ``next`` is the index of the next target to fetch; at most one target is in
    flight (``running``). ``retry_at`` (monotonic seconds, 0 when not waiting)
    holds back a target that came back busy; ``busy_since`` is when it first
    did (None when the current target has not been busy). ``lease`` is the
    runner's hold on it in the store; ``cancelled`` (through any runner) and
    ``lost`` (its lease is another runner's now) both mean: start nothing
    more of it. ``ctx`` is what its fetches see: cancelled with the job, or
    with the runner.
    """

    __slots__ = (
        "busy_since",
        "caller",
        "cancelled",
        "created",
        "ctx",
        "done",
        "failed",
        "id",
        "lease",
        "lost",
        "next",
        "order",
        "owner",
        "queued",
        "retry_at",
        "running",
        "started",
        "targets",
    )

    def __init__(  # noqa: PLR0917 - one job's seven facts, always given together
        self,
        job_id: str,
        owner: str,
        caller: C,
        targets: list[Target],
        created: float,
        lease: store.Lease,
        ctx: Context,
    ) -> None:
        self.id = job_id
        self.owner = owner
        self.caller = caller
        self.targets = targets
        self.created = created
        self.lease = lease
        self.ctx = ctx
        self.next = 0
        self.running = False
        self.started = False
        self.cancelled = False
        self.lost = False
        self.retry_at = 0.0
        self.busy_since: float | None = None
        self.done = 0
        self.failed = 0
        self.order = -1  # its place in submit order, set by Rotation.add
        self.queued = False  # waiting in the rotation for its turn

    @property
    def halted(self) -> bool:
        """No further target of this job may start here."""
        return self.cancelled or self.lost

    @property
    def finished(self) -> bool:
        """Every target is stored."""
        return self.next >= len(self.targets)


class Rotation(Generic[C]):
    """Live jobs in submit order, and the cursor that makes them take turns.

    The order a user sees is that of a scan over the jobs in submit order,
    starting after the last job picked and wrapping once: the first job that
    can start a target is next. The rotation gives that order without a
    scan, in O(log n) per pick whatever the number of live jobs: each job
    has an ``order`` (its place in submit order), and the jobs ready to
    start wait in two heaps by order: ``_ahead``, after the cursor (taken
    first, lowest first), and ``_behind``, at or before it (their turn comes
    once ``_ahead`` is empty and the scan wraps). A job held back by a retry
    waits in ``_retry``, by ``retry_at``, until it is due.

    Not thread-safe: the runner's lock guards it. Invariants: ``by_id`` holds
    the live jobs; every entry in ``_ahead`` has an order above ``_cursor``
    and every entry in ``_behind`` one at or below it; a job has at most one
    entry in the three heaps (``LiveJob.queued``). Heaps hold job ids, not
    jobs, so a job that left holds nothing (its caller above all) through
    an entry not yet popped; such entries, and those of cancelled jobs, are
    dropped when they come up.
    """

    __slots__ = ("_ahead", "_behind", "_by_id", "_cursor", "_orders", "_retry")

    def __init__(self) -> None:
        self._by_id: dict[str, LiveJob[C]] = {}
        self._orders = itertools.count()
        self._cursor = -1  # the order of the last job picked
        self._ahead: list[tuple[int, str]] = []
        self._behind: list[tuple[int, str]] = []
        self._retry: list[tuple[float, int, str]] = []

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, job_id: str) -> LiveJob[C] | None:
        """The live job with this id, if any."""
        return self._by_id.get(job_id)

    def add(self, job: LiveJob[C]) -> None:
        """Append a new job: it is last in the rotation, and offered."""
        job.order = next(self._orders)
        self._by_id[job.id] = job
        self.offer(job)

    def remove(self, job: LiveJob[C]) -> None:
        """Take a job out; the cursor stays where it is. The last one out
        drops the entries left behind by cancelled jobs, and the room the
        rotation grew to."""
        if self._by_id.get(job.id) is not job:
            return  # taken back since, under a new lease: that one stays
        del self._by_id[job.id]
        if not self._by_id:
            # New containers, not cleared ones: a dict or list keeps the room
            # it grew to, and a runner that once held many jobs would keep it.
            self._by_id = {}
            self._ahead, self._behind, self._retry = [], [], []

    def __iter__(self) -> Iterator[LiveJob[C]]:
        return iter(list(self._by_id.values()))

    def settle(self, job: LiveJob[C]) -> bool:
        """Put a job with no target in flight where it belongs: out of the
        rotation if it is halted or finished (returns True), else offered.
        Every transition of a live job that is not running ends here."""
        if job.halted or job.finished:
            self.remove(job)
            return True
        self.offer(job)
        return False

    def offer(self, job: LiveJob[C]) -> None:
        """Queue a job that may start its next target, now or at its
        ``retry_at``. Called after every change that may make it ready; a job
        already queued, running, halted or out of targets is left as is."""
        if job.queued or job.running or job.halted or job.finished:
            return
        job.queued = True
        if job.retry_at:
            heapq.heappush(self._retry, (job.retry_at, job.order, job.id))
        else:
            self._place(job.order, job.id)

    def _place(self, order: int, job_id: str) -> None:
        heapq.heappush(self._ahead if order > self._cursor else self._behind, (order, job_id))

    def pick(self, now: float) -> LiveJob[C] | None:
        """The first ready job after the cursor, wrapping once; the cursor
        moves to it. None if no job can start a target at ``now``."""
        while self._retry and self._retry[0][0] <= now:
            _, order, job_id = heapq.heappop(self._retry)
            if (job := self._live(job_id)) is not None:
                job.retry_at = 0.0
                self._place(order, job_id)
        while True:
            if not self._ahead:
                if not self._behind:
                    return None
                self._ahead, self._behind = self._behind, self._ahead  # wrap
            order, job_id = heapq.heappop(self._ahead)
            if (job := self._live(job_id)) is not None:
                job.queued = False
                self._cursor = order
                return job

    def _live(self, job_id: str) -> LiveJob[C] | None:
        """The job of an entry just popped, or None if it left or was
        halted (the entry is dropped)."""
        job = self._by_id.get(job_id)
        if job is not None and job.halted:
            job.queued = False
            return None
        return job

    def ready(self, now: float) -> bool:
        """Whether some job may start a target at ``now`` (an entry of a job
        that left may answer True once: a wake for nothing, never a miss)."""
        return bool(self._ahead or self._behind or (self._retry and self._retry[0][0] <= now))

    def next_retry_in(self, now: float) -> float | None:
        """Seconds until the earliest held-back target may be tried, or None if
        no job waits on a retry."""
        while self._retry and self._by_id.get(self._retry[0][2]) is None:
            heapq.heappop(self._retry)
        return self._retry[0][0] - now if self._retry else None

    def waiting_retry(self, now: float) -> int:
        """How many jobs wait on a retry."""
        return sum(
            1
            for at, _, job_id in self._retry
            if at > now and (job := self._by_id.get(job_id)) is not None and not job.halted
        )
