"""The store's values, one module for all: what the batch runner stores and
reads back (jobs, targets, outcomes, leases, beats), what nodes
advertise, what runs hold, and what the store hands back."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from .errors import Conflict, NotFound
from .states import TERMINAL_JOB, JobStatus, RunState, StepState, TargetState

__all__ = [
    "Advert",
    "Assigned",
    "Assignment",
    "Beat",
    "Claim",
    "Event",
    "Gauges",
    "JobRow",
    "JobSummary",
    "Lease",
    "NewJobs",
    "NewRun",
    "NodeView",
    "RunView",
    "Step",
    "StepView",
    "Stored",
    "TargetOutcome",
    "TargetRow",
    "UpstreamShare",
    "UpstreamView",
    "UpstreamWant",
]

# -- events --------------------------------------------------------------------


class Event(NamedTuple):
    """One thing that happened on the store (``Store.watch``): its number
    ``seq`` (resume after it with ``since=seq``), its ``kind`` (one of
    ``store.events.KINDS``), the ``id`` of its job or run, when it
    happened by the store's clock (``at``, seconds since the epoch), and
    what the kind tells (``data``: ``owner``, ``name`` and ``targets`` of a
    job submitted; ``owner`` and ``status`` of a job started or ended;
    ``pos`` and ``status`` of a target stored; ``state``, and ``reason``
    once it moves, of a run)."""

    seq: int
    kind: str
    id: str
    at: float
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a scrape shows of the store (``Store.gauges``): ``jobs`` in each
    status, ``queued_runs`` and the seconds the oldest of them has waited
    (``oldest_queued``, 0 with none), and the ``nodes`` advertised, those
    ``busy`` (holding a lease) and those ``draining``."""

    jobs: dict[JobStatus, int]
    queued_runs: int
    oldest_queued: float
    nodes: int
    busy: int
    draining: int


# -- batch jobs ----------------------------------------------------------------


class TargetRow(NamedTuple):
    """One stored target, as its row. ``result`` is the JSON text as stored
    (or None). A tuple: a job of many targets reads fast."""

    pos: int
    ref: str
    status: TargetState
    result: str | None
    error: str | None
    hint: str | None


def column(name: str, default: Any = None, read: Callable[[Any], Any] | None = None) -> Any:
    """A field of a job kept in the column ``name`` of ``jobs``, read back
    through ``read`` (if given): the store selects and reads every such
    field of :class:`JobRow` and :class:`JobSummary` by these marks, so that
    a new column of a job is a schema step and a field here."""
    return field(default=default, metadata={"column": name, "read": read})


def _or_none(value: Any) -> Any:
    """A column's value, or None for one stored as 0 or empty."""
    return value or None


@dataclass(frozen=True, slots=True)
class JobRow:
    """One stored job with its targets in submit order. Times are epoch seconds."""

    id: str
    owner: str
    status: JobStatus
    created_at: float
    updated_at: float
    touched_at: float
    nbytes: int
    targets: tuple[TargetRow, ...]
    #: The runner the job was submitted through, if any.
    runner_id: str | None = column("runner_id")
    #: What its submitter called it, if anything.
    name: str | None = column("name")
    #: The trace context current when it was submitted (a W3C
    #: ``traceparent``), if any: where its fetches' spans belong.
    trace: str | None = column("trace")
    #: The submitter's idempotency key, if it gave one.
    key: str | None = column("idempotency_key")
    #: Before when (epoch seconds) it may not start, if it was given a time.
    not_before: float | None = column("not_before", read=_or_none)
    #: Whether it still waits for its time, or for jobs it waits after.
    deferred: bool = column("deferred", False, read=bool)
    #: How many of the jobs it waits after have not ended.
    waits: int = column("waits", 0)
    #: Why it ended as it did, when no target says (``after_ok`` unmet).
    reason: str | None = column("reason")

    def summary(self) -> JobSummary:
        """The job without its targets, counted instead."""
        statuses = [t.status for t in self.targets]
        return JobSummary(
            self.id,
            self.owner,
            self.status,
            self.created_at,
            self.updated_at,
            self.nbytes,
            statuses.count(TargetState.DONE),
            statuses.count(TargetState.FAILED),
            statuses.count(TargetState.PENDING),
            **{f.name: getattr(self, f.name) for f in fields(JobSummary) if "column" in f.metadata},
        )


