"""The sequential model of the runner's rules that ``test_runner_model.py``
holds a real runner to, and the gated fetch that lets the machine decide
how each fetch ends: how one fetch ends (``Act``), what is stored, the
jobs and the rotation as the rules say."""

from __future__ import annotations

import queue
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

import batch
from tests.helpers import TIMEOUT

#: Text of the unexpected exception: it may reach the log, never the store.
SECRET = "secret-detail-2b9e"
CALLERS = (batch.Caller("alice"), batch.Caller("bob"), batch.Caller("carol"))


# -- how one fetch ends ---------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A target as the store should hold it. ``not_json``: failed with an
    error that says the result was not JSON, whatever its exact words."""

    status: str
    result: Any = None
    error: str | None = None
    hint: str | None = None
    not_json: bool = False

    def matches(self, got: batch.TargetStatus) -> bool:
        if self.not_json:
            return (got.status, got.result) == ("failed", None) and "json" in str(got.error).lower()
        return (got.status, got.result, got.error, got.hint) == (
            self.status,
            self.result,
            self.error,
            self.hint,
        )


PENDING = Stored("pending")


@dataclass(frozen=True)
class Act:
    """How one fetch ends. ``done`` returns ``value``; ``error`` raises
    ``TargetError(msg, hint)``; ``unexpected`` raises ``KeyError``;
    ``not_json`` returns a set; ``busy`` raises ``RetryLater`` (asking to
    wait ``after`` seconds, if not 0), directly or as the cause of another
    exception."""

    kind: str
    value: Any = None
    msg: str = ""
    hint: str | None = None
    chained: bool = False
    after: int = 0

    def perform(self) -> object:
        if self.kind == "busy":
            busy = batch.RetryLater("upstream busy", after=self.after or None)
            if self.chained:
                raise RuntimeError("upstream said so") from busy
            raise busy
        if self.kind == "error":
            raise batch.TargetError(self.msg, hint=self.hint)
        if self.kind == "unexpected":
            raise KeyError(SECRET)
        if self.kind == "not_json":
            return {1, 2}
        return self.value

    def stored(self) -> Stored | None:
        """What the store holds for the target afterwards; None: still pending."""
        if self.kind == "busy":
            return None
        if self.kind == "done":
            return Stored("done", result=self.value)
        if self.kind == "error":
            return Stored("failed", error=self.msg, hint=self.hint)
        if self.kind == "unexpected":
            return Stored("failed", error="internal error")
        return Stored("failed", not_json=True)

    @property
    def err(self) -> str:
        """The type of the error ``Hooks.target`` gets, by name."""
        return {
            "done": "None",
            "error": "TargetError",
            "unexpected": "KeyError",
            "not_json": "TypeError",
        }[self.kind]


JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3)
    ),
    max_leaves=5,
)

CALLER = st.integers(0, len(CALLERS) - 1)
SIZE = st.integers(1, 4)
ACTS: st.SearchStrategy[Act] = st.one_of(
    st.builds(Act, kind=st.just("done"), value=JSON_VALUES),
    st.builds(
        Act, kind=st.just("error"), msg=st.text(max_size=8), hint=st.none() | st.text(max_size=8)
    ),
    st.just(Act("unexpected")),
    st.just(Act("not_json")),
    st.builds(Act, kind=st.just("busy"), chained=st.booleans()),
)
#: Also busy answers that ask to wait: they hold their upstream that long.
PACED_ACTS = ACTS | st.builds(Act, kind=st.just("busy"), after=st.sampled_from([3, 8]))


# -- the gated fetch ------------------------------------------------------------


#: Seconds a fetch waits for the machine to say how it ends: six of the
#: machine's own waits.
GATE = 6 * TIMEOUT


class Call:
    """One fetch, waiting for the machine to say how it ends."""

    def __init__(self, ref: str, caller: batch.Caller, ctx: batch.Context) -> None:
        self.ref = ref
        self.caller = caller
        self.ctx = ctx
        self._act: Act | None = None
        self._go = threading.Event()

    def finish(self, act: Act) -> None:
        """Decide how the fetch ends; the first decision stands."""
        if not self._go.is_set():
            self._act = act
            self._go.set()

    def wait(self) -> Act | None:
        """The act decided by the machine; None if it never decides (within
        ``GATE``: long, so that a machine slowed down by a busy host is never
        taken for one that forgot a fetch)."""
        return self._act if self._go.wait(GATE) else None


class GatedFetch:
    """The runner's fetch: every call goes on ``calls`` and waits on its gate.
    Records a violation if a job ever has two targets in flight."""

    def __init__(self) -> None:
        self.calls: queue.Queue[Call] = queue.Queue()
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._inflight: set[str] = set()
        self._every: list[Call] = []
        self._open = False

    def __call__(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        key = job_key(target.ref)
        call = Call(target.ref, caller, ctx)
        with self._lock:
            if key in self._inflight:
                self.violations.append(f"{target.ref} began with a target of {key} in flight")
            self._inflight.add(key)
            self._every.append(call)
            if self._open:
                call.finish(Act("done"))
        try:
            self.calls.put(call)
            act = call.wait()
        finally:
            with self._lock:
                self._inflight.discard(key)
        if act is None:
            with self._lock:
                self.violations.append(f"{target.ref}: the machine never said how it ends")
            act = Act("unexpected")
        return act.perform()

    def open_all(self) -> None:
        """Let every fetch, begun or to come, return at once."""
        with self._lock:
            self._open = True
            for call in self._every:
                call.finish(Act("done"))


def job_key(ref: str) -> str:
    """The model's name for the job of a target ref ``j<n>/t<i>``."""
    return ref.partition("/")[0]


