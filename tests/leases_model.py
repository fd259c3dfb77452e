"""The plain-Python model of job leases between runners (``store/runners.py``
and the fenced writes of ``store/jobs.py``) that ``test_leases_model.py``
holds the store to: jobs, runners and the lease clock, and what each beat,
write, cancel and retire does to them."""

from __future__ import annotations

from dataclasses import dataclass, field

from store import Lease

#: The usual lapse (``takeover_after``) of an actor's beats and new jobs;
#: some actors have a longer one.
LAPSE = 10.0
LIVE = ("queued", "running")


@dataclass
class MJob:
    id: str
    caller: str
    home: str | None
    targets: list[str]
    status: str = "queued"
    owner: str | None = None
    token: int = 0
    until: float | None = None

    @property
    def live(self) -> bool:
        return self.status in LIVE

    def holds(self, lease: Lease) -> bool:
        return (self.owner, self.token) == (lease.owner, lease.token)

    def takes_outcome(self, lease: Lease) -> bool:
        """Whether an outcome written under ``lease`` passes the fence: the
        job is held with it, or it ended and its lease was released with no
        runner taking it since (its token unchanged)."""
        return self.holds(lease) or (
            not self.live and self.owner is None and self.token == lease.token
        )


@dataclass
class MRunner:
    heartbeat: float
    #: The lapse it registered with, then the one of its last beat.
    lapse: float
    closed: bool = False


@dataclass
class Model:
    """The store's jobs (in submit order), runners and lease clock."""

    now: float
    last_beat: float = 0.0
    runners: dict[str, MRunner] = field(default_factory=dict)
    jobs: dict[str, MJob] = field(default_factory=dict)

    def ended(self, runner_id: str | None) -> set[str]:
        """Runners other than ``runner_id`` that ended: closed (no pid is
        ever dead: every actor is this process). Their leases are free."""
        return {r for r, m in self.runners.items() if r != runner_id and m.closed}

    def silent(self, runner_id: str, at: float) -> set[str]:
        """Open runners other than ``runner_id`` silent at ``at`` for longer
        than their own lapse: the jobs submitted through them that nobody
        holds are orphans. (Their leases lapse by their own expiry.)"""
        return {
            r
            for r, m in self.runners.items()
            if r != runner_id and not m.closed and m.heartbeat < at - m.lapse
        }

    def stall(self, lapse: float) -> float:
        """The time a beat now gives back to every lease (0: none)."""
        gap = self.now - self.last_beat
        return gap if self.last_beat and gap > lapse / 2 else 0.0

    def give_back(self, gap: float) -> None:
        """A stall: add ``gap`` to every lease and open runner's heartbeat."""
        for j in self.jobs.values():
            if j.owner is not None:
                assert j.until is not None
                j.until += gap
        for r in self.runners.values():
            if not r.closed:
                r.heartbeat += gap

    def beat(
        self, runner_id: str, lapse: float, room: int | None, foreign: bool, keep: set[str]
    ) -> tuple[dict[str, int], frozenset[str], list[tuple[str, int]]]:
        now = self.now
        self.give_back(self.stall(lapse))
        self.last_beat = now
        self.runners[runner_id].heartbeat = now
        self.runners[runner_id].lapse = lapse
        held: dict[str, int] = {}
        ended: set[str] = set()
        for j in self.jobs.values():
            if j.owner == runner_id:
                # A renewal never brings a lease nearer.
                j.until = now + lapse if j.until is None else max(j.until, now + lapse)
                if j.live:
                    held[j.id] = j.token
                else:
                    ended.add(j.id)
                    if j.id not in keep:  # a target in flight: still to be stored
                        j.owner = None
        dead = self.ended(runner_id)
        gone = dead | self.silent(runner_id, now)

        def free(j: MJob) -> bool:
            lapsed = j.until is not None and j.until < now
            return j.live and (j.owner is None or lapsed or j.owner in dead)

        ids: list[str] = []
        if room is None or room > 0:
            mine = [
                j.id for j in self.jobs.values() if free(j) and (foreign or j.home == runner_id)
            ]
            ids += mine if room is None else mine[:room]
        if not foreign:
            ids += [
                j.id for j in self.jobs.values() if free(j) and (j.home is None or j.home in gone)
            ]
        order = list(self.jobs)
        taken: list[tuple[str, int]] = []
        for job_id in sorted(ids, key=order.index):
            j = self.jobs[job_id]
            j.owner, j.token, j.until = runner_id, j.token + 1, now + lapse
            taken.append((job_id, j.token))
        return held, frozenset(ended), taken

    def retire(self, runner_id: str) -> None:
        self.runners[runner_id].closed = True
        for j in self.jobs.values():
            if j.owner == runner_id:
                j.owner = None