@dataclass(frozen=True, slots=True)
class Later:
    """When new jobs may start (``Ledger.create_jobs(later=...)``): not
    before ``not_before`` (epoch seconds by the store's clock; 0: at once),
    and once the jobs ``after`` (ids, each once) all ended; with
    ``after_ok``, only if they all ended ``done``: else each ends
    ``cancelled`` with its ``reason``."""

    not_before: float = 0.0
    after: tuple[str, ...] = ()
    after_ok: bool = False


@dataclass(frozen=True, slots=True)
class Lease:
    """A runner's hold on a job: its ``owner`` (the runner's id) and the
    fencing ``token`` it got the job with. A write naming a lease is made
    only while the job still has exactly that owner and token."""

    owner: str
    token: int


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    """What to store for one pending target: ``status`` ``done`` or
    ``failed`` with its texts, and, if it ends its job, the job's terminal
    ``job_status``. Given a ``lease``, stored only while the job is held
    with it."""

    job_id: str
    pos: int
    status: TargetState
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    job_status: JobStatus | None = None
    lease: Lease | None = None

    def __post_init__(self) -> None:
        if self.status not in (TargetState.DONE, TargetState.FAILED):
            raise ValueError(f"a target ends done or failed, not {self.status!r}")
        if self.job_status is not None and self.job_status not in TERMINAL_JOB:
            raise ValueError(f"a job ends {', '.join(TERMINAL_JOB)}, not {self.job_status!r}")

    @property
    def nbytes(self) -> int:
        """UTF-8 bytes of the texts stored with the target."""
        return sum(len(t.encode()) for t in (self.result, self.error, self.hint) if t is not None)


@dataclass(frozen=True, slots=True)
class Stored:
    """What came of storing several outcomes, by their index: ``refused``
    (``NotFound``: the job is gone; ``Conflict``: its lease is another's, or
    the target was stored already), ``ended`` (their job moved to its
    ``job_status``), ``cancelled`` (stored, but their job was cancelled
    meanwhile, through another runner maybe), and the jobs ``evicted``."""

    refused: dict[int, NotFound | Conflict]
    ended: frozenset[int]
    evicted: list[str]
    cancelled: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One stored job without its targets: how many are in each status."""

    id: str
    owner: str
    status: JobStatus
    created_at: float
    updated_at: float
    nbytes: int
    done: int
    failed: int
    pending: int
    #: As in :class:`JobRow`.
    name: str | None = column("name")
    key: str | None = column("idempotency_key")
    not_before: float | None = column("not_before", read=_or_none)
    deferred: bool = column("deferred", False, read=bool)
    waits: int = column("waits", 0)
    reason: str | None = column("reason")


@dataclass(frozen=True, slots=True)
class Paused:
    """What is paused on the store (``Store.pause``): callers by id and
    upstreams by name, each with when it was paused (epoch seconds)."""

    callers: Mapping[str, float] = field(default_factory=dict)
    upstreams: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Whereabouts:
    """Where a stored job stands, from one snapshot (``Store.whereabouts``):
    the ``job``; the runner holding its lease (``holder``, None: none does)
    and until when (``held_until``, epoch seconds); whether that runner is
    ``alive`` (open, its process there, its lease not lapsed); how many
    runners are open on the store (``runners``); what is ``paused``; the
    ``upstreams`` the store paces, by name; and the store's time ``now``."""

    job: JobRow
    holder: str | None
    held_until: float | None
    alive: bool
    runners: int
    paused: Paused
    upstreams: Mapping[str, UpstreamView]
    now: float