def target_index(ref: str) -> int:
    return int(ref.partition("/t")[2])


# -- the model ------------------------------------------------------------------


@dataclass
class MUpstream:
    """An upstream as the model sees it (SPEC 2d): at most ``concurrency``
    targets in flight; none starts before ``held_until`` (a busy answer's
    ``after``); ``break_after`` failures in a row open the breaker: nothing
    starts for ``cool_down`` seconds, then one trial, whose success closes
    it, whose failure opens it again, and which a busy answer sends back to
    waiting. Counts since the runner opened."""

    limit: batch.Limit
    inflight: int = 0
    held_until: float = 0.0
    breaker: str = "closed"
    opened_at: float = 0.0
    failures: int = 0
    done: int = 0
    busy: int = 0
    failed: int = 0

    def free(self, now: float) -> bool:
        """Whether a target of it may start at ``now``."""
        if self.breaker == "trial" or now < self.held_until:
            return False
        if self.breaker == "open" and now < self.opened_at + self.limit.cool_down:
            return False
        return self.limit.concurrency is None or self.inflight < self.limit.concurrency

    def start(self) -> None:
        self.inflight += 1
        if self.breaker == "open":
            self.breaker = "trial"

    def finish(self, act: Act, now: float) -> None:
        self.inflight -= 1
        if act.kind == "busy":
            self.busy += 1
            self.held_until = max(self.held_until, now + act.after)
            if self.breaker == "trial":
                self.breaker = "open"
        elif act.kind == "done":
            self.done += 1
            self.failures = 0
            self.breaker = "closed"
        else:
            self.failed += 1
            self.failures += 1
            tripped = self.limit.break_after is not None and self.failures >= self.limit.break_after
            if self.breaker == "trial" or tripped:
                self.breaker, self.opened_at = "open", now


@dataclass
class MJob:
    """A job as the model sees it."""

    key: str
    caller: int
    size: int
    #: Each target's upstream (None: not paced).
    upstreams: list[str | None] = field(default_factory=list)
    id: str = ""
    status: str = "queued"
    next: int = 0
    running: bool = False
    taken: bool = False  # a worker took it up: running from then on
    cancelled: bool = False
    retry_at: float = 0.0  # a busy answer's after: not tried again sooner
    stored: list[Stored] = field(default_factory=list)
    #: Submitted to start later (SPEC 2f): not before ``not_before`` (the
    #: model's time), after the jobs ``after`` (keys) ended, and with
    #: ``after_ok`` only if they ended done. ``deferred`` until then.
    not_before: float = 0.0
    after: list[str] = field(default_factory=list)
    after_ok: bool = False
    deferred: bool = False

    def __post_init__(self) -> None:
        self.stored = [PENDING] * self.size
        self.upstreams = self.upstreams or [None] * self.size

    @property
    def refs(self) -> list[str]:
        return [f"{self.key}/t{i}" for i in range(self.size)]

    @property
    def terminal(self) -> bool:
        return self.status not in ("queued", "running")


