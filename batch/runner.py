"""``Runner``: jobs in, workers fetching their targets in turn, outcomes stored."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from itertools import islice
from types import TracebackType
from typing import Generic, TypeVar

import store

from .attempt import Outcome, attempt
from .context import Context
from .errors import BatchError, InvalidJob, JobNotFound, RunnerClosed
from .hooks import Hooks, call_hook
from .model import CallerLike, Config, Job, Statistics, Target, TargetStatus, caller_id
from .rotation import LiveJob, Rotation

__all__ = ["Fetch", "Runner"]

log = logging.getLogger("batch")

#: Seconds between tries of a store write the store refused: doubling from
#: the first to the most.
BACKOFF_FIRST = 0.01
BACKOFF_MAX = 1.0

#: The hint stored with a target left pending by a runner that is gone.
INTERRUPTED_HINT = (
    "the runner stopped before fetching this target; submit it again,"
    " or pass Config(resume=...) to go on with such jobs"
)

C = TypeVar("C", bound=CallerLike)

#: What a runner calls for each target: ``fetch(ctx, caller, target)`` returns
#: a JSON-serializable value, or raises ``RetryLater`` or ``TargetError``.
Fetch = Callable[[Context, C, Target], object]


class Runner(Generic[C]):
    """Runs jobs (lists of targets) on worker threads, storing every outcome.

    Guarantees, for every job:

    1. Fairness: workers share one rotation of live jobs in submit order and
       take the next job in it that can start a target.
    2. Serial: a job has at most one target in flight, and its target ``i+1``
       starts only once target ``i`` is stored.
    3. A busy target (``RetryLater``) holds no worker: it is tried again after
       ``retry_wait`` and stored ``failed`` once busy for over ``retry_for``.
    4. A job becomes terminal exactly once: ``done``, ``failed`` or ``partial``
       by its targets, or ``cancelled`` at once by :meth:`cancel`.
    5. ``Hooks.depth``/``Hooks.inflight`` see every change of the live-job and
       in-flight counts, in order.
    """

    def __init__(
        self,
        db: store.Store,
        fetch: Fetch[C],
        config: Config | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        if not isinstance(db, store.Store):
            raise TypeError(f"db must be a store.Store, not {type(db).__name__}")
        if not callable(fetch):
            raise TypeError(f"fetch must be callable, not {type(fetch).__name__}")
        self._store = db
        self._fetch = fetch
        self._config = config if config is not None else Config()
        self._hooks = hooks if hooks is not None else Hooks()
        if not isinstance(self._config, Config):
            raise TypeError(f"config must be a batch.Config, not {type(config).__name__}")
        if not isinstance(self._hooks, Hooks):
            raise TypeError(f"hooks must be a batch.Hooks, not {type(hooks).__name__}")
        self._ctx = Context()

        # _lock guards the fields from here to _closed, the store writes that
        # record them, and the hook calls that report them (so hooks see
        # changes in order). It is never held while a fetch runs. _cond is notified on close; when a
        # job someone waits for (_waited) leaves the rotation or is cancelled;
        # and, while a worker waits for work (_idle > 0), on every change
        # that can let it start a target: a submit, a target finished or held
        # back. Nobody else needs a notice: a worker in a fetch looks again
        # when it is done. (Notices are not free: each wakes every thread
        # waiting on _cond, to take the lock in turn.)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._rotation: Rotation[C] = Rotation()
        self._inflight = 0
        self._idle = 0  # workers waiting on _cond in _pick
        self._waited: dict[str, int] = {}  # job id -> threads in wait() for it
        # Fetches done and not yet recorded; a job is in it at most once (it
        # stays running until its outcome is recorded). _writing: a worker is
        # recording them (see _write).
        self._finished: list[tuple[LiveJob[C], Outcome]] = []
        # Jobs whose first target started, to be stored as running with the
        # next batch (the fetch does not wait for it).
        self._starting: list[str] = []
        self._writing = False
        self._closed = False

        # This runner's entry in the store: it owns the jobs it accepts and
        # beats so that no other runner takes them while it lives.
        self._id = uuid.uuid4().hex
        self._stopped = threading.Event()  # set once the workers are joined
        self._store.register_runner(self._id)
        with self._lock:
            self._adopt(self._store.take_over_jobs(self._id, self._config.takeover_after))
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-worker-{i}", daemon=True)
            for i in range(self._config.workers)
        ]
        self._heart = threading.Thread(target=self._beat, name="batch-heartbeat", daemon=True)
        for t in (*self._threads, self._heart):
            t.start()

    def _adopt(self, rows: list[store.JobRow]) -> None:
        """Take on the live jobs of runners that are gone: rejoin the rotation,
        in their submit order, at the first pending target those whose owner
        ``Config.resume`` gives a caller for; end the others ``interrupted``.
        Called with the lock held."""
        wall, now = time.time(), time.monotonic()
        for row in rows:
            age = max(0.0, wall - row.created_at)
            caller = self._resume(row.owner)
            pending = [t.pos for t in row.targets if t.status == "pending"]
            if caller is None or not pending:
                status = self._store.interrupt_job(row.id, INTERRUPTED_HINT)
                call_hook(self._hooks.job, status)
                call_hook(self._hooks.job_seconds, age)
                continue
            job = LiveJob(
                row.id, row.owner, caller, [Target(t.ref) for t in row.targets], now - age
            )
            job.next = pending[0]
            job.started = True  # it ran before; its status stays as stored
            job.done = sum(t.status == "done" for t in row.targets)
            job.failed = job.next - job.done
            self._rotation.add(job)
            call_hook(self._hooks.depth, len(self._rotation))

    def _resume(self, owner: str) -> C | None:
        """The caller ``Config.resume`` gives for ``owner``'s jobs, or None."""
        resume = self._config.resume
        if resume is None:
            return None
        try:
            caller = resume(owner)
        except Exception:
            log.exception("Config.resume(%r) raised; that caller's jobs end interrupted", owner)
            return None
        if caller is not None and getattr(caller, "id", None) != owner:
            log.error(
                "Config.resume(%r) gave a caller with another id; jobs end interrupted", owner
            )
            return None
        return caller  # type: ignore[no-any-return]

    def _beat(self) -> None:
        """The heartbeat thread: tell the store this runner lives and take over
        the jobs of runners that have gone meanwhile, until it stops."""
        lapse = self._config.takeover_after
        while not self._stopped.wait(lapse / 3):
            try:
                self._store.runner_heartbeat(self._id)
                with self._lock:
                    if self._closed:
                        continue  # retired at close: the next runner takes them
                    self._adopt(self._store.take_over_jobs(self._id, lapse))
                    self._wake_workers()
            except store.StoreError:
                log.exception("runner heartbeat failed; trying again")

    # -- the caller's side --------------------------------------------------

    def submit(self, caller: C, targets: Iterable[str | Target]) -> str:
        """Store a new job for ``caller`` and put it last in the rotation;
        return its id. Raises ``InvalidJob`` for a bad target list and
        ``RunnerClosed`` after :meth:`close`; nothing is stored then. (A
        submit that races ``close`` may return the id of a job the closing
        runner leaves in the store, live, for the next runner.)"""
        owner = caller_id(caller)
        job_targets = self._targets(targets)
        job_id = uuid.uuid4().hex
        if self._closed:  # read without the lock: close() only ever sets it
            raise RunnerClosed("the runner is closed; submit to a new Runner")
        # Stored first, without the lock (workers go on meanwhile): a new job
        # is no other thread's business until it joins the rotation. If close
        # comes between, the job joins a closed runner's rotation and stays
        # live in the store for the next runner, like any unfinished job.
        self._store.create_job(job_id, owner, [t.ref for t in job_targets], self._id)
        with self._lock:
            self._rotation.add(LiveJob(job_id, owner, caller, job_targets, time.monotonic()))
            call_hook(self._hooks.depth, len(self._rotation))
            self._wake_workers()
        return job_id

    def _targets(self, targets: Iterable[str | Target]) -> list[Target]:
        if isinstance(targets, str | bytes) or not isinstance(targets, Iterable):
            raise InvalidJob(
                f"targets must be a list of str or batch.Target, not {type(targets).__name__}"
            )
        most = self._config.max_targets
        items = list(islice(targets, most + 1))
        if not items:
            raise InvalidJob("a job needs at least one target")
        if len(items) > most:
            raise InvalidJob(f"a job holds at most {most} targets (Config.max_targets)")
        out: list[Target] = []
        for pos, item in enumerate(items):
            try:
                out.append(item if isinstance(item, Target) else Target(item))
            except InvalidJob as e:
                raise InvalidJob(f"target {pos}: {e}") from None
        return out

    def status(self, caller: C, job_id: str) -> Job:
        """The job as stored. Raises ``JobNotFound`` for an unknown, evicted or
        another caller's job. Works after :meth:`close` too."""
        row = self._store.get_job(_stored_id(job_id), caller_id(caller))
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        return Job(
            id=row.id,
            status=row.status,
            created_at=row.created_at,
            updated_at=row.updated_at,
            targets=[
                TargetStatus(
                    Target(t.ref),
                    t.status,
                    None if t.result is None else json.loads(t.result),
                    t.error,
                    t.hint,
                )
                for t in row.targets
            ],
        )

    def touch(self, caller: C, job_id: str) -> None:
        """Mark the job as used now, so that eviction takes it last. Raises
        ``JobNotFound`` like :meth:`status`."""
        if not self._store.touch_job(_stored_id(job_id), caller_id(caller)):
            raise JobNotFound(f"no job {job_id!r}")

    def cancel(self, caller: C, job_id: str) -> bool:
        """Cancel a live job at once: it is ``cancelled`` when this returns. A
        target in flight finishes and is stored; no further target starts; the
        rest stay ``pending``. False for an unknown, another caller's or an
        already terminal job."""
        owner = caller_id(caller)
        with self._lock:
            job = self._rotation.get(_job_id(job_id))
            if job is None or job.owner != owner or job.cancelled:
                return False
            if not self._store.set_job_status(job.id, "cancelled"):
                return False  # its last target's outcome, just stored, ended it
            job.cancelled = True
            call_hook(self._hooks.job, "cancelled")
            if not job.running:
                self._leave(job)
            else:
                self._wake_waiters(job)
            return True

    def wait(self, caller: C, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is terminal and return it. Raises ``TimeoutError``
        if ``timeout`` seconds pass first, ``JobNotFound`` like :meth:`status`,
        ``RunnerClosed`` if the runner closed with the job unfinished, and
        ``BatchError`` for a live job another runner owns."""
        owner = caller_id(caller)
        job_id = _job_id(job_id)
        deadline = _deadline(timeout)
        with self._lock:
            while (job := self._rotation.get(job_id)) is not None and job.owner == owner:
                if job.cancelled:
                    break
                if self._closed and not job.running:
                    raise RunnerClosed(f"the runner closed before job {job_id!r} ended")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id!r} did not end within {timeout}s")
                self._waited[job_id] = self._waited.get(job_id, 0) + 1
                try:
                    self._cond.wait(min(remaining, threading.TIMEOUT_MAX))
                finally:
                    if self._waited[job_id] == 1:
                        del self._waited[job_id]
                    else:
                        self._waited[job_id] -= 1
        stored = self.status(caller, job_id)
        if not stored.terminal:
            raise BatchError(
                f"job {job_id!r} is run by another runner; wait on that one, or read its status"
            )
        return stored

    def statistics(self) -> Statistics:
        """A consistent snapshot of the runner, taken under its lock."""
        with self._lock:
            return Statistics(
                workers=sum(t.is_alive() for t in self._threads),
                live=len(self._rotation),
                inflight=self._inflight,
                waiting_retry=self._rotation.waiting_retry(time.monotonic()),
                closed=self._closed,
            )

    def close(self, timeout: float | None = None) -> None:
        """Stop: start no further target, cancel the fetch context, store what
        the fetches in flight return, and join the workers. Pending targets
        stay ``pending`` and their jobs stay live in the store. Idempotent.

        Raises ``TimeoutError`` if workers are still in a fetch after
        ``timeout`` seconds; calling again waits for them again.
        """
        with self._lock:
            self._closed = True
            self._ctx.cancel()
            self._cond.notify_all()
        deadline = _deadline(timeout)
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX))
        busy = sum(t.is_alive() for t in self._threads if t is not me)
        if busy:
            raise TimeoutError(f"{busy} workers still in a fetch after {timeout}s")
        if not self._stopped.is_set():
            self._stopped.set()
            self._heart.join()
            try:
                # Closed: the next runner takes this one's live jobs at once.
                self._store.retire_runner(self._id)
            except store.StoreError:
                log.exception("cannot mark runner %s closed; its jobs wait for the lapse", self._id)

    def __enter__(self) -> Runner[C]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.statistics()
        state = "closed" if s.closed else "open"
        return f"<batch.Runner {state} workers={s.workers} live={s.live} inflight={s.inflight}>"

    # -- the workers' side --------------------------------------------------

    def _work(self) -> None:
        """One worker's thread: fetch targets until the runner closes.

        A finished fetch joins ``_finished``; unless another worker is
        recording already, this one then records them all (:meth:`_write`),
        and it picks its next job. Only the worker running a job moves its
        ``next``, so its target is read outside the lock.
        """
        with self._lock:
            job = self._pick()
        while job is not None:
            outcome = attempt(self._fetch, self._ctx, job.caller, job.targets[job.next])
            with self._lock:
                self._inflight -= 1
                call_hook(self._hooks.inflight, self._inflight)
                self._finished.append((job, outcome))
                # Let go of the turn before waiting for the next one: a job
                # that leaves the rotation must not keep its caller alive here.
                del job, outcome
                if not self._writing:
                    self._write()
                job = self._pick()

    def _pick(self) -> LiveJob[C] | None:
        """Wait for a job that can start a target and mark it in flight; None
        once the runner is closed. Called with the lock held."""
        while not self._closed:
            now = time.monotonic()
            job = self._rotation.pick(now)
            if job is None:
                # One timed wait on the earliest retry, not a timer per retry.
                self._idle += 1
                try:
                    self._cond.wait(self._rotation.next_retry_in(now))
                finally:
                    self._idle -= 1
                continue
            if not job.started:
                job.started = True
                self._starting.append(job.id)
            job.running = True
            self._inflight += 1
            call_hook(self._hooks.inflight, self._inflight)
            return job
        return None

    def _write(self) -> None:
        """Record every finished fetch, a batch at a time, until none is left.
        Called with the lock held, by one worker at a time (``_writing``).

        Each batch is stored in one transaction with the lock released: the
        group commit that lets the other workers pick and fetch meanwhile,
        and share the next commit. Nothing the write depends on can change
        meanwhile: its jobs stay running (no other worker touches them), what
        it stores was decided under the lock, and they move on only once the
        lock is taken again.
        """
        self._writing = True
        try:
            while self._finished:
                finished, self._finished = self._finished, []
                starting, self._starting = self._starting, []
                now = time.monotonic()
                self._save(
                    [(j, o) for j, outcome in finished if (o := self._ended(j, outcome, now))],
                    starting,
                )
                if self._closed:
                    # A waiter must learn that its job will not end.
                    self._cond.notify_all()
                else:
                    # These jobs can start their next target now or at
                    # retry_at: an idle worker must look again.
                    self._wake_workers()
        finally:
            self._writing = False

    def _ended(self, job: LiveJob[C], outcome: Outcome, now: float) -> Outcome | None:
        """The outcome to store for ``job``'s target, or None when it came back
        busy and is to be tried again (rule 3): then the job waits on
        ``retry_at``, or leaves if cancelled meanwhile."""
        if outcome.status != "busy":
            return outcome
        if job.busy_since is None:
            job.busy_since = now
        retry_for = self._config.retry_for
        asked = now + outcome.after - job.busy_since > retry_for
        if now - job.busy_since <= retry_for and not asked:
            job.running = False
            job.retry_at = now + max(self._config.retry_wait, outcome.after)
            if job.cancelled:
                self._leave(job)
            else:
                self._rotation.offer(job)
            return None
        return outcome.busy_too_long(retry_for, asked)

    def _save(self, ended: list[tuple[LiveJob[C], Outcome]], starting: list[str]) -> None:
        """Store these outcomes in one transaction, each job's terminal status
        with its last target (rule 4), and the ``starting`` jobs as running;
        then move the jobs on. Called with the lock held; releases it while
        the store writes.

        A store that refuses the write (locked, disk full) is asked again with
        backoff until it accepts; the jobs stay running, so none starts its
        next target before its outcome is stored. Once the runner is closing
        it is not asked again: the outcomes are dropped and the targets stay
        pending, for the next runner.
        """
        delay = BACKOFF_FIRST
        while ended or starting:
            # Cancel may come while the store refuses: decide each time.
            outcomes = [self._stored(job, o) for job, o in ended]
            try:
                self._lock.release()
                try:
                    stored = self._store.store_targets(
                        outcomes, max_bytes=self._config.max_bytes, starting=starting
                    )
                finally:
                    self._lock.acquire()
            except store.StoreError:
                if self._closed:
                    log.exception(
                        "runner closing: %d outcome(s) dropped; their targets stay pending"
                        " for the next runner",
                        len(ended),
                    )
                    for job, _ in ended:
                        job.running = False
                        if job.cancelled:
                            self._leave(job)  # ended in the store already
                        else:
                            self._rotation.offer(job)
                    return
                log.warning(
                    "cannot store %d outcome(s); trying again in %.2gs",
                    len(ended),
                    delay,
                    exc_info=True,
                )
                self._cond.wait(delay)
                delay = min(2 * delay, BACKOFF_MAX)
                continue
            for i, (job, outcome) in enumerate(ended):
                end = outcomes[i].job_status if i in stored.ended else None
                self._advance(job, outcome, end, gone=i in stored.refused)
            return

    @staticmethod
    def _stored(job: LiveJob[C], outcome: Outcome) -> store.TargetOutcome:
        """What to store for ``job``'s next target: ``outcome``, with the job's
        status by its targets (rule 3) if that is its last and it is not
        cancelled."""
        end = None
        if not job.cancelled and job.next + 1 == len(job.targets):
            done = job.done + (outcome.status == "done")
            failed = job.failed + (outcome.status != "done")
            end = "done" if not failed else "failed" if not done else "partial"
        return store.TargetOutcome(
            job.id, job.next, outcome.status, outcome.result, outcome.error, outcome.hint, end
        )

    def _advance(self, job: LiveJob[C], outcome: Outcome, end: str | None, *, gone: bool) -> None:
        """Move ``job`` past the target whose ``outcome`` was just stored, and
        out of the rotation if that ended it (``end``) or it was cancelled.
        ``gone``: the store no longer had the job (cancelled, then evicted,
        while its target was in flight); it just leaves. Called with the
        lock held."""
        job.running = False
        if gone:
            self._leave(job)
            return
        job.next += 1
        job.done += outcome.status == "done"
        job.failed += outcome.status != "done"
        job.busy_since = None
        job.retry_at = 0.0
        call_hook(self._hooks.target, outcome.err, outcome.seconds, outcome.nbytes)
        if end is not None:
            call_hook(self._hooks.job, end)
            call_hook(self._hooks.job_seconds, time.monotonic() - job.created)
        if end is not None or job.cancelled:
            self._leave(job)
        else:
            self._rotation.offer(job)

    def _leave(self, job: LiveJob[C]) -> None:
        """Take a job out of the rotation, forgetting its caller, and tell its
        waiters."""
        self._rotation.remove(job)
        call_hook(self._hooks.depth, len(self._rotation))
        self._wake_waiters(job)

    def _wake_workers(self) -> None:
        """Notify ``_cond`` if a worker waits for work. Lock held."""
        if self._idle:
            self._cond.notify_all()

    def _wake_waiters(self, job: LiveJob[C]) -> None:
        """Notify ``_cond`` if a thread waits for ``job``. Lock held."""
        if job.id in self._waited:
            self._cond.notify_all()


def _job_id(job_id: object) -> str:
    if not isinstance(job_id, str):
        raise TypeError(f"a job id is a str, not {type(job_id).__name__}")
    return job_id


def _stored_id(job_id: object) -> str:
    """``job_id``, checked before it is looked up in the store."""
    checked = _job_id(job_id)
    if not checked.isascii():
        # Job ids are hex: this one cannot exist (nor be bound, if it holds a
        # lone surrogate).
        raise JobNotFound(f"no job {checked!r}")
    return checked


def _deadline(timeout: object) -> float:
    """The monotonic deadline ``timeout`` seconds from now (inf for None)."""
    if timeout is None:
        return math.inf
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout is a number of seconds or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout}")
    return time.monotonic() + timeout
