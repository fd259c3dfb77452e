"""The runner's shared state: one lock, the conditions on it, and what it guards.

Every module of the runner (``runner``, ``worker``, ``commit``, ``keeper``)
works on one ``State``; this is where the rule of its lock is written.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

import store
from store.ledger import Ledger

from .attempt import Outcome
from .calls import Calls, StoreCall
from .clock import Clock
from .context import Context
from .ends import Ends
from .hooks import Hooks, call_hook
from .idle import Idle, ThreadSleeper
from .model import Config
from .pacing import Paces
from .rotation import LiveJob, Rotation
from .states import JobStatus, Reason
from .trouble import Trouble

if TYPE_CHECKING:
    from .timeouts import Fetch

__all__ = ["Counts", "State"]

log = logging.getLogger("batch")

C = TypeVar("C")


class Counts:
    """What this runner did since it opened, for ``statistics()``."""

    __slots__ = ("ended", "retries", "stored")

    def __init__(self) -> None:
        self.stored = 0
        self.retries = 0
        self.ended: dict[str, int] = {}


class State(Generic[C]):
    """What a runner's threads share.

    ``lock`` guards every field below but the first group, and the hook
    calls that report them (so that hooks see changes in order).

    The hooks are the only code that runs with the lock held but the
    runner's own. No store call is made under it: ``locks.unlocked``
    releases it for those of the group commit, the keeper and ``wait``;
    ``submit``, ``status``, ``touch`` and ``cancel`` make theirs before or
    after they take it. Neither the fetch nor ``Config.resume`` runs under
    it (the keeper releases it to call ``resume``). So a store that hangs
    or fails holds up only the thread that called it, and the runner's
    lock is never waited for while the store's is held.

    Conditions share it; each says who waits on it and who notifies:

    - each idle worker's own (in ``idle``, see ``batch.idle``): it waits
      for a job that can start a target. A worker is woken only when a job
      can start and no worker woken before is still on its way: the one
      woken takes a job and, if more can start, wakes the next. The
      sleeper that keeps the timer also wakes at the earliest retry. Every
      sleeper is woken on close.
    - ``done``: callers in ``Runner.wait`` and ``as_completed`` (``waited``
      by job id) wait for their jobs to end; coroutines in ``wait_async``
      wait on futures instead (``watchers``), resolved at the same moments.
      Notified when a waited-for job leaves the rotation
      or is cancelled, when a batch is written after close, and on close.
      The group commit's backoff between tries of a failing store waits on
      it too (``commit``), so that close ends that wait at once; a job
      ending meanwhile only brings the next try forward.
    - ``writes``: an async runner's writer thread waits for outcomes to
      record, and the group commit for quick fetches about to finish
      (``commit.gather``). Notified when a fetch's outcome joins
      ``finished``, and on close.
    - ``limits``: under ``Config.timeout``, the watch thread waits for the
      next time limit. Notified when a fetch starts while none was in
      flight, and on close.
    - ``chores``: the keeper thread waits for its next beat. Notified when a
      job starts (its ``running`` is to be stored), when an upstream is
      paced for the first time or a busy answer holds one (the store's
      other runners are to know), when room frees under
      ``Config.max_live``, when the store says jobs wait for a runner with
      room or that notices were lost (``keeper.on_notice``), and on close.

    Invariants whenever ``lock`` is free (``docs/concurrency.md`` says why):

    1. A live job has at most one target in flight: ``job.running`` from the
       moment a worker picks it until its outcome is recorded or held back.
    2. ``inflight`` is the last value ``Hooks.inflight`` got, and
       ``len(rotation)`` the last value ``Hooks.depth`` got.
    3. A job in the rotation is running, or waits in exactly one heap of it;
       a job that is halted (cancelled, lease lost) or finished and not
       running is not in it.
    4. ``finished`` holds a job at most once, and is empty unless a worker
       is recording (``writing``).
    5. No target starts once ``closed`` is set, nor while the monotonic
       clock is past ``valid_until`` (the leases may have lapsed).
    6. Whatever a store call raises, the thread that made it lives on: the
       group commit and the keeper catch any ``Exception``, log it once
       (``trouble``), back off and try again, and memory stays as it was
       before the call. A job whose outcome the store refused is read
       back, and leaves only if the store says another runner holds it,
       it is gone, or it ended (``commit``); a live job the store leases to
       this runner that is not in the rotation, nor about to join it
       (stored by a submit under way: ``calls``), is taken up by the next beat that finds it so
       (``keeper``).
    """

    def __init__(
        self,
        db: store.Store,
        config: Config,
        hooks: Hooks,
        clock: Clock,
        runner_id: str,
    ) -> None:
        # Set once, read without the lock.
        self.store = db
        self.ledger = Ledger.of(db)  # what only a runner calls of the store
        self.config = config
        self.hooks = hooks
        self.clock = clock
        self.id = runner_id
        self.ctx = Context()

        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.chores = threading.Condition(self.lock)
        self.writes = threading.Condition(self.lock)

        self.rotation: Rotation[C] = Rotation(
            config.fair,
            config.weights,
            None
            if config.upstream is None
            else Paces(config.upstream, config.limits or {}, config.retry_wait, random.Random()),
        )
        self.counts = Counts()
        self.inflight = 0
        self.idle = Idle()
        self.waited: dict[str, int] = {}
        # The ends of jobs other runners hold, from the store's events.
        self.ends = Ends(self)
        # By job id: what wakes each coroutine in wait_async for it (once).
        self.watchers: dict[str, list[Callable[[], None]]] = {}
        # Fetches done, outcome not recorded yet (see commit.record).
        self.finished: list[tuple[LiveJob[C], Outcome]] = []
        self.writing = False
        # How long a fetch takes, as a moving average (seconds, by the
        # system's clock): whether the group commit waits for fetches in
        # flight (commit.gather).
        self.fetch_seconds = 0.0
        # Jobs whose first target started, to be stored running: by the next
        # batch, or by the keeper within START_DELAY.
        self.starting: list[LiveJob[C]] = []
        self.starting_since = 0.0  # when the first of them started
        # Under Config.max_live: callers of the jobs stored waiting for room,
        # by caller id, with how many such jobs each has.
        self.waiting: dict[str, tuple[C, int]] = {}
        self.want_room = False  # room freed while jobs may wait: beat soon
        # The store calls under way with the lock let go mid-transition
        # (a beat, a look, a submit storing its jobs): the room they hold,
        # and what happened meanwhile that wins over what they read.
        self.calls = Calls()
        # What is paused (``Runner.pause``), as the rotation holds it.
        self.pauses: frozenset[tuple[str, str]] = frozenset()
        # When the next deferred job is due (monotonic; inf: none known), as
        # the last beat read it or sooner by a submit (``due``).
        self.due_at = math.inf
        # By kind of store call, its failures in a row (see batch.trouble).
        self.troubles: dict[str, Trouble] = {}
        self.valid_until = clock.monotonic() + config.takeover_after
        # Goes False -> True once, never back; set under the lock but by a
        # close that timed out waiting for it (a worker reads it under the
        # lock before each target, so none starts once that holder lets go).
        # Read without the lock only by a submit's first check, which a
        # stale False cannot hurt: its jobs then join a closed runner's
        # rotation (``add``) and stay live in the store for the next runner,
        # as when close comes while they are stored.
        self.closed = False
        self.stopping = False  # the workers are joined: the keeper retires
        # Why the runner closed by itself (a newer schema on the store), if it did.
        self.outdated: str | None = None
        # Closed, and the fetches in flight still have their grace (a drain,
        # ``Runner.close(grace=)``): the group commit keeps trying.
        self.draining = False
        # Under Config.timeout (batch.timeouts): the fetches in flight, in
        # start order; the worker threads abandoned in a fetch; how many
        # of those no fresh worker replaced; an async runner's abandoned
        # tasks not ended yet. The watch thread waits on ``limits``.
        self.fetching: dict[Fetch[C], None] = {}
        self.hung: set[threading.Thread] = set()
        self.short = 0
        self.abandoned_tasks = 0
        self.limits = threading.Condition(self.lock)

    # -- transitions of live jobs, all with the lock held ----------------------

    def add(self, jobs: list[LiveJob[C]]) -> None:
        """Put new jobs last in the rotation, in this order (one change of
        the live count)."""
        for job in jobs:
            self.rotation.add(job)
            if self.closed:
                job.ctx.cancel(Reason.CLOSED)
        call_hook(self.hooks.depth, len(self.rotation))
        self.wake_worker()

    # -- what the hooks and statistics() are told, all with the lock held ----------

    def stored(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        """A target was stored."""
        self.counts.stored += 1
        call_hook(self.hooks.target, err, seconds, nbytes)

    def paced(self) -> None:
        """The rotation's paces may have changed (a pick, an answer, a sync):
        tell the hooks of the upstreams held or released since last told,
        and the keeper if the store's other runners are to know of one (new,
        or held by a busy answer here)."""
        paces = self.rotation.paces
        if paces is None:
            return
        news, paces.news = paces.news, []
        for upstream, held_for in news:
            if held_for is None:
                call_hook(self.hooks.upstream_released, upstream)
            else:
                call_hook(self.hooks.upstream_held, upstream, held_for)
        if paces.fresh:
            self.chores.notify()

    def keep_timer(self, now: float) -> None:
        """Jobs may have been parked on an upstream until a time no sleeper
        knows of yet: one keeps it."""
        due_in = self.rotation.next_retry_in(now)
        if due_in is not None:
            self.retry_at(now + due_in)

    def retrying(self, err: BaseException, wait: float) -> None:
        """A busy target will be tried again in ``wait`` seconds."""
        self.counts.retries += 1
        call_hook(self.hooks.retry, err, wait)

    def ended(self, job_id: str, owner: str, status: JobStatus, seconds: float | None) -> None:
        """A job became terminal (``seconds`` after it was submitted; None
        for a cancelled one, which gets no ``job_seconds``)."""
        self.counts.ended[status] = self.counts.ended.get(status, 0) + 1
        if self.waiting and not self.closed:
            # Jobs stored waiting may wait after this one (``submit(after=
            # ...)``): a beat takes what may go now.
            self.want_room = True
            self.chores.notify()
        call_hook(self.hooks.job, status)
        call_hook(self.hooks.ended, job_id, owner, status)
        if seconds is not None:
            call_hook(self.hooks.job_seconds, seconds)

    def settle(self, job: LiveJob[C]) -> None:
        """``job`` has no target in flight any more: it leaves the rotation
        (halted or finished) or waits for its next turn."""
        self.settled(job, self.rotation.settle(job))

    def settled(self, job: LiveJob[C], left: bool) -> None:
        """``job`` was settled in the rotation (``left``: it left it): the
        depth hook, its waiters and the keeper are told, or a worker woken
        for it."""
        if left:
            call_hook(self.hooks.depth, len(self.rotation))
            self.changed(job.id)
            if self.config.max_live is not None and not self.closed:
                self.want_room = True
                self.chores.notify()
        elif job.retry_at:
            self.retry_at(job.retry_at)
        else:
            self.wake_worker()

    def halt(self, job: LiveJob[C], *, lost: bool = False) -> None:
        """Start nothing more of ``job``: it was cancelled, or (``lost``) its
        lease is another runner's. A job in flight leaves once its outcome
        is recorded (or refused)."""
        if lost:
            job.lose()
        else:
            job.cancel()
        if job.running:
            self.changed(job.id)
        else:
            self.settle(job)

    def changed(self, job_id: str) -> None:
        """Tell those waiting for ``job_id`` that it left the rotation or was
        halted: they look at it again."""
        if job_id in self.waited:
            self.done.notify_all()
        for wake in self.watchers.pop(job_id, ()):
            wake()

    def changed_all(self) -> None:
        """Tell every waiter to look again: the runner closes, and a job
        still in its hands will not end here."""
        self.done.notify_all()
        watchers, self.watchers = self.watchers, {}
        for wakes in watchers.values():
            for wake in wakes:
                wake()

    def unwait(self, owner: str, jobs: int = 1) -> C:
        """``jobs`` of ``owner``'s waiting for room have joined (or were
        never stored): its caller, forgotten with the last such job."""
        caller, count = self.waiting.pop(owner)
        if count > jobs:
            self.waiting[owner] = (caller, count - jobs)
        return caller

    def pause(self, pauses: frozenset[tuple[str, str]], *, mine: bool = False) -> None:
        """What is paused is ``pauses`` from now on (``mine``: a change this
        runner made); jobs a lifted pause held may start."""
        if mine:
            self.calls.paused()
        self.pauses = pauses
        if self.rotation.pause(pauses):
            self.wake_worker()

    def paused_in_store(self, paused: store.Paused, call: StoreCall) -> None:
        """What is paused is what ``call`` read of the store, unless this
        runner paused or unpaused while it was under way: the read may
        predate that."""
        if not call.paused:
            self.pause(
                frozenset(
                    [("caller", name) for name in paused.callers]
                    + [("upstream", name) for name in paused.upstreams]
                )
            )

    def due(self, not_before: float) -> None:
        """A job this runner submitted is due at ``not_before`` (epoch
        seconds): the keeper beats then, to release and take it."""
        at = self.clock.monotonic() + max(0.0, not_before - time.time())
        self.calls.due(at)
        if at < self.due_at:
            self.due_at = at
            self.chores.notify()

    def room(self) -> int | None:
        """How many more jobs may join the rotation (None: no limit)."""
        most = self.config.max_live
        return None if most is None else max(0, most - len(self.rotation) - self.calls.places())

    def wake_worker(self) -> None:
        """A job may start now, or at a retry time the sleepers may not know
        of: wake one idle worker, unless one woken before is on its way (it
        wakes the next itself, if more can start)."""
        self.idle.wake_one()

    def pass_on(self, now: float) -> None:
        """A worker has taken a job: if another can start now, wake the
        next idle worker (no more than one on its way at a time)."""
        if self.rotation.ready(now):
            self.idle.wake_one()

    def retry_at(self, when: float) -> None:
        """A job waits to be tried again at ``when``: unless a sleeper wakes
        by then, one is woken to keep the timer."""
        if when < self.idle.timer_at:
            self.idle.wake_one()

    def sleep(self, sleeper: ThreadSleeper, retry_in: float | None) -> None:
        """Wait (lock held) until woken, or, keeping the timer, until the
        earliest retry ``retry_in`` seconds from now is due."""
        now = self.clock.monotonic()
        try:
            self.wait(sleeper.cond, self.idle.nap(sleeper, now, retry_in))
        finally:
            self.idle.woke(sleeper, self.rotation.next_retry_in(now) is not None)

    def shut(self, *, cancel: bool) -> None:
        """Start no further target (``cancel``: and cancel every job's
        context), and wake whoever waits to learn it. Lock held."""
        self.closed = True
        if cancel:
            for job in self.rotation:
                job.ctx.cancel(Reason.CLOSED)
        self.idle.wake_all()
        self.writes.notify_all()
        self.limits.notify_all()
        self.changed_all()

    def cancelled_elsewhere(self, job_id: str) -> None:
        """Another runner of this process cancelled ``job_id`` in the store:
        if this runner holds it, start nothing more of it."""
        with self.lock:
            self.cancelled(job_id)

    def cancelled(self, job_id: str) -> None:
        """``job_id`` is cancelled in the store (committed): if this runner
        holds it, or a beat under way may have taken it, start nothing more
        of it. Lock held."""
        job = self.rotation.get(job_id)
        if job is not None:
            self.halt(job)
        else:
            self.calls.cancelled(job_id)

    def trouble(self, what: str) -> Trouble:
        """The failures in a row of the store calls ``what`` (lock held)."""
        trouble = self.troubles.get(what)
        if trouble is None:
            trouble = self.troubles[what] = Trouble(what)
        return trouble

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        """Wait on ``cond`` (lock held) by the runner's clock."""
        self.clock.wait(cond, timeout)