class Model:
    """Rules 1-5, sequentially: the rotation in submit order, the cursor at the
    index after the last picked job, and every hook call the runner makes.

    With ``fair="caller"`` the turns go round the callers instead: those
    with a live job in the order they came (one whose last job left comes
    back last), from the index after the last caller picked, wrapping
    once; the caller picked takes up to its weight of turns in a row, each
    from its next ready job after the one it last picked (wrapping).

    With ``limits``, a job is ready only while its next target's upstream
    may start one (``MUpstream``) at ``now``, the time the machine steps.

    A paused caller's jobs, and jobs whose next target's upstream is
    paused, are not ready (SPEC 2f). A job submitted to start later waits
    outside the rotation until :meth:`due` says it may go; :meth:`release`
    then appends it to the rotation as a new job, or ends it cancelled when
    its ``after_ok`` is unmet."""

    def __init__(
        self,
        fair: str = "job",
        weights: dict[str, int] | None = None,
        limits: dict[str, batch.Limit] | None = None,
    ) -> None:
        self.fair = fair
        self.weights = weights or {}
        self.limits = limits or {}
        self.upstreams: dict[str, MUpstream] = {}
        self.now = 0.0
        self.callers: list[int] = []
        self.caller_cursor = 0
        self.current: int | None = None
        self.left = 0
        self.last_job: dict[int, int] = {}
        #: On an async runner, the job whose fetch just returned: the worker
        #: that fetched it picks again before its outcome is recorded, so
        #: that pick passes it over (and takes it only if nothing else can).
        self.unrecorded: MJob | None = None
        self.jobs: dict[str, MJob] = {}
        self.live: list[MJob] = []
        self.cursor = 0
        self.closed = False
        self.depths: list[int] = []
        self.inflights: list[int] = []
        self.ended: Counter[str] = Counter()
        self.seconds = 0
        self.targets: list[str] = []
        self.retries = 0
        #: Jobs submitted while the cursor was past the last live job.
        self.newcomers: set[str] = set()
        #: What is paused: callers (by index) and upstreams (by name).
        self.paused: set[int] = set()
        self.paused_upstreams: set[str] = set()

    @property
    def inflight(self) -> list[MJob]:
        return [j for j in self.live if j.running]

    def upstream(self, job: MJob) -> MUpstream | None:
        """The upstream of the job's next target."""
        name = job.upstreams[job.next]
        if name is None:
            return None
        if name not in self.upstreams:
            self.upstreams[name] = MUpstream(self.limits.get(name, batch.Limit()))
        return self.upstreams[name]

    def ready(self, job: MJob) -> bool:
        if job.running or job.cancelled or job.next == job.size or job.retry_at > self.now:
            return False
        if job.caller in self.paused or job.upstreams[job.next] in self.paused_upstreams:
            return False
        upstream = self.upstream(job)
        return upstream is None or upstream.free(self.now)

    def waiting_retry(self) -> int:
        """Live jobs whose busy target waits for its ``after``."""
        return sum(1 for j in self.live if not j.cancelled and j.retry_at > self.now)

    def any_ready(self) -> bool:
        return any(self.ready(j) for j in self.live)

    def submit(self, caller: int, size: int, upstreams: list[str | None] | None = None) -> MJob:
        job = MJob(f"j{len(self.jobs)}", caller, size, upstreams or [])
        self.jobs[job.key] = job
        self.join(job)
        return job

    def join(self, job: MJob) -> None:
        """``job`` is last in the rotation now."""
        if self.live and self.cursor == len(self.live):
            self.newcomers.add(job.key)
        self.live.append(job)
        if job.caller not in self.callers:
            self.callers.append(job.caller)
        self.depths.append(len(self.live))

    def submit_later(
        self,
        caller: int,
        size: int,
        upstreams: list[str | None],
        after: list[str],
        *,
        after_ok: bool = False,
        not_before: float = 0.0,
    ) -> MJob:
        """A job that waits, outside the rotation, until :meth:`due`."""
        job = MJob(f"j{len(self.jobs)}", caller, size, upstreams)
        job.after, job.after_ok, job.not_before, job.deferred = after, after_ok, not_before, True
        self.jobs[job.key] = job
        return job

    def due(self) -> list[MJob]:
        """The jobs waiting to start later that may go now, in submit order."""
        return [
            job
            for job in self.jobs.values()
            if job.deferred
            and job.not_before <= self.now
            and all(self.jobs[key].terminal for key in job.after)
        ]

    def release(self, job: MJob) -> None:
        """A job :meth:`due` gave goes: last in the rotation, or (``after_ok``
        and one of those it waited after did not end done) cancelled."""
        job.deferred = False
        if job.after_ok and any(self.jobs[key].status != "done" for key in job.after):
            job.cancelled = True
            job.status = "cancelled"
            self.ended["cancelled"] += 1
            return
        self.join(job)

    def pick(self) -> MJob | None:
        """The job the rotation gives a free worker: the first ready one from
        the cursor on, wrapping once; the cursor moves to the index after it."""
        job = self.pick_once()
        if job is None and self.unrecorded is not None:
            self.unrecorded = None  # recorded now: the worker woken for it picks
            job = self.pick_once()
        self.unrecorded = None
        return job

    def can_start(self, job: MJob) -> bool:
        return self.ready(job) and job is not self.unrecorded

    def pick_once(self) -> MJob | None:
        if self.fair == "caller":
            return self.pick_by_caller()
        n = len(self.live)
        for k in range(n):
            i = (self.cursor + k) % n
            if self.can_start(self.live[i]):
                self.cursor = i + 1
                return self.start(self.live[i])
        return None

    def pick_by_caller(self) -> MJob | None:
        if self.current is not None and self.left > 0:
            job = self.next_job_of(self.current)
            if job is not None:
                self.left -= 1
                return self.start(job)
        n = len(self.callers)
        for k in range(n):
            i = (self.caller_cursor + k) % n
            caller = self.callers[i]
            job = self.next_job_of(caller)
            if job is not None:
                self.caller_cursor = i + 1
                self.current = caller
                self.left = self.weights.get(CALLERS[caller].id, 1) - 1
                return self.start(job)
        return None

    def next_job_of(self, caller: int) -> MJob | None:
        """The caller's first ready job after the one it last picked, wrapping."""
        ready = [j for j in self.live if j.caller == caller and self.can_start(j)]
        last = self.last_job.get(caller, -1)
        job = next((j for j in ready if number(j) > last), ready[0] if ready else None)
        if job is not None:
            self.last_job[caller] = number(job)
        return job

    def start(self, job: MJob) -> MJob:
        assert self.ready(job), f"{job.key} cannot start a target"
        if (upstream := self.upstream(job)) is not None:
            upstream.start()
        job.running = True
        job.taken = True
        if job.status == "queued":
            job.status = "running"  # through its runner at once (SPEC 2)
        self.inflights.append(len(self.inflight))
        return job

    def leave(self, job: MJob) -> None:
        """Out of the rotation; the cursor stays on the job that was to come next."""
        i = self.live.index(job)
        del self.live[i]
        if i < self.cursor:
            self.cursor -= 1
        if not any(j.caller == job.caller for j in self.live):
            c = self.callers.index(job.caller)
            del self.callers[c]
            if c < self.caller_cursor:
                self.caller_cursor -= 1
            if self.current == job.caller:
                self.current, self.left = None, 0
            self.last_job.pop(job.caller, None)
        self.depths.append(len(self.live))

    def cancel(self, job: MJob) -> bool:
        if job.deferred:
            job.deferred, job.cancelled = False, True
            job.status = "cancelled"
            self.ended["cancelled"] += 1
            return True
        if job not in self.live or job.cancelled:
            return False
        job.cancelled = True
        job.status = "cancelled"
        self.ended["cancelled"] += 1
        if not job.running:
            self.leave(job)
        return True

    def finish(self, job: MJob, act: Act) -> None:
        """The fetch in flight for ``job`` ended as ``act`` says."""
        assert job.running
        if (upstream := self.upstream(job)) is not None:
            upstream.finish(act, self.now)
        job.running = False
        self.inflights.append(len(self.inflight))
        stored = act.stored()
        if stored is None:
            # Busy: pending still, and with retry_wait=0 ready again once
            # its after is over.
            job.retry_at = self.now + act.after
            if job.cancelled:
                self.leave(job)
            else:
                self.retries += 1
            return
        job.stored[job.next] = stored
        job.next += 1
        self.targets.append(act.err)
        if job.cancelled:
            self.leave(job)
        elif job.next == job.size:
            kinds = {s.status for s in job.stored}
            job.status = "partial" if len(kinds) == 2 else kinds.pop()
            self.ended[job.status] += 1
            self.seconds += 1
            self.leave(job)


def number(job: MJob) -> int:
    """The job's place in submit order."""
    return int(job.key[1:])


def err_name(err: BaseException | None) -> str:
    return "None" if err is None else type(err).__name__
