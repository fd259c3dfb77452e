"""``Runner``: the caller's side (submit, status, touch, cancel, wait,
close). The threads' life is in ``threads``, the workers in ``worker``, the
group commit in ``commit``, the leases in ``keeper``; they share one
``State``."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

import store

from . import beat, checks, explain, tracing, waits
from .calls import StoreCall
from .clock import SYSTEM, Clock
from .context import Context
from .errors import InvalidJob, JobNotFound, RunnerClosed, StoreFailed, store_failed
from .hooks import Hooks
from .model import (
    CallerLike,
    Config,
    Job,
    Statistics,
    Target,
    UpstreamState,
    caller_id,
    stored_job,
    stored_targets,
)
from .rotation import LiveJob
from .state import State
from .states import JobStatus, TargetState
from .threads import Threads, tell_others

__all__ = ["Fetch", "Runner"]

log = logging.getLogger("batch")

C = TypeVar("C", bound=CallerLike)

#: What a runner calls for each target: ``fetch(ctx, caller, target)`` returns
#: a JSON-serializable value, or raises ``RetryLater`` or ``TargetError``.
Fetch = Callable[[Context, C, Target], object]


class Runner(Generic[C]):
    """Runs jobs (lists of targets) on worker threads, storing every outcome.

    ``fetch`` may be an ``async def`` function (or an object whose
    ``__call__`` is one): the runner then awaits it on one event loop of
    its own, at most ``Config.workers`` fetches in flight, under the same
    rules; if the object has an ``aclose()``, the runner awaits it on that
    loop when it closes.

    Guarantees, for every job:

    1. Fairness: workers share one rotation of live jobs in submit order and
       take the next job in it that can start a target.
    2. Serial: a job has at most one target in flight, and its target ``i+1``
       starts only once target ``i`` is stored.
    3. A busy target (``RetryLater``) holds no worker: it is tried again after
       ``retry_wait`` and stored ``failed`` once busy for over ``retry_for``.
    4. A job becomes terminal exactly once: ``done``, ``failed`` or ``partial``
       by its targets, or ``cancelled`` at once by :meth:`cancel` of any
       runner on the store.
    5. ``Hooks.depth``/``Hooks.inflight`` see every change of the live-job and
       in-flight counts, in order.
    6. Ownership: the runner writes for a job only while it holds the job's
       lease in the store, with the fencing token it got it with; it starts
       no target once it could not renew its leases for ``takeover_after``.

    Errors: every one a method raises is a ``BatchError`` but Python's own
    ``TypeError`` (an argument of the wrong type) and ``TimeoutError``.
    ``StoreFailed`` comes from any method that reads or writes the store
    when it cannot answer (all but ``statistics``, ``upstreams`` and ``close``); besides:

    - ``submit``, ``submit_many``: ``InvalidJob``, ``RunnerClosed``;
    - ``status``, ``touch``: ``JobNotFound``;
    - ``cancel``: nothing else (False for a job it cannot cancel);
    - ``wait``, ``as_completed``, ``wait_async``: ``JobNotFound``,
      ``RunnerClosed``, ``TimeoutError``;
    - ``requeue_failed``: ``InvalidJob``, ``JobNotFound``, ``RunnerClosed``;
    - ``explain``: ``JobNotFound``;
    - ``upstreams``: nothing;
    - ``pause``, ``unpause``: nothing else;
    - ``close``: ``TimeoutError``.
    """

    def __init__(
        self,
        db: store.Store,
        fetch: Fetch[C],
        config: Config | None = None,
        hooks: Hooks | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(db, store.Store):
            raise TypeError(f"db must be a store.Store, not {type(db).__name__}")
        if not callable(fetch):
            raise TypeError(f"fetch must be callable, not {type(fetch).__name__}")
        config = config if config is not None else Config()
        hooks = hooks if hooks is not None else Hooks()
        if not isinstance(config, Config):
            raise TypeError(f"config must be a batch.Config, not {type(config).__name__}")
        if not isinstance(hooks, Hooks):
            raise TypeError(f"hooks must be a batch.Hooks, not {type(hooks).__name__}")
        self._s: State[C] = State(
            db, config, hooks, SYSTEM if clock is None else clock, uuid.uuid4().hex
        )
        s = self._s
        s.ledger.register_runner(s.id, config.takeover_after)
        with s.lock:
            beat.beat(s, config.resume)
        self._threads = Threads(s, fetch)

    @property
    def id(self) -> str:
        """This runner's id in the store (the owner of its leases)."""
        return self._s.id

    @property
    def closed_reason(self) -> str | None:
        """Why the runner closed by itself, if it did: a newer release of
        the library stepped the store's schema on (a deploy under way), so
        it stopped and let its jobs go to the newer runners. ``close`` it,
        and run the newer release. None otherwise."""
        return self._s.outdated

    # -- the caller's side --------------------------------------------------

    def submit(
        self,
        caller: C,
        targets: Iterable[str | Target],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
        not_before: float | None = None,
        after: Iterable[str] | None = None,
        after_ok: bool = False,
    ) -> str:
        """Store a new job for ``caller`` and put it last in the rotation;
        return its id. ``name`` is what people see it as in listings (a
        host, a file; at most 200 characters). Under ``Config.max_live``, a
        job past that many waits ``queued`` in the store for a runner with
        room. Raises ``InvalidJob`` for a bad target list or name and
        ``RunnerClosed`` after :meth:`close`; nothing is stored then. (A
        submit that races ``close`` may return the id of a job the closing
        runner leaves in the store, live, for the next runner.)

        ``idempotency_key`` (text, as a name): if ``caller`` has a job with
        this key in the store (not evicted or pruned), submitted by any
        runner or process, its id is returned and nothing is stored,
        whatever its state and whatever its targets (a key reused with
        other targets still gives the first job, unchanged). Two submits
        with one key racing anywhere make one job.

        ``not_before`` (epoch seconds, by the store's clock) and ``after``
        (ids of ``caller``'s jobs): the job stays ``queued``, held by no
        runner, until that time came and those jobs all ended; then any
        runner with room takes it (this one keeps the caller for it), at
        its time when it waits on one. With ``after_ok``, it runs only if
        they all ended ``done``; else it ends ``cancelled``, and
        ``Job.reason`` says why. ``InvalidJob`` for an id of no job of
        ``caller``'s (a job can only wait after jobs that exist, so no
        cycle can be made)."""
        return self._submit(
            caller,
            [checks.targets(targets, self._s.config.max_targets)],
            [checks.job_name(name)],
            [checks.idempotency_key(idempotency_key)],
            checks.later(not_before, after, after_ok),
        )[0]

    def submit_many(
        self,
        caller: C,
        jobs: Iterable[Iterable[str | Target]],
        *,
        names: Iterable[str | None] | None = None,
        idempotency_keys: Iterable[str | None] | None = None,
        not_before: float | None = None,
        after: Iterable[str] | None = None,
        after_ok: bool = False,
    ) -> list[str]:
        """Store a job for ``caller`` for each target list of ``jobs`` (named
        by ``names``, with the idempotency key of ``idempotency_keys``, one
        each, if given), all in one transaction, and put them last in the
        rotation in this order; return their ids, in the same order. As
        :meth:`submit` for each (a job whose key was used, before or
        earlier in this call, gives that job's id), but a bad list raises
        ``InvalidJob`` naming its index, and then nothing is stored. No
        list: nothing is stored, and ``[]`` returned. ``not_before``,
        ``after`` and ``after_ok`` hold for every job of the call."""
        if isinstance(jobs, str | bytes) or not isinstance(jobs, Iterable):
            raise InvalidJob(f"jobs must be a list of target lists, not {type(jobs).__name__}")
        checked: list[list[Target]] = []
        for k, targets in enumerate(jobs):
            try:
                checked.append(checks.targets(targets, self._s.config.max_targets))
            except InvalidJob as e:
                raise InvalidJob(f"job {k}: {e}") from None
        return self._submit(
            caller,
            checked,
            _each(names, len(checked), "names", checks.job_name),
            _each(idempotency_keys, len(checked), "idempotency keys", checks.idempotency_key),
            checks.later(not_before, after, after_ok),
        )

    def _submit(
        self,
        caller: C,
        jobs: list[list[Target]],
        names: list[str | None],
        keys: list[str | None],
        later: store.Later | None,
    ) -> list[str]:
        """Store these checked jobs and let them join, or wait ``later``
        (see :meth:`submit_many`)."""
        s = self._s
        owner = caller_id(caller)
        ids = [uuid.uuid4().hex for _ in jobs]
        if s.closed:  # without the lock: see State.closed
            raise RunnerClosed(s.outdated or "the runner is closed; submit to a new Runner")
        if not jobs:
            return ids
        bounded = s.config.max_live is not None
        trace = tracing.current() if s.config.tracing else None
        with s.lock:
            # Room is decided under the lock and held for these jobs by the
            # call until they join; jobs with none wait, their caller kept.
            # Those that join are leased to this runner as they are stored:
            # a beat that finds them held before they join must not take
            # them up (``State.calls``).
            free = s.room()
            room = 0 if later is not None else len(jobs) if free is None else min(free, len(jobs))
            call = s.calls.open(room if bounded else 0, ids[:room])
            # A runner that runs nothing (a client) keeps no caller.
            kept = 0 if s.config.max_live == 0 else len(jobs) - room
            if kept:
                held = s.waiting.get(owner)
                s.waiting[owner] = (caller, kept + (held[1] if held else 0))
        # Stored without the lock (workers go on meanwhile): new jobs are no
        # other thread's business until they join the rotation. If close
        # comes between, they join a closed runner's rotation and stay live
        # in the store for the next runner, like any unfinished job.
        try:
            with store_failed():
                stored = s.ledger.create_jobs(
                    owner,
                    [
                        (job_id, [t.ref for t in targets])
                        for job_id, targets in zip(ids, jobs, strict=True)
                    ],
                    s.id,
                    lease_for=s.config.takeover_after,
                    leased=room,
                    names=names,
                    traces=None if trace is None else [trace] * len(jobs),
                    keys=None if keys.count(None) == len(keys) else keys,
                    later=later,
                )
        except BaseException as e:
            # The jobs may be stored all the same (the answer to the commit was
            # lost): then the next beat finds them leased to this runner
            # and not in its rotation, and takes them up (beat._take_up).
            self._unsubmit(owner, call, kept)
            if isinstance(e, StoreFailed) and isinstance(e.__cause__, store.NotFound):
                raise InvalidJob(str(e.__cause__)) from None  # a job to wait after
            raise
        started = s.clock.monotonic()
        lease = store.Lease(s.id, 1)
        with s.lock:
            s.calls.close(call)
            # A job whose key was used already was not stored: it neither
            # joins nor waits.
            made = [own == got for own, got in zip(ids, stored, strict=True)]
            if later is not None and any(made):
                s.due(later.not_before)  # or at once: what it waits after may have ended
            if kept and not all(made[room:]):
                s.unwait(owner, made[room:].count(False))
            joining = [
                LiveJob(job_id, owner, caller, targets, started, lease, Context(s.ctx), trace)
                for job_id, targets, new in zip(ids[:room], jobs, made, strict=False)
                if new
            ]
            if joining:
                s.add(joining)
        return stored

    def _unsubmit(self, owner: str, call: StoreCall, waiting: int) -> None:
        """Jobs of a submit that raised: neither the room ``call`` held for
        those joining nor the caller kept for the ``waiting`` is theirs."""
        s = self._s
        with s.lock:
            s.calls.close(call)
            if waiting:
                s.unwait(owner, waiting)

    def status(self, caller: C, job_id: str) -> Job:
        """The job as stored, whichever runner holds it; ``running`` at once
        if this runner started it. Raises ``JobNotFound`` for an unknown,
        evicted or another caller's job. Works after :meth:`close` too."""
        s = self._s
        with store_failed():
            row = s.store.get_job(checks.stored_id(job_id), caller_id(caller))
        if row is None:
            raise JobNotFound(f"no job {job_id!r}")
        status = row.status
        if status == JobStatus.QUEUED:
            with s.lock:
                live = s.rotation.get(row.id)
                if live is not None and live.started and not s.closed:
                    status = JobStatus.RUNNING
        return stored_job(row, status, stored_targets(row.targets))

    def touch(self, caller: C, job_id: str) -> None:
        """Mark the job as used now, so that eviction takes it last. Raises
        ``JobNotFound`` like :meth:`status`."""
        with store_failed():
            touched = self._s.store.touch_job(checks.stored_id(job_id), caller_id(caller))
        if not touched:
            raise JobNotFound(f"no job {job_id!r}")

    def cancel(self, caller: C, job_id: str) -> bool:
        """Cancel a live job at once, whichever runner on the store holds it:
        it is ``cancelled`` in the store when this returns. A target in
        flight finishes and is stored; no further target starts (a runner of
        another process learns it within ``keeper.CANCEL_POLL`` seconds); the
        rest stay ``pending``. ``Hooks.job("cancelled")`` is called on this
        runner. False for an unknown, another caller's or an already
        terminal job."""
        s = self._s
        owner = caller_id(caller)
        try:
            job_id = checks.stored_id(job_id)
        except JobNotFound:
            return False
        # The store is written without the runner's lock: the workers go on
        # while it waits for the store. Between the write and the lock, an
        # outcome of the job may commit: the store keeps the job cancelled
        # and says so (Stored.cancelled), and the job leaves once halted; or
        # that outcome ended the job first, and the store finds nothing
        # live to cancel. Either way: one terminal status, one job hook. A
        # target of the job may start in between too, as on a runner of
        # another process until it learns: it is stored, and the job stays
        # cancelled. None starts here once this returns. A beat under way
        # may have taken the job: it halts it as it adopts it.
        with store_failed():
            cancelled = s.store.cancel_job(job_id, owner)
        if not cancelled:
            return False  # unknown, another caller's, or ended already
        with s.lock:
            s.ended(job_id, owner, JobStatus.CANCELLED, None)
            s.cancelled(job_id)
        # This runner may hold a stale copy of a job another has taken
        # since: every runner of this process that holds it is told.
        tell_others(s, job_id)
        return True

    def wait(self, caller: C, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is terminal and return it, whichever runner on
        the store runs it. Raises ``TimeoutError`` if ``timeout`` seconds pass
        first, ``JobNotFound`` like :meth:`status`, and ``RunnerClosed`` if
        this runner closed with the job unfinished in its hands.

        A job this runner holds is waited for on its condition; one another
        runner holds, on the store's events (``Store.watch``): its end is
        seen as its event is."""
        owner = caller_id(caller)
        job_id = checks.stored_id(job_id)
        waits.ended(
            self._s, owner, (job_id,), checks.deadline(timeout, self._s.clock), f"job {job_id!r}"
        )
        return self.status(caller, job_id)

    def as_completed(
        self, caller: C, job_ids: Iterable[str], timeout: float | None = None
    ) -> Iterator[Job]:
        """Yield each of the jobs as it becomes terminal, in the order they
        end (those already terminal first), whichever runner runs them;
        each id once. Raises ``TimeoutError`` if ``timeout`` seconds (from
        this call) pass before the last one, and ``JobNotFound`` and
        ``RunnerClosed`` as :meth:`wait` does. Waits as :meth:`wait` does:
        no polling for the jobs this runner holds."""
        owner = caller_id(caller)
        if isinstance(job_ids, str) or not isinstance(job_ids, Iterable):
            raise TypeError(f"job_ids is a collection of job ids, not {type(job_ids).__name__}")
        pending = list(dict.fromkeys(checks.stored_id(job_id) for job_id in job_ids))
        deadline = checks.deadline(timeout, self._s.clock)

        def completed() -> Iterator[Job]:
            while pending:
                what = f"{len(pending)} job(s), {pending[0]!r} first,"
                for job_id in waits.ended(self._s, owner, pending, deadline, what):
                    pending.remove(job_id)
                    yield self.status(caller, job_id)

        return completed()

    async def wait_async(self, caller: C, job_id: str, timeout: float | None = None) -> Job:
        """:meth:`wait` for asyncio code: await it; it never blocks the event
        loop (the store is read on a thread of the loop's, and a job this
        runner holds is awaited on a future its end resolves). The same
        errors as :meth:`wait`."""
        owner = caller_id(caller)
        job_id = checks.stored_id(job_id)
        checks.deadline(timeout, self._s.clock)  # checks the timeout
        await waits.ended_async(self._s, owner, job_id, waits.loop_deadline(timeout))
        return await asyncio.to_thread(self.status, caller, job_id)

    def requeue_failed(self, caller: C, job_id: str) -> str:
        """Submit a new job of the failed targets of the terminal job
        ``job_id``, in their order; return its id. ``InvalidJob`` if none
        failed, or the job has not ended yet; ``JobNotFound`` like
        :meth:`status`."""
        job = self.status(caller, job_id)
        if not job.terminal:
            raise InvalidJob(f"job {job_id!r} is still {job.status}: requeue it once it ended")
        failed = [t.target for t in job.targets if t.status == TargetState.FAILED]
        if not failed:
            raise InvalidJob(f"job {job_id!r} has no failed target")
        return self.submit(caller, failed)

    def statistics(self) -> Statistics:
        """A consistent snapshot of the runner, taken under its lock."""
        s = self._s
        with s.lock:
            return Statistics(
                workers=self._threads.workers(),
                live=len(s.rotation),
                inflight=s.inflight,
                waiting_retry=s.rotation.waiting_retry(s.clock.monotonic()),
                closed=s.closed,
                stored=s.counts.stored,
                retries=s.counts.retries,
                ended=dict(s.counts.ended),
                # An async runner's loop thread may be left behind with its
                # abandoned tasks: they are what is counted.
                abandoned=s.abandoned_tasks if self._threads.is_async else len(s.hung),
                store_ok=beat.answering(s),
            )

    def explain(self, caller: C, job_id: str) -> dict[str, object]:
        """Why the job is not fetching now: ``status`` as stored and
        ``state``. Of a job this runner runs: ``fetching`` (its ``target``
        in flight); ``ready`` (its turn is coming); ``retry`` (its target
        came back busy: ``retry_in`` seconds); ``upstream`` (its next
        target's upstream may not start one: ``why`` it is ``held``, its
        ``breaker`` open, at its ``concurrency`` or ``rate``, or waiting
        for its ``share`` of the store's limits; with ``upstream``,
        ``held_until``, ``inflight``, ``concurrency``, ``rate``,
        ``breaker``); ``stopping`` (cancelled, its target in flight
        finishing); ``paused`` (its ``caller``, or the ``upstream`` of its
        next target, is paused: :meth:`pause`). Of any other job, what the
        store says (``batch.explain.from_store``, as ``batch-runner
        explain`` says it): ``ended``, ``later`` (it waits for its
        ``not_before``, or for ``waits_after`` jobs it waits after to
        end), ``paused``, ``waiting`` (no live runner holds it), an
        ``upstream`` held, or ``elsewhere`` (the live ``runner`` that
        holds it runs it). Raises ``JobNotFound`` like :meth:`status`."""
        job = self.status(caller, job_id)
        if not job.terminal:
            s = self._s
            with s.lock:
                live = s.rotation.get(job.id)
                if live is not None:
                    return {
                        "id": job.id,
                        "status": job.status,
                        **s.rotation.explain(live, s.clock.monotonic()),
                    }
        with store_failed():
            where = self._s.store.whereabouts(job.id)
        if where is None:
            raise JobNotFound(f"no job {job_id!r}")
        return explain.from_store(where, self._s.config.upstream)

    def upstreams(self) -> list[UpstreamState]:
        """Each upstream this runner has paced (``Config.upstream``), by
        name: its limits in force, in flight, waiting jobs, hold, breaker
        and counts. Empty without ``Config.upstream``."""
        s = self._s
        with s.lock:
            return s.rotation.upstreams(s.clock.monotonic())

    def pause(self, caller: C | str | None = None, upstream: str | None = None) -> None:
        """Start no new target for ``caller`` (a caller, or its id) and of
        ``upstream`` (whichever are given), on any runner of the store,
        until :meth:`unpause`: on this runner once this returns, on the
        others within a tenth of a second (at their next look at the store,
        as for a cancel). Targets in flight finish and are stored; the jobs
        stay live, keep their place in the rotation, and go on where they
        stopped. The pause is stored: it outlives this runner.

        An upstream is the one ``Config.upstream`` names for a target (a
        runner without it pauses callers only), or, for one named after a
        URL's origin as ``batch.web.host_of`` names them, its host,
        ``host:port`` or a URL of it: ``pause(upstream="example.org")``
        pauses ``https://example.org:443`` and ``http://example.org:80``.
        ``store.UnknownUpstream`` (a ``ValueError``), and nothing paused,
        if it matches none this runner's ``Config.limits`` name or any
        runner of the store has paced. ``TypeError`` unless at least one
        is given, each a non-empty ``str`` (or a caller)."""
        self._pause(caller, upstream, paused=True)

    def unpause(self, caller: C | str | None = None, upstream: str | None = None) -> None:
        """Undo :meth:`pause` of ``caller`` and ``upstream`` (whichever are
        given, an upstream by the name it was paused by; one not paused is
        left as it is): the jobs it held start again, here at once, on the
        other runners within a tenth of a second."""
        self._pause(caller, upstream, paused=False)

    def _pause(self, caller: C | str | None, upstream: str | None, *, paused: bool) -> None:
        s = self._s
        owner = caller if caller is None or isinstance(caller, str) else caller_id(caller)
        with store_failed():
            if paused:
                s.store.pause(caller=owner, upstream=upstream, known=self._known_upstreams())
            else:
                s.store.unpause(caller=owner, upstream=upstream)
        keys = {("caller", owner)} if owner is not None else set()
        keys |= {("upstream", upstream)} if upstream is not None else set()
        with s.lock:
            s.pause(s.pauses | keys if paused else s.pauses - keys, mine=True)

    def _known_upstreams(self) -> list[str]:
        """The upstreams this runner knows of: named in ``Config.limits``,
        or paced."""
        s = self._s
        named = [name for name in s.config.limits or {} if name != "*"]
        with s.lock:
            return named + [state.name for state in s.rotation.upstreams(s.clock.monotonic())]

    def close(self, timeout: float | None = None, *, grace: float | None = None) -> None:
        """Stop: start no further target, cancel the fetch context, store what
        the fetches in flight return, join the workers, and release this
        runner's leases. Pending targets stay ``pending`` and their jobs stay
        live in the store, for the next runner. Idempotent.

        Returns or raises within ``timeout`` seconds, whatever a fetch or a
        hook does: ``TimeoutError`` if a worker is still in a fetch (or a
        hook holds the runner) by then; calling again waits again.

        ``grace`` (seconds) makes the close a drain, as a worker process
        stopping for a deploy wants: the fetches in flight go on uncancelled
        for up to ``grace`` seconds, and only then see their context
        cancelled; a fetch still in flight when ``timeout`` passes is given
        up: the runner's jobs are released to other runners at once (that
        target is fetched again there) and ``TimeoutError`` raised.
        """
        drain = None if grace is None else checks.deadline(grace, SYSTEM, "grace")
        self._threads.stop(checks.deadline(timeout, SYSTEM), timeout, drain)

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
        st = self.statistics()
        state = "closed" if st.closed else "open"
        return f"<batch.Runner {state} workers={st.workers} live={st.live} inflight={st.inflight}>"


def _each(
    values: Iterable[str | None] | None,
    count: int,
    what: str,
    check: Callable[[object], str | None],
) -> list[str | None]:
    """One of ``values`` (``what`` they are) per job of ``count``, each
    checked; None for each if not given. ``InvalidJob`` if they are not
    one each."""
    if values is None:
        return [None] * count
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidJob(f"{what} are a list, one per job, not {type(values).__name__}")
    given = [check(value) for value in values]
    if len(given) != count:
        raise InvalidJob(f"{count} jobs and {len(given)} {what}: give one each")
    return given
