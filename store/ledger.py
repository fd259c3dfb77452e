"""``Ledger``: the runner's side of a store, apart from the user's ``Store``.

What a runner calls to keep its jobs in a store: create jobs and store
their targets' outcomes, hold them under leases that it renews by beating
and that another runner takes over once it falls silent, pace its
upstreams with the others, and hear of cancels. ``batch.Runner`` is one
such runner; whoever writes another holds a ``Ledger`` of the store its
jobs are in (``Ledger(db)``: as cheap as the ``Store``, and as safe to
share between threads) and keeps the rules written here:

1. A job is created ``queued`` with its targets ``pending``
   (:meth:`create_jobs`), leased to the runner that submits it or waiting
   for any runner with room.
2. Each target's outcome is stored once (:meth:`store_targets`), under
   the lease the runner holds (its fencing token): an outcome of a job
   another runner took over is refused, not stored.
3. A runner beats (:meth:`beat_runner`) more often than its ``lapse``:
   a runner silent for longer is gone, and its live jobs go to the next
   runner with room. It retires (:meth:`retire_runner`) when it closes.

Each method is one transaction, as the ``Store``'s are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import jobs
from .engines import WORK, Database, Tx, in_list
from .jobs import later, runners, upstreams
from .jobs.outcomes import record
from .schema import VERSION
from .shapes import (
    Beat,
    JobRow,
    Later,
    Lease,
    Look,
    NewJobs,
    Stored,
    TargetOutcome,
    UpstreamShare,
    UpstreamWant,
)
from .states import JobStatus, TargetState

if TYPE_CHECKING:
    from .store import Store

__all__ = ["Ledger"]


class Ledger:
    """The runner's side of ``store``: see the module's docstring."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @staticmethod
    def of(store: Store) -> Ledger:
        """The ledger of ``store`` (each ``Store`` has one)."""
        return store._ledger

    @property
    def _db(self) -> Database:
        """The store's engine, as it is now (a test may put a faulty one in its place)."""
        return self._store._db

    def __repr__(self) -> str:
        return f"<store.Ledger {self._db.path!r}>"

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
        self.create_jobs(owner, [(job_id, refs)], runner_id, lease_for=lease_for)

    def create_jobs(
        self,
        owner: str,
        new: Sequence[tuple[str, Sequence[str]]],
        runner_id: str | None = None,
        *,
        lease_for: float | None = None,
        leased: int | None = None,
        names: Sequence[str | None] | None = None,
        traces: Sequence[str | None] | None = None,
        keys: Sequence[str | None] | None = None,
        later: Later | None = None,
    ) -> list[str]:
        """Store the ``new`` jobs of ``owner`` (each its id and refs, named
        by ``names``, with the trace context of ``traces`` and the
        idempotency key of ``keys`` if given) in one transaction, in this
        order, as :meth:`create_job` does; given ``lease_for``, the first
        ``leased`` (None: all) are leased to the runner, the others wait
        for any runner with room. Given ``later``, all are deferred until
        it allows (``jobs.create_jobs``): ``NotFound`` for a job to wait
        after that ``owner`` has not, and nothing is stored.

        Returns each job's id in the store: its own, or that of the job
        ``owner`` has with its key already (stored before, by any process,
        or earlier in ``new``), and then nothing of it is stored."""

        new_jobs = NewJobs(owner, new, runner_id, lease_for, leased, names, traces, keys, later)
        return self._db.write(lambda tx: jobs.create_jobs(tx, new_jobs), fenced=True)

    def set_job_status(self, job_id: str, status: JobStatus, lease: Lease | None = None) -> bool:
        """Move a live job to ``status``; False if it is gone, already terminal
        or (given ``lease``) held by another."""
        return self._db.write(
            lambda tx: jobs.set_job_status(tx, job_id, status, tx.now, lease), fenced=True
        )

    def store_target(
        self,
        job_id: str,
        pos: int,
        status: TargetState,
        *,
        result: str | None = None,
        error: str | None = None,
        hint: str | None = None,
        max_bytes: int | None = None,
        job_status: JobStatus | None = None,
    ) -> list[str]:
        """Store one target's outcome; then, given ``job_status``, move the job
        to it; then, given ``max_bytes``, evict terminal jobs past that
        budget. All in one transaction; returns the evicted ids.

        Raises ``NotFound`` if the job is gone, ``Conflict`` if the target was
        already stored; nothing is written then.
        """
        outcome = TargetOutcome(job_id, pos, status, result, error, hint, job_status)

        def store_one(tx: Tx) -> list[str]:
            stored = record(tx, [outcome], (), max_bytes, final=False)
            if stored.refused:
                raise stored.refused[0]  # rolls the transaction back
            return stored.evicted

        return self._db.write(store_one, fenced=True)

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
        return self._db.write(lambda tx: record(tx, outcomes, starting, max_bytes), fenced=True)

    def job_leases(self, job_ids: Sequence[str]) -> dict[str, tuple[JobRow, str | None, int]]:
        """Each of these jobs that is stored, by id: the job with its
        targets, the runner holding its lease (None: no runner does) and
        the fencing token it was last leased with, all from one snapshot.

        What a runner reads to learn, rather than guess, whether it still
        holds a job: after the store refused an outcome of it (a commit
        whose answer was lost may have stored that outcome already), or
        when a beat renews the lease of a job it does not run."""

        def read(tx: Tx) -> dict[str, tuple[JobRow, str | None, int]]:
            leases: dict[str, tuple[str | None, int]] = {}
            for start in range(0, len(job_ids), 500):
                where, args = in_list("id", job_ids[start : start + 500])
                for job_id, owner, token in tx.execute(
                    f"SELECT id, lease_owner, lease_token FROM jobs WHERE {where}", args
                ):
                    leases[job_id] = (owner, token)
            return {row.id: (row, *leases[row.id]) for row in jobs.load_jobs(tx, list(leases))}

        return self._db.read(read)

    def interrupt_job(
        self, job_id: str, hint: str, lease: Lease | None = None
    ) -> tuple[JobStatus, int] | None:
        """End a live job no runner will go on with (pending targets ``failed``,
        error ``interrupted``); return its terminal status and how many
        targets that failed, or None if it is not live (or not held with
        ``lease``)."""
        return self._db.write(
            lambda tx: jobs.interrupt(tx, job_id, hint, tx.now, lease), fenced=True
        )

    def register_runner(self, runner_id: str, lapse: float = 5.0) -> None:
        """Record a runner of this process as alive, its leases ``lapse``
        seconds long (it is gone once silent for that long)."""
        self._db.write(lambda tx: runners.register(tx, runner_id, tx.now, lapse), fenced=True)

    def beat_runner(
        self,
        runner_id: str,
        lapse: float,
        *,
        room: int | None = None,
        foreign: bool = False,
        keep: Sequence[str] = (),
        release: bool = True,
    ) -> Beat:
        """One beat of the runner: renew its leases for ``lapse`` seconds and
        take jobs no live runner holds (see ``runners.beat``)."""
        return self._db.write(
            lambda tx: runners.beat(
                tx,
                runner_id,
                tx.now,
                lapse,
                room=room,
                foreign=foreign,
                keep=keep,
                release=release,
            ),
            fenced=True,
        )

    def newer_schema(self) -> int | None:
        """The version of the store's schema now if it is newer than this
        library's (``store.schema.VERSION``), else None: a runner stops
        once a newer library has stepped the schema on."""
        version = self._db.schema_version()
        return version if version > VERSION else None

    def after_of(self, job_id: str) -> list[str]:
        """The ids of the jobs ``job_id`` waits (or waited) after, in id
        order; none for a job given no ``after``, or none there is."""
        return self._db.read(lambda tx: later.after_of(tx, job_id))

    def look(self, runner_id: str, work: bool = False) -> Look:
        """What a runner looks at between its beats, in one read: the ids
        of the jobs leased to it that are terminal already (cancelled
        through another runner), what is paused, and (``work``) whether a
        job waits that no runner holds, for one that runs any."""
        return self._db.read(lambda tx: runners.look(tx, runner_id, work))

    def retire_runner(self, runner_id: str) -> None:
        """The runner closed: its leases are released, and the next runner
        with room takes its live jobs at once."""

        def retire(tx: Tx) -> None:
            runners.retire(tx, runner_id)
            upstreams.forget(tx, runner_id)
            tx.notify(WORK)

        self._db.write(retire, fenced=True)

    def release_jobs(self, runner_id: str, ids: Sequence[str]) -> None:
        """The runner lets go of these jobs (it will run none of them: it is
        draining); the next runner with room takes them at once."""

        def release(tx: Tx) -> None:
            runners.release(tx, runner_id, ids)
            tx.notify(WORK)

        if ids:
            self._db.write(release, fenced=True)

    def sync_upstreams(
        self,
        runner_id: str,
        lapse: float,
        wants: Sequence[UpstreamWant],
        met: Sequence[str] = (),
    ) -> dict[str, UpstreamShare]:
        """Record what the runner wants of each upstream it paces, and the
        holds its busy answers put on them; return its share of each until
        its next sync (see ``upstreams``). Rows last ``lapse`` seconds.
        ``met``: upstreams the runner met since its last sync, whose names
        the store keeps (a pause may name them)."""
        return self._db.write(
            lambda tx: upstreams.sync(tx, runner_id, lapse, wants, met), fenced=True
        )

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(notice)`` on a thread of the store's for each
        notice any process sends, until the returned function is called:
        ``"cancel:<job id>"`` once a job is cancelled, ``"work"`` once a job
        waits for a runner with room, ``"resync"`` after notices may have
        been lost. The callback must not block. Best effort, and only on
        PostgreSQL (SQLite has no channel between processes): subscribers
        poll as well."""
        return self._db.subscribe(callback)

    def total_bytes(self) -> int:
        """The stored bytes of every job, live and terminal."""
        return self._db.read(jobs.total_bytes)
