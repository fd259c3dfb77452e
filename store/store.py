"""``Store``: the handle a user holds. Each method is one transaction,
handed to the module that owns the operation. What only a runner calls is
``store.ledger.Ledger``'s."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from . import events, gauges, jobs, runs
from .engines import CANCELLED, Database, Synchronous, Tracer, Tx
from .engines.sqlite import SQLiteDatabase
from .errors import StoreError
from .jobs import pauses, runners, upstreams
from .ledger import Ledger
from .runs import nodes, queue, record, waiting
from .runs.explain import explain as explain_run
from .shapes import (
    Advert,
    Claim,
    Gauges,
    JobRow,
    JobSummary,
    NodeView,
    Paused,
    RunView,
    Step,
    TargetRow,
    UpstreamView,
    Whereabouts,
)
from .states import TERMINAL_JOB, JobStatus, RunState

__all__ = ["Store", "open"]

log = logging.getLogger("store")

#: On SQLite, whose writers take turns on the file (``Store.prune``): the
#: jobs one batch of a prune deletes (holding the lock some 10 ms).
PRUNE_BATCH_ONE_WRITER = 100
#: The seconds a prune rests between batches, on any engine (longer than
#: the longest sleep of a writer waiting for SQLite's lock).
PRUNE_REST = 0.1


class Store:
    """A store, opened: a file, or a PostgreSQL database. Safe to share
    between threads; several ``Store`` objects, in one process or several
    (on PostgreSQL, on several hosts), may open the same store.

    Each method is one transaction (:meth:`Database.write` or ``read``),
    and takes its time from the transaction: the store's one clock.

    Use :func:`open` to get one. Closing is idempotent; a closed store raises
    ``StoreError`` on every call.
    """

    def __init__(
        self,
        db: Database,
        *,
        lease_ttl: float,
        max_leases_per_run: int,
        reserve_after: float | None,
    ) -> None:
        self._db = db
        self._ledger = Ledger(self)
        self._feed = events.Feed(db)
        self._fleets = nodes.Fleets()
        self._reserved = waiting.Reservations()
        self.lease_ttl = lease_ttl
        self.max_leases_per_run = max_leases_per_run
        self.reserve_after = reserve_after

    @property
    def path(self) -> str:
        """The file this store was opened on, or its URL (without a password)."""
        return self._db.path

    @property
    def tracer(self) -> Tracer | None:
        """Called with each statement the store runs from now on, as written
        (``?`` placeholders), and its parameters (for a statement run once
        per row, the list of every row's), before it runs; None (the
        default) for none. For seeing what a call costs::

            db.tracer = lambda sql, params: print(sql, params)
        """
        return self._db.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        if tracer is not None and not callable(tracer):
            raise TypeError(f"a tracer is callable or None, not {type(tracer).__name__}")
        self._db.tracer = tracer

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._feed.close()
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<store.Store {self.path!r}>"

    # -- events ---------------------------------------------------------------

    def watch(self, since: int | None = None, timeout: float | None = None) -> events.Watch:
        """What happens on the store from now on (or after the event
        numbered ``since``), from every process and host, in commit order:
        an iterator of ``Event``, each yielded once its change committed.
        It ends once ``timeout`` seconds pass without an event (None: never;
        close it, or leave the loop, to stop sooner). A watch seeing
        ``event`` may stop and resume with ``since=event.seq``, missing
        nothing, for as long as the store keeps events (``events.KEPT``
        seconds); after that it raises ``EventsPruned``.

        A new event is seen within ``events.POLL`` seconds (PostgreSQL: as
        its notice arrives). On PostgreSQL a watch from now does not see
        the events of a transaction already in flight when this store's
        reader began, if they are numbered below where it began. Every
        watcher of one ``Store`` shares one reader of the store. Raises
        ``StoreError`` if the store cannot be read (the watch ends; resume
        from its ``seq``), and when the store closes."""
        return self._feed.watch(since, timeout)

    def gauges(self) -> Gauges:
        """The store's gauges, for a scrape: jobs by status, QUEUED runs and
        the oldest one's wait, nodes busy and draining. A few rows read,
        however many jobs the store holds (the counts are kept as jobs
        change)."""
        return self._db.read(gauges.read)

    # -- batch jobs ---------------------------------------------------------

    def cancel_job(self, job_id: str, owner: str) -> bool:
        """Cancel ``owner``'s live job, whichever runner holds it; False if
        there is no such live job."""

        def cancel(tx: Tx) -> bool:
            cancelled = jobs.cancel_job(tx, job_id, owner, tx.now)
            if cancelled:
                tx.notify(CANCELLED + job_id)
            return cancelled

        return self._db.write(cancel, fenced=True)

    def job_status(self, job_id: str, owner: str) -> JobStatus | None:
        """The status of ``owner``'s job, or None if there is none."""
        return self._db.read(lambda tx: jobs.job_status(tx, job_id, owner))

    def get_job(self, job_id: str, owner: str) -> JobRow | None:
        """The job and its targets, or None if ``owner`` has no such job."""
        return self._db.read(lambda tx: jobs.get_job(tx, job_id, owner))

    def find_job(self, job_id: str) -> JobRow | None:
        """The job and its targets whoever owns it, or None: for an operator's
        tools. A service answering its callers uses :meth:`get_job`."""
        return self._db.read(lambda tx: jobs.find_job(tx, job_id))

    def whereabouts(self, job_id: str) -> Whereabouts | None:
        """Where the job stands, whoever owns it, from one snapshot: the job,
        who holds it and whether that runner is alive, how many runners are
        open, what is paused, the upstreams paced (``batch-runner explain``
        and ``Runner.explain`` read it). None if it is not stored."""
        return self._db.read(lambda tx: runners.whereabouts(tx, job_id))

    def find_targets(
        self, job_id: str, *, start: int = 0, limit: int | None = None
    ) -> tuple[TargetRow, ...]:
        """The targets of a job, whoever owns it, from position ``start`` on,
        at most ``limit`` (None: all): what a view following a long job reads
        to see what was stored since its last look; none for no such job."""
        return self._db.read(lambda tx: jobs.find_targets(tx, job_id, start, limit))

    def list_jobs(
        self,
        *,
        owner: str | None = None,
        status: JobStatus | None = None,
        ids: Sequence[str] | None = None,
        newest: int | None = None,
    ) -> list[JobSummary]:
        """Every stored job, in creation order, with its target counts; only
        ``owner``'s, those in ``status``, or those of ``ids``, when given;
        only the ``newest`` so many (without ``ids``), when given. Reads
        one row per job listed, however many targets they hold."""
        if newest is not None and (not isinstance(newest, int) or newest < 0):
            raise ValueError(f"newest is a count of jobs >= 0, not {newest!r}")
        return self._db.read(
            lambda tx: jobs.list_jobs(tx, owner=owner, status=status, ids=ids, newest=newest)
        )

    def touch_job(self, job_id: str, owner: str) -> bool:
        """Mark the job used now, so eviction takes it last; False if unknown."""
        return self._db.write(lambda tx: jobs.touch_job(tx, job_id, owner, tx.now), fenced=True)

    def evict(self, max_bytes: int) -> list[str]:
        """Evict terminal jobs, least recently touched first, down to ``max_bytes``."""
        return self._db.write(lambda tx: jobs.evict(tx, max_bytes), fenced=True)

    def prune(
        self,
        older_than: float,
        statuses: Iterable[str] | None = None,
        *,
        limit: int | None = None,
    ) -> int:
        """Delete the jobs that ended (in one of ``statuses``; None: any
        terminal status) more than ``older_than`` seconds ago, by the
        store's clock, with their targets: those that ended first first, at
        most ``limit`` of them (None: every one). In transactions of at most
        ``jobs.PRUNE_BATCH`` jobs (on SQLite, whose writers take turns on
        the file, ``PRUNE_BATCH_ONE_WRITER``), each short, ``PRUNE_REST``
        seconds apart, beside any writer, so that writers get their turn: a
        live job is never pruned, and a job another transaction holds is
        passed over. Returns how many were deleted. ``TypeError`` or
        ``ValueError`` for a bad age, status or limit."""
        wanted = _ended_statuses(statuses)
        age = _seconds("older_than", older_than)
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            raise TypeError(f"limit is an int or None, not {type(limit).__name__}")
        pruned = 0
        most = PRUNE_BATCH_ONE_WRITER if self._db.one_writer else jobs.PRUNE_BATCH
        for status in wanted:
            while limit is None or pruned < limit:
                if pruned:
                    # Others get their turn between batches: on SQLite the
                    # file's lock (a runner waiting in SQLite's busy handler
                    # sleeps up to 0.1 s between tries), on any engine the
                    # cores the store's server shares with the runners.
                    time.sleep(PRUNE_REST)
                batch = most if limit is None else min(most, limit - pruned)
                got = self._db.write(
                    functools.partial(jobs.prune, status=status, older_than=age, limit=batch),
                    fenced=True,
                )
                pruned += got
                if got < batch:
                    break
        return pruned

    # -- pauses and upstreams ---------------------------------------------------

    def pause(
        self,
        *,
        caller: str | None = None,
        upstream: str | None = None,
        known: Iterable[str] = (),
    ) -> None:
        """Pause the caller with id ``caller`` and the upstream ``upstream``
        (whichever are given): no runner of the store starts a new target
        for that caller, or of that upstream, from within a tenth of a
        second (a runner that pauses, at once), until unpaused. Pausing what
        is paused changes nothing (it keeps the time it was first paused).

        ``upstream`` is an upstream's name, or for one named after a URL's
        origin (``scheme://host:port``) its host, ``host:port`` or a URL of
        it: a host pauses each of its upstreams. ``UnknownUpstream``, and
        nothing paused, if it matches none that a runner of the store has
        paced, nor any of ``known``."""
        given = _paused_names(caller, upstream)
        also = list(known)

        self._db.write(
            lambda tx: [pauses.pause(tx, kind, name, also) for kind, name in given], fenced=True
        )

    def unpause(self, *, caller: str | None = None, upstream: str | None = None) -> None:
        """Undo :meth:`pause` for whichever are given, by the name it was
        paused by (nothing for one not paused): runners start their targets
        again within a tenth of a second."""
        given = _paused_names(caller, upstream)
        self._db.write(
            lambda tx: [pauses.unpause(tx, kind, name) for kind, name in given], fenced=True
        )

    def paused(self) -> Paused:
        """What is paused now, with when each was."""
        return self._db.read(pauses.read)

    def upstreams(self) -> list[UpstreamView]:
        """Every upstream a busy answer holds now, or a live runner wants,
        by name, with the shares the runners hold."""
        return self._db.read(upstreams.view)

    # -- nodes ---------------------------------------------------------------

    def advertise(self, advert: Advert) -> None:
        """Add a node, or replace a known node's name and caps; wakes the queue."""
        self._db.write(lambda tx: nodes.advertise(tx, advert, tx.now))
        self._wake(f"advertise {advert.node_id}")

    def drain(self, node_id: str) -> None:
        """Let the node finish the run it holds and place no new run on it."""
        self._db.write(lambda tx: nodes.set_draining(tx, node_id, True))

    def undrain(self, node_id: str) -> None:
        """Let the node take runs again; wakes the queue."""
        self._db.write(lambda tx: nodes.set_draining(tx, node_id, False))
        self._wake(f"undrain {node_id}")

    def list_nodes(self) -> list[NodeView]:
        """Every advertised node, by id, with the lease it holds if busy."""
        return self._db.read(nodes.list_nodes)

    def unavailable_nodes(self) -> set[str]:
        """Nodes no run may be placed on now: busy (leased) or draining."""
        return self._db.read(nodes.unavailable)

    # -- runs ----------------------------------------------------------------

    def submit_run(self, steps: Iterable[Step], run_id: str | None = None) -> RunView:
        """Store a run: RUNNING if every step can be placed now, else QUEUED.
        Raises ``InvalidRun``, ``Conflict`` (run id in use) or ``Unsatisfiable``;
        nothing is stored then."""
        checked, warnings = runs.check_steps(steps)  # once: steps may be an iterator
        new_id = runs.new_id(run_id)
        queued = runs.queue_waiting(
            self._db,
            self._fleets,
            checked,
            warnings,
            new_id,
            lease_ttl=self.lease_ttl,
            max_leases=self.max_leases_per_run,
        )
        if queued is not None:
            return queued
        return self._db.write(
            lambda tx: runs.submit(
                tx,
                checked,
                warnings,
                new_id,
                lease_ttl=self.lease_ttl,
                max_leases=self.max_leases_per_run,
                fleets=self._fleets,
                reserve_after=self.reserve_after,
                reserved=self._reserved,
            )
        )

    def get_run(self, run_id: str) -> RunView:
        """The run as stored; ``NotFound`` if there is none."""
        return self._db.read(lambda tx: runs.get(tx, run_id))

    def list_runs(self, state: RunState | None = None) -> list[RunView]:
        """Runs in FIFO order (``created_at``, then id), of one state or all."""
        if state is not None and state not in tuple(RunState):
            raise ValueError(f"state must be one of {', '.join(RunState)}, not {state!r}")
        return self._db.read(
            lambda tx: [runs.get(tx, run_id) for run_id in runs.list_ids(tx, state)]
        )

    def wake_queued(self, why: str = "") -> list[str]:
        """Promote, in FIFO order, every QUEUED run that fits now (and is not
        behind a run reserving the nodes it would take); return their ids."""
        promoted = self._db.write(
            lambda tx: queue.wake(
                tx,
                tx.now,
                lease_ttl=self.lease_ttl,
                max_leases=self.max_leases_per_run,
                fleets=self._fleets,
                reserve_after=self.reserve_after,
            )
        )
        log.info("wake (%s): promoted %d run(s) %s", why or "asked", len(promoted), promoted)
        return promoted

    def claim_step(self, node_id: str) -> Claim | None:
        """The next step this node may run, now RUNNING (its lease renewed), or None."""
        return self._db.write(lambda tx: runs.claim(tx, node_id, tx.now, self.lease_ttl))

    def report_step(
        self, node_id: str, run_id: str, seq: int, ok: bool = True, output: object = None
    ) -> RunView:
        """Record how a step the node holds ended; wakes the queue if that
        freed a node. ``Conflict`` if the node does not hold that RUNNING step."""

        def report(tx: Tx) -> tuple[bool, RunView]:
            freed = runs.report(tx, node_id, run_id, seq, ok=ok, output=output, now=tx.now)
            return freed, runs.get(tx, run_id)

        freed, view = self._db.write(report)
        if freed:
            self._wake(f"report {run_id}/{seq} by {node_id}")
        return view

    def heartbeat(self, node_id: str) -> float | None:
        """Extend the node's lease by ``lease_ttl``; the new end, or None if it holds none."""
        return self._db.write(lambda tx: runs.heartbeat(tx, node_id, tx.now, self.lease_ttl))

    def reap(self, now: float | None = None) -> list[str]:
        """Fail the runs holding a lease expired by ``now``; wakes the queue if any."""
        failed = self._db.write(lambda tx: runs.reap(tx, tx.now if now is None else now))
        if failed:
            self._wake(f"reap {len(failed)} run(s)")
        return failed

    def cancel_run(self, run_id: str) -> bool:
        """Fail a QUEUED or RUNNING run as ``cancelled`` (its Record sealed);
        False for an unknown or terminal run. Wakes the queue."""
        cancelled = self._db.write(lambda tx: runs.cancel(tx, run_id, tx.now))
        if cancelled:
            self._wake(f"cancel {run_id}")
        return cancelled

    def record(self, run_id: str) -> dict[str, Any]:
        """The run's Record; sealed (with its digest) once the run ended."""
        return self._db.read(lambda tx: record.get_record(tx, run_id))

    def explain(self, run_id: str) -> dict[str, Any]:
        """Why the run waits (or waited): its place in the queue, the runs
        ahead of it, how long it waited, and for each step the nodes whose
        caps cover it and why each cannot take it now. ``NotFound`` if
        there is no such run. See :func:`store.runs.explain.explain` for the keys."""
        return self._db.read(
            lambda tx: explain_run(tx, run_id, self.max_leases_per_run, self.reserve_after)
        )

    def _wake(self, why: str) -> None:
        """Wake the queue after an event that may have freed capacity. The event
        is committed already: a wake that fails is logged, not raised."""
        try:
            self.wake_queued(why)
        except StoreError:
            log.exception("wake (%s) failed; the next event will wake the queue", why)


