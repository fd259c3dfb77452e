"""``Store``: the handle users and the runner hold. Each method is one
transaction, handed to the module that owns the operation."""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from . import jobs, leases, nodes, queue, record, runs
from .db import Database, Synchronous
from .errors import StoreError
from .jobs import JobRow, JobSummary, Lease, Stored, TargetOutcome
from .leases import Beat
from .schema import JobStatus
from .shapes import RUN_STATES, Advert, Claim, NodeView, RunView, Step

__all__ = ["Store", "open"]

log = logging.getLogger("store")


class Store:
    """A store file, opened. Safe to share between threads; several ``Store``
    objects, in one process or several, may open the same file.

    Use :func:`open` to get one. Closing is idempotent; a closed store raises
    ``StoreError`` on every call.
    """

    def __init__(self, db: Database, *, lease_ttl: float, max_leases_per_run: int) -> None:
        self._db = db
        self.lease_ttl = lease_ttl
        self.max_leases_per_run = max_leases_per_run

    @property
    def path(self) -> str:
        """The file this store was opened on."""
        return self._db.path

    def close(self) -> None:
        """Close the file. Idempotent."""
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

    # -- batch jobs ---------------------------------------------------------

    def create_job(
        self,
        job_id: str,
        owner: str,
        refs: Sequence[str],
        runner_id: str | None = None,
        *,
        lease_for: float | None = None,
    ) -> None:
        """Store a new job, ``queued``, with its targets ``pending`` in order,
        submitted through runner ``runner_id``; given ``lease_for``, leased
        to that runner for so many seconds (token 1), else waiting for any
        runner with room."""
        with self._db.transaction() as conn:
            now = time.time()
            until = None if lease_for is None else now + lease_for
            jobs.create_job(conn, job_id, owner, refs, now, runner_id=runner_id, lease_until=until)

    def set_job_status(self, job_id: str, status: str, lease: Lease | None = None) -> bool:
        """Move a live job to ``status``; False if it is gone, already terminal
        or (given ``lease``) held by another."""
        with self._db.transaction() as conn:
            return jobs.set_job_status(conn, job_id, status, time.time(), lease)

    def cancel_job(self, job_id: str, owner: str) -> bool:
        """Cancel ``owner``'s live job, whichever runner holds it; False if
        there is no such live job."""
        with self._db.transaction() as conn:
            return jobs.cancel_job(conn, job_id, owner, time.time())

    def job_status(self, job_id: str, owner: str) -> JobStatus | None:
        """The status of ``owner``'s job, or None if there is none."""
        with self._db.transaction(write=False) as conn:
            return jobs.job_status(conn, job_id, owner)

    def store_target(
        self,
        job_id: str,
        pos: int,
        status: str,
        *,
        result: str | None = None,
        error: str | None = None,
        hint: str | None = None,
        max_bytes: int | None = None,
        job_status: str | None = None,
    ) -> list[str]:
        """Store one target's outcome; then, given ``job_status``, move the job
        to it; then, given ``max_bytes``, evict terminal jobs past that
        budget. All in one transaction; returns the evicted ids.

        Raises ``NotFound`` if the job is gone, ``Conflict`` if the target was
        already stored; nothing is written then.
        """
        outcome = TargetOutcome(job_id, pos, status, result, error, hint, job_status)
        with self._db.transaction() as conn:
            stored = _store_targets(conn, [outcome], max_bytes)
            if stored.refused:
                raise stored.refused[0]  # rolls the transaction back
            return stored.evicted

    def store_targets(
        self,
        outcomes: Sequence[TargetOutcome],
        *,
        max_bytes: int | None = None,
        starting: Sequence[tuple[str, Lease | None]] = (),
    ) -> Stored:
        """Store several targets' outcomes in one transaction (one commit for
        all: what a busy runner needs), end the jobs whose outcome carries a
        ``job_status``, then, given ``max_bytes``, evict terminal jobs past
        that budget. An outcome the store refuses (its job gone, its lease
        another's, its target stored already) does not stop the others.
        First, the ``starting`` jobs (id and lease) still ``queued`` become
        ``running``."""
        with self._db.transaction() as conn:
            jobs.start_jobs(conn, starting, time.time())
            return _store_targets(conn, outcomes, max_bytes)

    def get_job(self, job_id: str, owner: str) -> JobRow | None:
        """The job and its targets, or None if ``owner`` has no such job."""
        with self._db.transaction(write=False) as conn:
            return jobs.get_job(conn, job_id, owner)

    def find_job(self, job_id: str) -> JobRow | None:
        """The job and its targets whoever owns it, or None: for an operator's
        tools. A service answering its callers uses :meth:`get_job`."""
        with self._db.transaction(write=False) as conn:
            return jobs.find_job(conn, job_id)

    def list_jobs(self, *, owner: str | None = None, status: str | None = None) -> list[JobSummary]:
        """Every stored job, in creation order, with its target counts; only
        ``owner``'s, or only those in ``status``, when given."""
        with self._db.transaction(write=False) as conn:
            return jobs.list_jobs(conn, owner=owner, status=status)

    def touch_job(self, job_id: str, owner: str) -> bool:
        """Mark the job used now, so eviction takes it last; False if unknown."""
        with self._db.transaction() as conn:
            return jobs.touch_job(conn, job_id, owner, time.time())

    def evict(self, max_bytes: int) -> list[str]:
        """Evict terminal jobs, least recently touched first, down to ``max_bytes``."""
        with self._db.transaction() as conn:
            return jobs.evict(conn, max_bytes)

    def interrupt_job(
        self, job_id: str, hint: str, lease: Lease | None = None
    ) -> tuple[str, int] | None:
        """End a live job no runner will go on with (pending targets ``failed``,
        error ``interrupted``); return its terminal status and how many
        targets that failed, or None if it is not live (or not held with
        ``lease``)."""
        with self._db.transaction() as conn:
            return jobs.interrupt(conn, job_id, hint, time.time(), lease)

    # -- batch runners ---------------------------------------------------------

    def register_runner(self, runner_id: str, lapse: float = 5.0) -> None:
        """Record a runner of this process as alive, its leases ``lapse``
        seconds long (it is gone once silent for that long)."""
        with self._db.transaction() as conn:
            leases.register(conn, runner_id, time.time(), lapse)

    def beat_runner(
        self,
        runner_id: str,
        lapse: float,
        *,
        room: int | None = None,
        foreign: bool = False,
        keep: Sequence[str] = (),
    ) -> Beat:
        """One beat of the runner: renew its leases for ``lapse`` seconds and
        take jobs no live runner holds (see ``leases.beat``)."""
        with self._db.transaction() as conn:
            return leases.beat(
                conn, runner_id, time.time(), lapse, room=room, foreign=foreign, keep=keep
            )

    def halted_jobs(self, runner_id: str) -> list[str]:
        """Ids of the jobs leased to the runner that are terminal already
        (cancelled through another runner)."""
        with self._db.transaction(write=False) as conn:
            return leases.halted(conn, runner_id)

    def retire_runner(self, runner_id: str) -> None:
        """The runner closed: its leases are released, and the next runner
        with room takes its live jobs at once."""
        with self._db.transaction() as conn:
            leases.retire(conn, runner_id)

    def total_bytes(self) -> int:
        """The stored bytes of every job, live and terminal."""
        with self._db.transaction(write=False) as conn:
            return jobs.total_bytes(conn)

    # -- nodes ---------------------------------------------------------------

    def advertise(self, advert: Advert) -> None:
        """Add a node, or replace a known node's name and caps; wakes the queue."""
        with self._db.transaction() as conn:
            nodes.advertise(conn, advert, time.time())
        self._wake(f"advertise {advert.node_id}")

    def drain(self, node_id: str) -> None:
        """Let the node finish the run it holds and place no new run on it."""
        with self._db.transaction() as conn:
            nodes.set_draining(conn, node_id, True)

    def undrain(self, node_id: str) -> None:
        """Let the node take runs again; wakes the queue."""
        with self._db.transaction() as conn:
            nodes.set_draining(conn, node_id, False)
        self._wake(f"undrain {node_id}")

    def list_nodes(self) -> list[NodeView]:
        """Every advertised node, by id, with the lease it holds if busy."""
        with self._db.transaction(write=False) as conn:
            return nodes.list_nodes(conn)

    def unavailable_nodes(self) -> set[str]:
        """Nodes no run may be placed on now: busy (leased) or draining."""
        with self._db.transaction(write=False) as conn:
            return nodes.unavailable(conn)

    # -- runs ----------------------------------------------------------------

    def submit_run(self, steps: Iterable[Step], run_id: str | None = None) -> RunView:
        """Store a run: RUNNING if every step can be placed now, else QUEUED.
        Raises ``InvalidRun``, ``Conflict`` (run id in use) or ``Unsatisfiable``;
        nothing is stored then."""
        with self._db.transaction() as conn:
            return runs.submit(
                conn,
                steps,
                run_id,
                now=time.time(),
                lease_ttl=self.lease_ttl,
                max_leases=self.max_leases_per_run,
            )

    def get_run(self, run_id: str) -> RunView:
        """The run as stored; ``NotFound`` if there is none."""
        with self._db.transaction(write=False) as conn:
            return runs.get(conn, run_id)

    def list_runs(self, state: str | None = None) -> list[RunView]:
        """Runs in FIFO order (``created_at``, then id), of one state or all."""
        if state is not None and state not in RUN_STATES:
            raise ValueError(f"state must be one of {', '.join(RUN_STATES)}, not {state!r}")
        with self._db.transaction(write=False) as conn:
            return [runs.get(conn, run_id) for run_id in runs.list_ids(conn, state)]

    def wake_queued(self, why: str = "") -> list[str]:
        """Promote, in FIFO order, every QUEUED run that fits now; return their ids."""
        with self._db.transaction() as conn:
            promoted = queue.wake(conn, time.time(), self.lease_ttl, self.max_leases_per_run)
        log.info("wake (%s): promoted %d run(s) %s", why or "asked", len(promoted), promoted)
        return promoted

    def claim_step(self, node_id: str) -> Claim | None:
        """The next step this node may run, now RUNNING (its lease renewed), or None."""
        with self._db.transaction() as conn:
            return runs.claim(conn, node_id, time.time(), self.lease_ttl)

    def report_step(
        self, node_id: str, run_id: str, seq: int, ok: bool = True, output: object = None
    ) -> RunView:
        """Record how a step the node holds ended; wakes the queue if that
        freed a node. ``Conflict`` if the node does not hold that RUNNING step."""
        with self._db.transaction() as conn:
            freed = runs.report(conn, node_id, run_id, seq, ok=ok, output=output, now=time.time())
            view = runs.get(conn, run_id)
        if freed:
            self._wake(f"report {run_id}/{seq} by {node_id}")
        return view

    def heartbeat(self, node_id: str) -> float | None:
        """Extend the node's lease by ``lease_ttl``; the new end, or None if it holds none."""
        with self._db.transaction() as conn:
            return runs.heartbeat(conn, node_id, time.time(), self.lease_ttl)

    def reap(self, now: float | None = None) -> list[str]:
        """Fail the runs holding a lease expired by ``now``; wakes the queue if any."""
        with self._db.transaction() as conn:
            failed = runs.reap(conn, time.time() if now is None else now)
        if failed:
            self._wake(f"reap {len(failed)} run(s)")
        return failed

    def cancel_run(self, run_id: str) -> bool:
        """Fail a QUEUED or RUNNING run as ``cancelled`` (its Record sealed);
        False for an unknown or terminal run. Wakes the queue."""
        with self._db.transaction() as conn:
            cancelled = runs.cancel(conn, run_id, time.time())
        if cancelled:
            self._wake(f"cancel {run_id}")
        return cancelled

    def record(self, run_id: str) -> dict[str, Any]:
        """The run's Record; sealed (with its digest) once the run ended."""
        with self._db.transaction(write=False) as conn:
            return record.get_record(conn, run_id)

    def _wake(self, why: str) -> None:
        """Wake the queue after an event that may have freed capacity. The event
        is committed already: a wake that fails is logged, not raised."""
        try:
            self.wake_queued(why)
        except StoreError:
            log.exception("wake (%s) failed; the next event will wake the queue", why)


