"""The values users hand to the runner and get back from it."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from json.scanner import make_scanner
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .errors import InvalidJob
from .states import LIVE_JOB, TERMINAL_JOB, JobStatus, TargetState

if TYPE_CHECKING:
    import store

__all__ = [
    "MAX_REF_BYTES",
    "Caller",
    "CallerLike",
    "Config",
    "Job",
    "Limit",
    "Statistics",
    "Target",
    "TargetStatus",
    "UpstreamState",
]

#: The longest ref a target may have, in UTF-8 bytes.
MAX_REF_BYTES = 8192


class CallerLike(Protocol):
    """Whoever submits jobs: anything with a non-empty ``str`` attribute ``id``.

    Only ``id`` is stored; it decides whose jobs these are.
    """

    @property
    def id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """A ready-made caller: just an id."""

    id: str

    def __post_init__(self) -> None:
        caller_id(self)


def caller_id(caller: object) -> str:
    """The id of ``caller``; ``TypeError`` unless it is a non-empty ``str``."""
    cid = getattr(caller, "id", None)
    if not isinstance(cid, str) or not cid or not _utf8(cid):
        raise TypeError(
            f"a caller needs a non-empty str attribute 'id'; got {type(caller).__name__}"
            f" with id={cid!r}"
        )
    return cid


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored: no lone surrogate."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Target:
    """One thing to fetch, named by ``ref``: a non-empty string of at most
    ``MAX_REF_BYTES`` UTF-8 bytes with no NUL. Raises ``InvalidJob`` otherwise."""

    ref: str

    def __post_init__(self) -> None:
        ref = self.ref
        if not isinstance(ref, str):
            raise InvalidJob(f"expected a str or batch.Target, not {type(ref).__name__}")
        if not ref:
            raise InvalidJob("a target ref must not be empty")
        if "\x00" in ref:
            raise InvalidJob("a target ref must not contain NUL characters")
        if not _utf8(ref):
            raise InvalidJob("a target ref must be valid Unicode (no lone surrogates)")
        size = len(ref.encode())
        if size > MAX_REF_BYTES:
            raise InvalidJob(f"a target ref is {size} bytes long; the most is {MAX_REF_BYTES}")


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """A target as stored: ``status`` is ``pending``, ``done`` or ``failed``;
    ``result`` is the decoded JSON of a done target."""

    target: Target
    status: TargetState
    result: Any = None
    error: str | None = None
    hint: str | None = None


def stored_targets(
    rows: Iterable[tuple[int, str, TargetState, str | None, str | None, str | None]],
) -> list[TargetStatus]:
    """The targets of a job as the store holds them (its rows: position,
    ref, status, result JSON, error, hint), decoded.

    Built without the frozen classes' ``__init__``: the refs were checked
    when the job was submitted, and setting each slot directly costs half
    as much, which a job of many targets, read often, notices."""
    targets = []
    for _, ref, status, result, error, hint in rows:
        target = _new(Target)
        _set_ref(target, ref)
        item = _new(TargetStatus)
        _set_target(item, target)
        _set_status(item, status)
        _set_result(item, None if result is None else _decode(result))
        _set_error(item, error)
        _set_hint(item, hint)
        targets.append(item)
    return targets


_new = object.__new__
#: The scanner under ``json.loads``, called directly.
_scan = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # the documented context


def _decode(text: str) -> Any:
    """The value of a result's JSON, as ``json.loads`` gives it, without the
    two whitespace scans it makes around the text: the runner stores none.
    Any other text is left to ``json.loads``."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else json.loads(text)


_set_ref = Target.__dict__["ref"].__set__
_set_target, _set_status, _set_result, _set_error, _set_hint = (
    TargetStatus.__dict__[name].__set__ for name in ("target", "status", "result", "error", "hint")
)