#: The defaults of :func:`open`'s placement settings, which the operator's
#: command line shows and takes too.
LEASE_TTL = 30.0
MAX_LEASES_PER_RUN = 4
RESERVE_AFTER: float | None = 600.0


def open(
    path: str | Path,
    *,
    lease_ttl: float = LEASE_TTL,
    max_leases_per_run: int = MAX_LEASES_PER_RUN,
    reserve_after: float | None = RESERVE_AFTER,
    synchronous: Synchronous = "NORMAL",
    readonly: bool = False,
    clock: Callable[[], float] | None = None,
    listen: str | None = None,
) -> Store:
    """Open (creating or migrating) the store at ``path``, then wake the
    queue (capacity may have freed while no one had it open).

    ``path`` is a file (SQLite, the default: nothing to install or start),
    or a ``postgresql://`` (or ``postgres://``) URL: a libpq connection URI
    naming a database, which needs ``pip install 'batch-store[postgres]'``.
    On PostgreSQL the store keeps its tables in the connection's current
    schema (``public`` unless the URL's ``options`` set ``search_path``).

    ``readonly=True`` opens an existing store for reading only: nothing is
    created, migrated or woken, and every writing method raises ``StoreError``.

    ``lease_ttl``: seconds a lease lasts unless renewed; 0 places no run.
    ``max_leases_per_run``: the most nodes one run may hold.
    ``reserve_after``: seconds a QUEUED run waits before it reserves the
    nodes it could use, so that runs behind it that fit no longer take
    them as they free; it starts once the runs then on them end (and the
    runs reserving ahead of it have started). The setting of each open
    store, like ``lease_ttl``: give every process the same. None: never
    (the queue promotes every later run that fits, and a big run behind a
    stream of small ones may wait for ever).
    ``synchronous="NORMAL"`` (the default) survives a crash of the process;
    ``"FULL"`` also survives power loss, at the cost of an fsync per commit.
    (PostgreSQL commits survive both; the server's ``synchronous_commit``
    decides.) Raises ``StoreError`` if the store cannot be used, naming it.
    ``clock``: what the store reads for the time of each transaction
    (seconds since the epoch), in place of the host's clock (SQLite) or the
    server's (PostgreSQL): for tests that step time. Every process on one
    store must read the same clock; leave it None in production.

    ``listen`` (PostgreSQL): a ``postgresql://`` URL of the same database
    that reaches the server directly, or through a session-mode pool, where
    the store LISTENs for the notices that tell it at once of cancels, jobs
    waiting for room and events (``docs/howto-scale-out.md``, poolers).
    Without it the store listens through ``path``, and checks that it
    hears: through a transaction pooler it does not, says so once in the
    log, and reads the store for news instead (every 0.05 s while
    something watches the store, 0.1 s for a runner's cancels).
    """
    if not isinstance(lease_ttl, int | float) or isinstance(lease_ttl, bool):
        raise TypeError(f"lease_ttl is a number of seconds, not {type(lease_ttl).__name__}")
    if not math.isfinite(lease_ttl) or lease_ttl < 0:
        raise ValueError(f"lease_ttl must be a finite number of seconds >= 0, not {lease_ttl}")
    if not isinstance(max_leases_per_run, int) or isinstance(max_leases_per_run, bool):
        raise TypeError(f"max_leases_per_run is an int, not {type(max_leases_per_run).__name__}")
    if max_leases_per_run < 1:
        raise ValueError(f"max_leases_per_run must be at least 1, not {max_leases_per_run}")
    if reserve_after is not None:
        if not isinstance(reserve_after, int | float) or isinstance(reserve_after, bool):
            raise TypeError(
                f"reserve_after is a number of seconds or None, not {type(reserve_after).__name__}"
            )
        if not math.isfinite(reserve_after) or reserve_after < 0:
            raise ValueError(
                f"reserve_after must be a finite number of seconds >= 0, or None,"
                f" not {reserve_after}"
            )
    if clock is not None and not callable(clock):
        raise TypeError(f"clock is a function that returns the time, not {type(clock).__name__}")
    if listen is not None and not (
        isinstance(listen, str) and listen.startswith(("postgresql://", "postgres://"))
    ):
        raise ValueError(f"listen is a postgresql:// URL, not {listen!r}")
    if listen is not None and not (
        isinstance(path, str) and path.startswith(("postgresql://", "postgres://"))
    ):
        raise ValueError("listen is for a PostgreSQL store: an SQLite store has no notices")
    engine = _connect(path, synchronous=synchronous, readonly=readonly, listen=listen, clock=clock)
    db = Store(
        engine,
        lease_ttl=lease_ttl,
        max_leases_per_run=max_leases_per_run,
        reserve_after=reserve_after,
    )
    if not readonly:
        db._wake("open")
    return db