def _store_targets(
    conn: sqlite3.Connection, outcomes: Sequence[TargetOutcome], max_bytes: int | None
) -> Stored:
    """Store the outcomes, end the jobs, evict past ``max_bytes``: in this
    order, so that the budget holds once the commit is made. The jobs just
    ended were touched last, so they go last."""
    now = time.time()
    refused, cancelled = jobs.store_targets(conn, outcomes, now)
    ended = jobs.end_jobs(conn, outcomes, refused, now)
    evicted = [] if max_bytes is None else jobs.evict(conn, max_bytes)
    return Stored(refused, ended, evicted, cancelled)


def open(
    path: str | Path,
    *,
    lease_ttl: float = 30.0,
    max_leases_per_run: int = 4,
    synchronous: Synchronous = "NORMAL",
    readonly: bool = False,
) -> Store:
    """Open (creating or migrating) the store file at ``path``, then wake the
    queue (capacity may have freed while no one had it open).

    ``readonly=True`` opens an existing store for reading only: nothing is
    created, migrated or woken, and every writing method raises ``StoreError``.

    ``lease_ttl``: seconds a lease lasts unless renewed; 0 places no run.
    ``max_leases_per_run``: the most nodes one run may hold.
    ``synchronous="NORMAL"`` (the default) survives a crash of the process;
    ``"FULL"`` also survives power loss, at the cost of an fsync per commit.
    Raises ``StoreError`` if the file cannot be used, naming it.
    """
    if not isinstance(lease_ttl, int | float) or isinstance(lease_ttl, bool):
        raise TypeError(f"lease_ttl is a number of seconds, not {type(lease_ttl).__name__}")
    if not math.isfinite(lease_ttl) or lease_ttl < 0:
        raise ValueError(f"lease_ttl must be a finite number of seconds >= 0, not {lease_ttl}")
    if not isinstance(max_leases_per_run, int) or isinstance(max_leases_per_run, bool):
        raise TypeError(f"max_leases_per_run is an int, not {type(max_leases_per_run).__name__}")
    if max_leases_per_run < 1:
        raise ValueError(f"max_leases_per_run must be at least 1, not {max_leases_per_run}")
    db = Store(
        Database(path, synchronous=synchronous, readonly=readonly),
        lease_ttl=lease_ttl,
        max_leases_per_run=max_leases_per_run,
    )
    if not readonly:
        db._wake("open")
    return db