@dataclass(frozen=True, slots=True)
class Job:
    """A job as stored. ``status`` is ``queued`` or ``running`` while live, then
    one of ``done``, ``failed``, ``partial``, ``cancelled`` for good. Times are
    epoch seconds; ``targets`` are in submit order."""

    id: str
    status: JobStatus
    created_at: float
    updated_at: float
    targets: list[TargetStatus]
    #: What its submitter called it (``submit(..., name=...)``), if anything.
    name: str | None = None
    #: Its idempotency key (``submit(..., idempotency_key=...)``), if any.
    key: str | None = None
    #: The time before which it may not start (``submit(..., not_before=...)``), if any.
    not_before: float | None = None
    #: Why it ended as it did when no target says: the job it waited after
    #: (``after_ok``) that did not end done.
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        """True once the status can no longer change."""
        return self.status not in LIVE_JOB


def stored_job(row: store.JobRow, status: JobStatus, targets: list[TargetStatus]) -> Job:
    """The :class:`Job` of the store's ``row``: each of its fields from the
    row's field of the same name, but ``status`` and ``targets``, as the
    runner sees them."""
    shared: dict[str, Any] = {f.name: getattr(row, f.name) for f in fields(Job)}
    return Job(**{**shared, "status": status, "targets": targets})


@dataclass(frozen=True, slots=True)
class Limit:
    """The limits of one upstream, across every runner on the store.

    - ``concurrency``: at most this many targets in flight at once.
    - ``rate``: at most this many fetch starts a second, ``burst`` of them
      at once after a quiet spell (a token bucket).
    - ``adaptive``: the concurrency and rate in force follow the answers:
      raised while they come back fast and not busy, cut at a busy answer
      or a rising latency, never above the configured ones.
    - ``break_after``: this many targets failed for good in a row open the
      upstream's breaker: its targets wait ``cool_down`` seconds, then one
      is tried; a success closes it, a failure opens it again.
    """

    concurrency: int | None = None
    rate: float | None = None
    burst: int = 1
    adaptive: bool = False
    break_after: int | None = None
    cool_down: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            _check_limit_int("concurrency", self.concurrency)
        if self.rate is not None:
            _check_positive("rate", self.rate)
        _check_limit_int("burst", self.burst)
        if not isinstance(self.adaptive, bool):
            raise TypeError(f"Limit.adaptive must be a bool, not {type(self.adaptive).__name__}")
        if self.break_after is not None:
            _check_limit_int("break_after", self.break_after)
        _check_positive("cool_down", self.cool_down)


def _check_limit_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Limit.{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"Limit.{name} must be at least 1, not {value}")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"Limit.{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"Limit.{name} must be a finite number more than 0, not {value}")