def _ended_statuses(statuses: Iterable[str] | None) -> list[JobStatus]:
    """The terminal statuses given (None: all), checked, each once."""
    if statuses is None:
        return list(TERMINAL_JOB)
    if isinstance(statuses, str) or not isinstance(statuses, Iterable):
        raise TypeError(f"statuses are a list of job statuses, not {type(statuses).__name__}")
    wanted = list(dict.fromkeys(statuses))
    for status in wanted:
        if status not in TERMINAL_JOB:
            raise ValueError(
                f"only jobs that ended are pruned: {status!r} is not one of"
                f" {', '.join(TERMINAL_JOB)}"
            )
    return [JobStatus(status) for status in wanted]


def _seconds(name: str, value: object) -> float:
    """``value``, checked: a finite number of seconds, at least 0."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{name} is a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} is a finite number of seconds >= 0, not {value}")
    return float(value)


def _paused_names(caller: str | None, upstream: str | None) -> list[tuple[str, str]]:
    """The kinds and names of what :meth:`Store.pause` is given, checked:
    each a non-empty str, and at least one."""
    named = zip(pauses.KINDS, (caller, upstream), strict=True)
    given = [(kind, name) for kind, name in named if name is not None]
    for kind, name in given:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{kind} is a non-empty str, not {name!r}")
    if not given:
        raise TypeError("give a caller, an upstream, or both")
    return given


def _connect(
    location: str | Path,
    *,
    synchronous: Synchronous,
    readonly: bool,
    listen: str | None,
    clock: Callable[[], float] | None,
) -> Database:
    """The engine for ``location``: PostgreSQL for a URL, else SQLite."""
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    if isinstance(location, str) and location.startswith(("postgresql://", "postgres://")):
        from .engines.postgres import PostgresDatabase  # noqa: PLC0415 (psycopg is an optional extra)

        return PostgresDatabase(location, readonly=readonly, listen=listen, clock=clock)
    return SQLiteDatabase(location, synchronous=synchronous, readonly=readonly, clock=clock)
