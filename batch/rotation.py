"""The rotation: live jobs in submit order, and the cursors that make it fair
(between jobs, or between callers and then their jobs)."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import store
from store.jobs.pauses import covering

from .context import Context
from .model import Target, UpstreamState
from .pacing import Answer, Pace, Paces
from .states import Reason

__all__ = ["LiveJob", "Rotation"]

C = TypeVar("C")
K = TypeVar("K")


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

    Its fields change only through its methods below, one per transition
    (the worker, the group commit and the keeper call them), and through
    the :class:`Rotation`, for its place in it (``order``, ``queued``, a
    ``retry_at`` once due, ``running`` once it settles).

    ``trace`` is the trace context of its submit (``batch.tracing``);
    ``attempts`` counts the tries of its next target here, and
    ``first_span`` is the span of the first (set by the worker running it,
    outside the lock, as only that worker reads it).
    """

    __slots__ = (
        "attempts",
        "busy_since",
        "caller",
        "cancelled",
        "created",
        "ctx",
        "done",
        "failed",
        "first_span",
        "id",
        "lease",
        "lost",
        "next",
        "order",
        "owner",
        "pace",
        "parked",
        "paused",
        "queued",
        "retry_at",
        "running",
        "started",
        "targets",
        "trace",
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
        trace: str | None = None,
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
        self.pace: Pace | None = None  # the upstream of its target in flight, if paced
        self.parked: Pace | None = None  # the upstream it waits on, if parked
        self.paused: tuple[str, str] | None = None  # the pause that holds it, if one does
        self.trace = trace
        self.attempts = 0
        self.first_span: Any = None

    @property
    def halted(self) -> bool:
        """No further target of this job may start here."""
        return self.cancelled or self.lost

    @property
    def finished(self) -> bool:
        """Every target is stored."""
        return self.next >= len(self.targets)

    # -- its transitions ----------------------------------------------------------

    def start(self) -> bool:
        """A worker took it: its next target is in flight. True the first
        time, when it is to be stored ``running``."""
        first = not self.started
        self.started = self.running = True
        self.attempts += 1
        return first

    def paced(self, pace: Pace) -> None:
        """Its next target, about to start, counts against ``pace``."""
        self.pace = pace

    def returned(self) -> Pace | None:
        """Its fetch came back: the pace it counted against, if any, which
        it no longer does."""
        pace, self.pace = self.pace, None
        return pace

    def busy(self, now: float) -> float:
        """Its target in flight came back busy at ``now``: when the first
        busy answer for this target came."""
        if self.busy_since is None:
            self.busy_since = now
        return self.busy_since

    def hold_until(self, when: float) -> None:
        """Its busy target is tried again at ``when`` (monotonic seconds)."""
        self.retry_at = when

    def advance(self, done: bool) -> None:
        """Its target in flight is stored, ``done`` or failed: on to the next."""
        self.next += 1
        self.done += done
        self.failed += not done
        self.busy_since = None
        self.retry_at = 0.0
        self.attempts = 0
        self.first_span = None

    def resume_at(self, pending: int, done: int, *, started: bool | None = None) -> None:
        """Go on as the store has it: its next target is ``pending``, of
        those before it ``done`` are done (the rest failed); ``started``:
        whether the store has it ``running`` (None: as it was)."""
        if pending != self.next:
            self.attempts = 0
            self.first_span = None
        self.next = pending
        self.done = done
        self.failed = pending - done
        self.busy_since = None
        self.retry_at = 0.0
        if started is not None:
            self.started = started

    def cancel(self) -> None:
        """It was cancelled, through any runner: nothing more of it starts,
        and its fetches see their context cancelled."""
        self.cancelled = True
        self.ctx.cancel(Reason.CANCELLED)

    def time_out(self) -> None:
        """Its fetch in flight ran past the time limit: its context is
        cancelled (``Reason.TIMED_OUT``) until :meth:`renew`."""
        self.ctx.cancel(Reason.TIMED_OUT)

    def renew(self, parent: Context) -> None:
        """Its fetch that ran past the time limit is over: the next gets a
        fresh context under ``parent``, unless the job was cancelled
        meanwhile (a cancelled job's context stays cancelled)."""
        if self.ctx.reason is Reason.TIMED_OUT and not self.cancelled:
            self.ctx = Context(parent)

    def lose(self) -> None:
        """It is not this runner's any more (another holds its lease, it is
        gone, or it ended elsewhere): nothing more of it starts here."""
        self.lost = True


class _Ring(Generic[K]):
    """Keys with a fixed order, and a cursor: the scan from just after the
    cursor, wrapping once, in O(log n) a key. Keys after the cursor wait in
    ``_ahead`` (taken first, lowest order first), those at or before it in
    ``_behind`` (their turn comes once ``_ahead`` is empty and the scan
    wraps). :meth:`pop` gives the next key without moving the cursor: its
    user sets ``cursor`` to the order of the key it accepts, so an entry it
    drops (of a job that left, say) moves nothing."""

    __slots__ = ("_ahead", "_behind", "cursor")

    def __init__(self) -> None:
        self._ahead: list[tuple[int, K]] = []
        self._behind: list[tuple[int, K]] = []
        self.cursor = -1

    def __bool__(self) -> bool:
        return bool(self._ahead or self._behind)

    def __iter__(self) -> Iterator[tuple[int, K]]:
        return itertools.chain(self._ahead, self._behind)

    def push(self, order: int, key: K) -> None:
        heapq.heappush(self._ahead if order > self.cursor else self._behind, (order, key))

    def pop(self) -> tuple[int, K] | None:
        if not self._ahead:
            if not self._behind:
                return None
            self._ahead, self._behind = self._behind, self._ahead  # wrap
        return heapq.heappop(self._ahead)


def _take(ring: _Ring[str], live: Callable[[str], LiveJob[C] | None]) -> LiveJob[C] | None:
    """The next live job of ``ring``; the cursor moves to it. Entries of
    jobs that are not live any more are dropped on the way."""
    while (entry := ring.pop()) is not None:
        order, job_id = entry
        if (job := live(job_id)) is not None:
            ring.cursor = order
            return job
    return None


class _ByJob(Generic[C]):
    """Ready jobs taking turns in submit order: rule 1, ``fair="job"``."""

    __slots__ = ("_jobs",)

    def __init__(self) -> None:
        self._jobs: _Ring[str] = _Ring()

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def push(self, job: LiveJob[C]) -> None:
        self._jobs.push(job.order, job.id)

    def pop(self, live: Callable[[str], LiveJob[C] | None]) -> LiveJob[C] | None:
        return _take(self._jobs, live)

    def forget(self, owner: str) -> None:
        """Nothing is kept by caller."""


class _ByCaller(Generic[C]):
    """Ready jobs, callers taking turns (``fair="caller"``): a ring of the
    callers with a ready job, in the order they came (a caller with no live
    job left is forgotten, and comes back last), and for each a ring of its
    ready jobs in submit order. The caller whose turn it is takes up to its
    weight of turns in a row, each from its next ready job; then the scan
    moves on to the next caller with a ready job.

    Invariants: ``_queued`` holds the callers with an entry in ``_callers``
    (at their current order in ``_order``), and every caller with a ready
    job is queued; a caller entry whose order is not its current one
    belongs to a caller forgotten since, and is dropped; ``_left`` is how
    many more turns ``_current`` may take in a row.
    """

    __slots__ = (
        "_callers",
        "_current",
        "_jobs",
        "_left",
        "_order",
        "_orders",
        "_queued",
        "_weights",
    )

    def __init__(self, weights: Mapping[str, int]) -> None:
        self._weights = weights
        self._callers: _Ring[str] = _Ring()
        self._jobs: dict[str, _Ring[str]] = {}
        self._order: dict[str, int] = {}
        self._orders = itertools.count()
        self._queued: set[str] = set()
        self._current: str | None = None
        self._left = 0

    def __bool__(self) -> bool:
        return bool(self._callers)

    def push(self, job: LiveJob[C]) -> None:
        owner = job.owner
        jobs = self._jobs.get(owner)
        if jobs is None:
            jobs = self._jobs[owner] = _Ring()
            self._order[owner] = next(self._orders)
        jobs.push(job.order, job.id)
        if owner not in self._queued:
            self._queued.add(owner)
            self._callers.push(self._order[owner], owner)

    def pop(self, live: Callable[[str], LiveJob[C] | None]) -> LiveJob[C] | None:
        if self._left > 0 and self._current is not None:
            job = _take(self._jobs[self._current], live)
            if job is not None:
                self._left -= 1
                return job
        while (entry := self._callers.pop()) is not None:
            order, owner = entry
            if self._order.get(owner) != order:
                continue  # a caller forgotten since
            jobs = self._jobs[owner]
            job = _take(jobs, live)
            if job is None:
                self._queued.discard(owner)
                continue
            self._callers.cursor = order
            self._current, self._left = owner, self._weights.get(owner, 1) - 1
            if jobs:
                self._callers.push(order, owner)  # its next turn comes next round
            else:
                self._queued.discard(owner)
            return job
        return None

    def forget(self, owner: str) -> None:
        """``owner`` has no live job left: should it come back, it comes last."""
        self._jobs.pop(owner, None)
        self._order.pop(owner, None)
        self._queued.discard(owner)
        if self._current == owner:
            self._current, self._left = None, 0


class Rotation(Generic[C]):
    """Live jobs in submit order, and the cursor that makes them take turns.

    With ``fair="job"`` (rule 1) the order a user sees is that of a scan
    over the jobs in submit order, starting after the last job picked and
    wrapping once: the first job that can start a target is next. With
    ``fair="caller"`` the callers take turns the same way (each up to its
    weight of turns in a row), and each caller's jobs take turns among
    themselves. Either way a pick costs O(log n) whatever the number of live
    jobs: each job has an ``order`` (its place in submit order), and the jobs
    ready to start wait in rings (:class:`_Ring`) by order; a job held back
    by a retry waits in ``_retry``, by ``retry_at``, until it is due.

    With ``paces`` (``Config.upstream``), a job whose turn comes while its
    next target's upstream may not start one (held, out of tokens, as many
    in flight as allowed, breaker open) is parked on that upstream: in a
    ring of its own by order, released one job at a time as the upstream
    may start one (when a timer in ``_timers`` is due, or a fetch of it
    returns), back among the ready jobs at its order. So a held upstream
    costs no pick more than O(log n), and delays no job of another.

    A job whose turn comes while its caller, or its next target's
    upstream, is paused (:meth:`pause`; an upstream by any name
    ``store.jobs.pauses.covers`` allows, its host say) waits the same way, in
    a ring of that pause's (``_held``), until it is lifted: then all its
    jobs are back among the ready ones at their order. Holding a job moves no
    cursor: it keeps its turn, whether or not a pick passed it meanwhile.

    Not thread-safe: the runner's lock guards it. Invariants: ``_by_id``
    holds the live jobs and ``_owners`` counts them by caller; a job has at
    most one entry in ``_ready`` and ``_retry`` together (``LiveJob.queued``).
    Rings and heaps hold job ids, not jobs, so a job that left holds
    nothing (its caller above all) through an entry not yet popped; such
    entries, and those of cancelled jobs, are dropped when they come up.
    """

    __slots__ = (
        "_by_id",
        "_held",
        "_new",
        "_orders",
        "_owners",
        "_parked",
        "_pauses",
        "_pausing",
        "_ready",
        "_retry",
        "_timer_at",
        "_timers",
        "paces",
    )

    def __init__(
        self,
        fair: str = "job",
        weights: Mapping[str, int] | None = None,
        paces: Paces | None = None,
    ) -> None:
        self._new: Callable[[], _ByJob[C] | _ByCaller[C]] = (
            _ByJob if fair == "job" else functools.partial(_ByCaller, dict(weights or {}))
        )
        self._by_id: dict[str, LiveJob[C]] = {}
        self._owners: Counter[str] = Counter()
        self._orders = itertools.count()
        self._ready: _ByJob[C] | _ByCaller[C] = self._new()
        self._retry: list[tuple[float, int, str]] = []
        self.paces = paces
        # By upstream: the jobs parked on it, and when one of them may start
        # (the earliest such time in _timer_at; _timers holds stale ones too).
        self._parked: dict[str, _Ring[str]] = {}
        self._timers: list[tuple[float, str]] = []
        self._timer_at: dict[str, float] = {}
        # What is paused, as ("caller", id) and ("upstream", name); the
        # jobs each pause holds; by upstream met while any is paused, the
        # upstream pause that covers it (None: none).
        self._pauses: frozenset[tuple[str, str]] = frozenset()
        self._held: dict[tuple[str, str], _Ring[str]] = {}
        self._pausing: dict[str, tuple[str, str] | None] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, job_id: str) -> LiveJob[C] | None:
        """The live job with this id, if any."""
        return self._by_id.get(job_id)

    def add(self, job: LiveJob[C]) -> None:
        """Append a new job: it is last in the rotation, and offered."""
        job.order = next(self._orders)
        self._by_id[job.id] = job
        self._owners[job.owner] += 1
        self.offer(job)

    def remove(self, job: LiveJob[C]) -> None:
        """Take a job out; the cursor stays where it is. The last one out
        drops the entries left behind by cancelled jobs, and the room the
        rotation grew to."""
        if self._by_id.get(job.id) is not job:
            return  # taken back since, under a new lease: that one stays
        del self._by_id[job.id]
        self._owners[job.owner] -= 1
        if not self._owners[job.owner]:
            del self._owners[job.owner]
            self._ready.forget(job.owner)
        if not self._by_id:
            # New containers, not cleared ones: a dict or list keeps the room
            # it grew to, and a runner that once held many jobs would keep it.
            self._by_id, self._owners = {}, Counter()
            self._ready, self._retry = self._new(), []
            self._parked, self._timers, self._timer_at = {}, [], {}
            self._held = {}

    def __iter__(self) -> Iterator[LiveJob[C]]:
        return iter(list(self._by_id.values()))

    def settle(self, job: LiveJob[C]) -> bool:
        """Put a job with no target in flight where it belongs: out of the
        rotation if it is halted or finished (returns True), else offered.
        Every transition of a live job that is not running ends here."""
        job.running = False
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
            self._ready.push(job)

    def pick(self, now: float) -> LiveJob[C] | None:
        """The job whose turn it is (see the class); the cursors move to it.
        None if no job can start a target at ``now``. A job whose upstream
        may not start a target is parked on it on the way."""
        while self._retry and self._retry[0][0] <= now:
            _, _, job_id = heapq.heappop(self._retry)
            if (job := self._live(job_id)) is not None:
                job.retry_at = 0.0
                self._ready.push(job)
        while self._timers and self._timers[0][0] <= now:
            when, name = heapq.heappop(self._timers)
            if self._timer_at.get(name) == when:
                del self._timer_at[name]
                self._release(name)
        paces = self.paces
        live = functools.partial(self._unless_paused, now) if self._pauses else self._live
        while (job := self._ready.pop(live)) is not None:
            pace = None if paces is None else paces.of(job.targets[job.next], now)
            if paces is None or pace is None:
                job.queued = False
                return job
            wait = pace.wait(now)
            if wait == 0.0:
                job.queued = False
                job.paced(pace)
                pace.start(now)
                paces.watch(pace, now)
                self._schedule(pace, now)
                return job
            job.parked = pace
            self._parked.setdefault(pace.name, _Ring()).push(job.order, job.id)
            if wait is not None:
                self._timer(pace.name, now + wait)
            elif pace.starved(now):
                paces.fresh = True  # the store does not know a job wants it
        return None

    def pause(self, pauses: frozenset[tuple[str, str]]) -> bool:
        """From now on ``pauses`` are what is paused: ``("caller", id)``
        and ``("upstream", name)``. The jobs held by a pause lifted are
        back among the ready ones; returns whether any are."""
        self._pauses = pauses
        self._pausing = {}
        lifted = [key for key in self._held if key not in pauses]
        for key in lifted:
            ring = self._held.pop(key)
            while (job := _take(ring, self._live)) is not None:
                job.paused = None
                self._ready.push(job)
        return bool(lifted)

    def _unless_paused(self, now: float, job_id: str) -> LiveJob[C] | None:
        """What :meth:`_live` gives, while anything is paused: a job whose
        caller, or its next target's upstream, is paused is held in that
        pause's ring instead (and its entry dropped like a job that left),
        so the cursor stays on the last job picked and the job keeps its
        turn for when the pause is lifted."""
        job = self._live(job_id)
        if job is None:
            return None
        key: tuple[str, str] | None = ("caller", job.owner)
        if key not in self._pauses:
            pace = None if self.paces is None else self.paces.of(job.targets[job.next], now)
            key = None if pace is None else self._paused_upstream(pace.name)
            if key is None:
                return job
        job.paused = key
        self._held.setdefault(key, _Ring()).push(job.order, job.id)
        return None

    def _paused_upstream(self, upstream: str) -> tuple[str, str] | None:
        """The pause that covers ``upstream``, if one does."""
        try:
            return self._pausing[upstream]
        except KeyError:
            names = sorted(name for kind, name in self._pauses if kind == "upstream")
            name = covering(names, upstream)
            key = self._pausing[upstream] = None if name is None else ("upstream", name)
            return key

    def returned(
        self, job: LiveJob[C], answer: Answer, seconds: float, after: float, now: float
    ) -> None:
        """A fetch of ``job`` came back at ``now`` (``answer``, after
        ``seconds``; a busy one asking to wait ``after``): its upstream
        learns it, and a job parked on it is released if one may start."""
        pace = job.returned()
        if pace is not None:
            assert self.paces is not None
            pace.finish(now, answer, seconds, after, self.paces.jitter)
            self.paces.fresh |= pace.publish
            self.paces.watch(pace, now)
            self._schedule(pace, now)

    def explain(self, job: LiveJob[C], now: float) -> dict[str, object]:
        """Why ``job`` is not fetching at ``now``, if it is not."""
        if job.running:
            return {"state": "fetching", "target": job.next}
        if job.halted:
            return {"state": "stopping"}
        if job.paused is not None:
            kind, name = job.paused
            return {"state": "paused", kind: name}
        if job.parked is not None:
            pace = job.parked
            return {"state": "upstream", "why": pace.why(now), **pace.explain(now)}
        if job.retry_at > now:
            return {"state": "retry", "retry_in": job.retry_at - now, "target": job.next}
        return {"state": "ready", "target": job.next}

    def upstreams(self, now: float) -> list[UpstreamState]:
        """Each upstream paced so far, by name, as it stands at ``now``."""
        if self.paces is None:
            return []
        return sorted(
            (pace.state(now, self._waiting_on(pace.name)) for pace in self.paces),
            key=lambda state: state.name,
        )

    def wants(self, now: float) -> list[store.UpstreamWant]:
        """What this runner wants of each upstream it paces (none, at the
        moment, of one it paces and neither fetches from nor waits on: the
        store still shows it paced), and the holds it has to tell of, for a
        sync. Upstreams idle for long are forgotten on the way."""
        if self.paces is None:
            return []
        self.paces.fresh = False
        wants = []
        for pace in self.paces:
            if pace.name not in self._parked and pace.idle(now):
                self.paces.forget(pace.name)
                continue
            demand = pace.told = self._waiting_on(pace.name) + pace.inflight
            hold = pace.hold_to_publish(now)
            # Until the answer is in force, targets may start within the
            # slots it has: the store keeps them for it meanwhile.
            inflight = max(pace.inflight, pace.slots or 0)
            limit = pace.limit
            wants.append(
                store.UpstreamWant(pace.name, demand, limit.concurrency, limit.rate, inflight, hold)
            )
        return wants

    def shared(self, shares: Mapping[str, store.UpstreamShare], now: float, lapse: float) -> None:
        """A sync at ``now`` said this runner's share of these upstreams:
        jobs parked on one that only a sync could let start (no share yet,
        no slot, none of the rate) may start as it allows. (Those parked
        with a time to start at keep their timer.)"""
        if self.paces is None:
            return
        for pace in self.paces:
            share = shares.get(pace.name)
            if share is not None:
                waiting = pace.wait(now) is None
                pace.shared(share, now, lapse)
                self.paces.watch(pace, now)
                if waiting:
                    self._schedule(pace, now)

    def not_shared(self, wants: list[store.UpstreamWant]) -> None:
        """A sync of ``wants`` failed: their holds are told at the next."""
        assert self.paces is not None
        for want in wants:
            pace = self.paces.get(want.upstream)
            if want.hold and pace is not None:
                pace.publish = self.paces.fresh = True

    def _waiting_on(self, name: str) -> int:
        """How many live jobs are parked on upstream ``name``."""
        ring = self._parked.get(name)
        return 0 if ring is None else sum(1 for _, job_id in ring if job_id in self._by_id)

    def _schedule(self, pace: Pace, now: float) -> None:
        """``pace`` changed: if a job is parked on it, release one now if a
        target may start, or set the timer for when one may."""
        if pace.name not in self._parked:
            return
        wait = pace.wait(now)
        if wait == 0.0:
            self._release(pace.name)
        elif wait is not None:
            self._timer(pace.name, now + wait)

    def _timer(self, name: str, when: float) -> None:
        """A job parked on upstream ``name`` may start at ``when``."""
        if when < self._timer_at.get(name, math.inf):
            self._timer_at[name] = when
            heapq.heappush(self._timers, (when, name))

    def _release(self, name: str) -> None:
        """The next job parked on upstream ``name`` (round robin, by order),
        if any, rejoins the ready ones; the ring and its timer go once it
        is empty (a timer due later finds nothing, and does nothing)."""
        ring = self._parked.get(name)
        if ring is None:
            return
        job = _take(ring, self._live)
        if job is not None:
            job.parked = None
            self._ready.push(job)
        if not ring:
            del self._parked[name]
            self._timer_at.pop(name, None)

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
        return bool(
            self._ready
            or (self._retry and self._retry[0][0] <= now)
            or (self._timers and self._timers[0][0] <= now)
        )

    def next_retry_in(self, now: float) -> float | None:
        """Seconds until the earliest held-back target may be tried (a
        retry, or a job parked on an upstream), or None if none waits on a
        time."""
        while self._retry and self._by_id.get(self._retry[0][2]) is None:
            heapq.heappop(self._retry)
        while self._timers and self._timer_at.get(self._timers[0][1]) != self._timers[0][0]:
            heapq.heappop(self._timers)
        due = min(
            self._retry[0][0] if self._retry else math.inf,
            self._timers[0][0] if self._timers else math.inf,
        )
        return None if due == math.inf else due - now

    def waiting_retry(self, now: float) -> int:
        """How many jobs wait on a retry."""
        return sum(
            1
            for at, _, job_id in self._retry
            if at > now and (job := self._by_id.get(job_id)) is not None and not job.halted
        )