@dataclass(frozen=True, slots=True)
class Config:
    """How a runner works. Times are in seconds.

    - ``workers``: threads fetching at once (at least 1).
    - ``retry_wait``: how long a busy target waits before it is tried again.
    - ``retry_for``: how long a target may keep coming back busy before it is
      stored ``failed``.
    - ``max_bytes``: the stored bytes past which terminal jobs are evicted.
    - ``max_targets``: the most targets one job may have (a list of URLs
      a script reads does not reach the default; the runner holds about 50
      bytes per target of a live job, and the store a row each).
    - ``resume``: ``caller_id -> caller | None``. A new runner takes over the
      live jobs of runners that are gone; each job whose owner ``resume``
      returns a caller for rejoins the rotation at its first pending target
      (a target in flight when its runner died is fetched again: at least
      once). Without ``resume``, or when it returns None, the job ends at
      once, its pending targets ``failed`` with error ``interrupted``.
    - ``takeover_after``: the length of a job's lease: how long a runner may
      go without renewing before another takes its jobs (those of a closed
      runner, or of one whose process is gone on this host, at once).
      Runners renew three times within it, and start no target once they
      could not renew for that long.
    - ``max_live``: the most jobs the runner holds at once (None: every job
      submitted through it). Further jobs wait ``queued`` in the store, in
      submit order, for any runner on the store with room. 0: it runs
      none, and starts no worker: every job submitted through it waits
      for the runners that resume other callers' jobs (``batch.Client``).
    - ``fair``: who takes turns. ``"job"`` (rule 1): the live jobs, in
      submit order. ``"caller"``: the callers with a live job, in the order
      they came, and then each caller's jobs among themselves in submit
      order; a caller with many jobs gets no more turns than one with one.
    - ``weights``: with ``fair="caller"``, ``caller_id -> turns`` a caller
      takes in a row, each round (1 for a caller not named).
    - ``upstream``: ``target -> str | None``, the upstream a target calls
      (``batch.web.host_of`` for URLs). Targets of one upstream share its
      pace, whatever their job or caller: a busy answer holds them all,
      and ``limits`` bound them. None (or an upstream of None): no pacing.
    - ``limits``: ``upstream -> Limit``, ``"*"`` for every upstream not
      named (none: only busy answers pace an upstream).
    - ``tracing``: a span per fetch in the submitter's trace, where
      ``opentelemetry-api`` is installed and the application records
      traces (``batch.tracing``); False: none.
    - ``keep``: ``status -> seconds``, how long a job that ended in that
      status is kept (``{"done": 3600, "failed": 7 * 86400}``); the runner
      prunes older ones in small batches (``Store.prune``), beside the
      byte budget. A status not named is kept until evicted.
    - ``timeout``: the most seconds one fetch may take (None: no limit).
      At the limit its context is cancelled; what it returns within
      ``batch.timeouts.GRACE`` (0.5 s) more is stored as it returned. One
      that has not returned by then is abandoned: its target is stored
      ``failed`` with the error ``timed out``, the job goes on, and a fresh
      worker takes its place (an ``async def`` fetch's task is cancelled).
      ``statistics().abandoned`` counts those not returned yet.
    - ``loop``: the event loop of a runner whose fetch is an ``async def``.
      ``"auto"``: uvloop's where it is installed (``batch-store[speed]``),
      asyncio's own otherwise; ``"uvloop"`` or ``"asyncio"``: that one.
    """

    workers: int = 4
    retry_wait: float = 1.0
    retry_for: float = 60.0
    max_bytes: int = 256 << 20
    max_targets: int = 100_000
    resume: Callable[[str], Any] | None = None
    takeover_after: float = 5.0
    max_live: int | None = None
    fair: Literal["job", "caller"] = "job"
    weights: Mapping[str, int] | None = None
    upstream: Callable[[Target], str | None] | None = None
    limits: Mapping[str, Limit] | None = None
    tracing: bool = True
    keep: Mapping[str, float] | None = None
    loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    timeout: float | None = None

    def __post_init__(self) -> None:
        _check_int("workers", self.workers, 1)
        _check_int("max_bytes", self.max_bytes, 0)
        _check_int("max_targets", self.max_targets, 1)
        _check_seconds("retry_wait", self.retry_wait)
        _check_seconds("retry_for", self.retry_for)
        _check_seconds("takeover_after", self.takeover_after, positive=True)
        if self.max_live is not None:
            _check_int("max_live", self.max_live, 0)
        if self.timeout is not None:
            _check_seconds("timeout", self.timeout, positive=True)
        if self.fair not in ("job", "caller"):
            raise ValueError(f"Config.fair must be 'job' or 'caller', not {self.fair!r}")
        if self.weights is not None:
            _check_weights(self.weights, self.fair)
        if self.upstream is not None and not callable(self.upstream):
            raise TypeError(
                f"Config.upstream must be callable or None, not {type(self.upstream).__name__}"
            )
        if self.limits is not None:
            _check_limits(self.limits)
        if not isinstance(self.tracing, bool):
            raise TypeError(f"Config.tracing must be a bool, not {type(self.tracing).__name__}")
        if self.keep is not None:
            _check_keep(self.keep)
        if self.resume is not None and not callable(self.resume):
            raise TypeError(
                f"Config.resume must be callable or None, not {type(self.resume).__name__}"
            )
        if self.loop not in ("auto", "asyncio", "uvloop"):
            raise ValueError(
                f"Config.loop must be 'auto', 'asyncio' or 'uvloop', not {self.loop!r}"
            )
        if self.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError(
                "Config.loop='uvloop' needs uvloop installed: pip install 'batch-store[speed]'"
            )