@dataclass(frozen=True, slots=True)
class Look:
    """What a runner's look between beats found (``Ledger.look``):
    ``halted``, the jobs leased to it that are terminal already (cancelled
    through another runner); ``paused``, what is paused on the store;
    ``work``, whether a job waits that no runner holds (if asked)."""

    halted: list[str]
    paused: Paused
    work: bool = False


@dataclass(frozen=True, slots=True)
class Beat:
    """What one beat found. ``held``: the live jobs the runner still holds,
    by id, with their token (renewed now); ``ended``: jobs it held that are
    terminal now (cancelled through another runner; their lease released);
    ``taken``: jobs leased to it by this beat, oldest first, with their new
    token: to run, or to end if it cannot."""

    held: dict[str, int]
    ended: frozenset[str]
    taken: list[tuple[JobRow, int]]
    #: What is paused on the store, as of the beat.
    paused: Paused = Paused()
    #: Seconds until the next deferred job is due (None: none waits on a time).
    due: float | None = None
    #: Jobs this beat released that ended ``cancelled`` instead (their
    #: ``after_ok`` unmet): id, owner and the runner submitted through.
    cancelled: list[tuple[str, str, str | None]] = field(default_factory=list)


# -- the run scheduler -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UpstreamWant:
    """What a runner says of an upstream at each pace sync: ``demand``, how
    many of its jobs want it now (fetching from it, or waiting on it);
    ``concurrency`` and ``rate``, the configured most in flight at once and
    starts a second across every runner (None: no such limit);
    ``inflight``, how many of its targets may be in flight until the sync's
    answer is in force (those being fetched, or its slots, if more); ``hold``,
    seconds from now a busy answer it had since the last sync holds the
    upstream for (0: none)."""

    upstream: str
    demand: int
    concurrency: int | None
    rate: float | None
    inflight: int
    hold: float = 0.0


@dataclass(frozen=True, slots=True)
class UpstreamShare:
    """A runner's share of an upstream, until its next sync: ``runners``,
    how many runners want it now (this one included, at least 1); ``slots``,
    how many of its targets it may have in flight, and ``rate``, how many it
    may start a second (None: no such limit); ``held_for``, seconds from now
    the upstream is held by a busy answer any runner had (0: not held)."""

    runners: int
    slots: int | None
    rate: float | None
    held_for: float


@dataclass(frozen=True, slots=True)
class UpstreamView:
    """An upstream as the store has it (``Store.upstreams``): ``held_until``,
    when a busy answer's hold on it ends (epoch seconds by the store's
    clock; None: not held); of the live
    runners' rows, how many ``runners`` want it, how many of their jobs
    (``demand``), and the ``slots`` and starts a second (``rate``) they
    hold between them."""

    name: str
    held_until: float | None
    runners: int
    demand: int
    slots: int
    rate: float


@dataclass(frozen=True, slots=True)
class Advert:
    """A node offering itself: its id, a human name, and the capabilities
    (``caps``) steps may need. Advertising a known node replaces its name and
    caps."""

    node_id: str
    name: str
    caps: frozenset[str] | set[str] | list[str] | tuple[str, ...] = frozenset()


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a run: a ``name`` unique in the run, a ``kind`` (a lowercase
    identifier) and the capabilities it ``needs`` from its node."""

    name: str
    kind: str
    needs: frozenset[str] | set[str] | list[str] | tuple[str, ...] = frozenset()


@dataclass(frozen=True, slots=True)
class Assignment:
    """The matcher's answer for one step: it runs on ``node_id``."""

    seq: int
    node_id: str


@dataclass(frozen=True, slots=True)
class Assigned:
    """An assignment with the node's human name, as the Record keeps it."""

    seq: int
    node_id: str
    node_name: str