def _check_int(name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Config.{name} must be an int, not {type(value).__name__}")
    if value < least:
        raise ValueError(f"Config.{name} must be at least {least}, not {value}")


def _check_limits(limits: object) -> None:
    if not isinstance(limits, Mapping):
        raise TypeError(f"Config.limits must be a mapping, not {type(limits).__name__}")
    for key, limit in limits.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"Config.limits keys are upstreams (non-empty str), not {key!r}")
        if not isinstance(limit, Limit):
            raise TypeError(
                f"Config.limits[{key!r}] must be a batch.Limit, not {type(limit).__name__}"
            )


def _check_weights(weights: object, fair: str) -> None:
    if fair != "caller":
        raise ValueError("Config.weights gives callers turns: it needs fair='caller'")
    if not isinstance(weights, Mapping):
        raise TypeError(f"Config.weights must be a mapping, not {type(weights).__name__}")
    for key, turns in weights.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"Config.weights keys are caller ids (non-empty str), not {key!r}")
        if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
            raise ValueError(f"Config.weights[{key!r}] must be an int >= 1, not {turns!r}")


def _check_keep(keep: object) -> None:
    if not isinstance(keep, Mapping):
        raise TypeError(f"Config.keep must be a mapping, not {type(keep).__name__}")
    for status, seconds in keep.items():
        if status not in TERMINAL_JOB:
            raise ValueError(
                f"Config.keep keys are the statuses of ended jobs"
                f" ({', '.join(TERMINAL_JOB)}), not {status!r}"
            )
        _check_seconds(f"keep[{status!r}]", seconds)


def _check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"Config.{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"Config.{name} must be a finite number of seconds >= 0, not {value}")
    if positive and value == 0:
        raise ValueError(f"Config.{name} must be more than 0 seconds")


@dataclass(frozen=True, slots=True)
class Statistics:
    """A snapshot of a runner, taken under its lock.

    ``workers``: worker threads running (0 once closed); ``live``: jobs in
    the rotation; ``inflight``: targets being fetched;
    ``waiting_retry``: live jobs whose next target waits out ``retry_wait``.

    Since the runner opened: ``stored``, the targets it stored (``done`` or
    ``failed``); ``retries``, the busy answers it will try again; ``ended``,
    by status, the jobs that became terminal through it (those it ran to
    their end, those cancelled through it, those it ended as interrupted):
    a dict of this snapshot's own.

    ``abandoned``: fetches abandoned at ``Config.timeout`` that have not
    returned yet (their threads, or an async fetch's tasks, left behind).
    ``store_ok``: whether the store answers the runner's beats: False from
    a beat it refused, or one it keeps waiting for more than half a beat's
    interval, until the next it answers (meanwhile the runner's leases
    are not renewed): what a health check reports.
    """

    workers: int
    live: int
    inflight: int
    waiting_retry: int
    closed: bool
    stored: int = 0
    retries: int = 0
    ended: Mapping[str, int] = field(default_factory=dict)
    abandoned: int = 0
    store_ok: bool = True


@dataclass(frozen=True, slots=True)
class UpstreamState:
    """One upstream as a runner paces it now (``Runner.upstreams``).

    ``limit``: what is configured; ``concurrency`` and ``rate``: what is in
    force (an adaptive limit's current ones; None: unbounded);
    ``inflight``: its targets being fetched; ``waiting``: jobs whose next
    target waits on it; ``held_until``: when a busy answer's hold ends
    (epoch seconds, as ``Runner.explain`` says it; None: not held);
    ``breaker``: ``closed``, ``open`` or ``trial``.
    Since the runner opened: its targets ``done``, answered ``busy``, and
    ``failed`` for good.
    """

    name: str
    limit: Limit
    concurrency: float | None
    rate: float | None
    inflight: int
    waiting: int
    held_until: float | None
    breaker: str
    done: int
    busy: int
    failed: int