@dataclass(frozen=True, slots=True)
class Claim:
    """A step a node may now run, and when its lease ends unless renewed."""

    run_id: str
    seq: int
    name: str
    kind: str
    needs: frozenset[str]
    not_after: float


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as an operator sees it: what it advertised, whether it drains,
    when it was last seen, and the lease it holds (``run_id`` and its
    ``not_after``, both None when it is free)."""

    node_id: str
    name: str
    caps: frozenset[str]
    draining: bool
    last_seen: float
    run_id: str | None
    not_after: float | None


@dataclass(frozen=True, slots=True)
class StepView:
    """A step as stored; ``node`` is ``""`` until the run is placed;
    ``output`` is what its node reported with it (decoded JSON), if any."""

    seq: int
    name: str
    kind: str
    needs: frozenset[str]
    state: StepState
    node: str
    output: Any = None


def _step_dict(step: StepView) -> dict[str, Any]:
    """A step in the wire view; ``output`` only once a node reported one."""
    out: dict[str, Any] = {
        "seq": step.seq,
        "name": step.name,
        "state": step.state,
        "node": step.node,
    }
    if step.output is not None:
        out["output"] = step.output
    return out


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as stored. Times are epoch seconds (None until they happen)."""

    run_id: str
    state: RunState
    reason: str | None
    steps: tuple[StepView, ...]
    warnings: tuple[str, ...]
    created_at: float
    started_at: float | None
    ended_at: float | None
    assigned: tuple[Assigned, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The wire view, the same for submit and get. ``assigned`` appears
        once the run is placed and ``reject`` once it failed."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "state": self.state,
            "steps": [_step_dict(s) for s in self.steps],
            "warnings": list(self.warnings),
        }
        if self.assigned:
            out["assigned"] = [
                {"seq": a.seq, "node_id": a.node_id, "node_name": a.node_name}
                for a in self.assigned
            ]
        if self.state == RunState.FAILED and self.reason:
            out["reject"] = self.reason
        return out


@dataclass(frozen=True, slots=True)
class NewJobs:
    """New jobs of ``owner`` to store in one transaction
    (``jobs.create_jobs``): each its id and refs, in this order, with
    its name in ``names``, its trace context in ``traces``, its
    idempotency key in ``keys`` (each None, or one per job), submitted
    through runner ``runner_id`` (if any). Given ``lease_for``, the first
    ``leased`` (None: all) are leased to that runner for so many seconds,
    the others wait for any runner with room; given ``later``, all are
    deferred until it allows, and none is leased."""

    owner: str
    jobs: Sequence[tuple[str, Sequence[str]]]
    runner_id: str | None = None
    lease_for: float | None = None
    leased: int | None = None
    names: Sequence[str | None] | None = None
    traces: Sequence[str | None] | None = None
    keys: Sequence[str | None] | None = None
    later: Later | None = None

    @property
    def held(self) -> int:
        """How many of them, the first, are leased to the runner."""
        if self.runner_id is None or self.lease_for is None or self.later is not None:
            return 0
        return len(self.jobs) if self.leased is None else self.leased

    @property
    def wait_for_room(self) -> bool:
        """Whether any of them waits for a runner with room (and the
        runners are to be told)."""
        return self.later is None and self.held < len(self.jobs)


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run to queue in one round trip (``Database.queue_run``): checked,
    and judged against the fleet of ``generation`` the caller knows. The
    store queues it only if that is still the fleet, the run id is free and
    no node is free (else the caller submits it the usual way)."""

    run_id: str
    #: The fleet the caller judged by (``node_generation``).
    generation: int
    #: Whether a free node would be taken at once (a store with leases).
    may_place: bool
    #: Whether the run could be placed with every node free.
    placeable: bool
    #: Its steps, as JSON: an array of objects with ``seq``, ``name``,
    #: ``kind`` and ``needs`` (itself the JSON text the step keeps).
    steps: str
    #: Its warnings and the steps of its Record, as JSON.
    warnings: str
    record: str
