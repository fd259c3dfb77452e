"""The rotation with paced upstreams, held to a model (SPEC §2d): which
jobs may start at each moment, whatever the order of picks, answers,
holds, syncs and time. Single-threaded: the rotation is plain state the
runner's lock guards, so the machine drives it directly."""

from __future__ import annotations

import math
import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import batch
import store
from batch.context import Context
from batch.pacing import Answer, Paces
from batch.rotation import LiveJob, Rotation

UPSTREAMS = ("a", "b", "c", "d")
#: The concurrency of each upstream ("c" and "d" have none).
CONCURRENCY = {"a": 1, "b": 2}
#: "d" has a rate, whose share the syncs change: when its next target may
#: start is the bucket's business, not the model's.
LIMITS = {
    **{name: batch.Limit(concurrency=c) for name, c in CONCURRENCY.items()},
    "d": batch.Limit(rate=10.0, burst=2),
}


def upstream(target: batch.Target) -> str:
    return target.ref.split("/")[0]


class PacedRotation(RuleBasedStateMachine):
    """The model: each live job's next upstream, whether it is running, the
    holds and the targets in flight per upstream. What must hold:

    - no upstream has more in flight than its concurrency;
    - no target starts on a held upstream;
    - a pick returns a job whenever some live job that is not running has
      an upstream that may start one (no job waits on a free upstream), and
      None otherwise.
    """

    @initialize()
    def start(self) -> None:
        paces = Paces(upstream, LIMITS, 1.0, random.Random(0))
        self.rotation: Rotation[str] = Rotation("job", None, paces)
        self.now = 0.0
        self.jobs: dict[str, LiveJob[str]] = {}
        self.running: set[str] = set()
        self.held_until = dict.fromkeys(UPSTREAMS, -math.inf)
        self.n = 0
        self.d_rate = 10.0
        self.sync()

    def sync(self) -> None:
        """The store's answer for a runner alone: the whole of each limit,
        and of "d"'s rate what ``d_rate`` says."""
        shares = {
            name: store.UpstreamShare(
                1, CONCURRENCY.get(name), self.d_rate if name == "d" else None, 0.0
            )
            for name in UPSTREAMS
        }
        self.rotation.wants(self.now)
        self.rotation.shared(shares, self.now, math.inf)

    @rule(rate=st.sampled_from([0.0, 0.5, 10.0, 100.0]))
    def resync(self, rate: float) -> None:
        """Another runner came or went: "d"'s share of the rate moves."""
        self.d_rate = rate
        self.sync()

    def inflight(self, name: str) -> int:
        return sum(1 for job_id in self.running if self.next_upstream(job_id) == name)

    def next_upstream(self, job_id: str) -> str:
        job = self.jobs[job_id]
        return upstream(job.targets[job.next])

    def may_start(self, name: str) -> bool:
        limit = CONCURRENCY.get(name)
        held = self.held_until[name] > self.now
        return not held and (limit is None or self.inflight(name) < limit)

    def must_start(self, job_id: str) -> bool:
        """Whether the job may start now, as far as the model can tell ("d"'s
        bucket is not modelled: its jobs may start, or not)."""
        name = self.next_upstream(job_id)
        return name != "d" and self.may_start(name)

    @rule(names=st.lists(st.sampled_from(UPSTREAMS), min_size=1, max_size=4))
    def submit(self, names: list[str]) -> None:
        self.n += 1
        job_id = f"j{self.n}"
        targets = [batch.Target(f"{name}/{k}") for k, name in enumerate(names)]
        job = LiveJob(job_id, "o", "caller", targets, self.now, store.Lease("r", 1), Context())
        self.jobs[job_id] = job
        self.rotation.add(job)

    @rule()
    def pick(self) -> None:
        waiting = [
            job_id
            for job_id in self.jobs
            if job_id not in self.running and self.jobs[job_id].retry_at <= self.now
        ]
        startable = {job_id for job_id in waiting if self.may_start(self.next_upstream(job_id))}
        certain = {job_id for job_id in waiting if self.must_start(job_id)}
        job = self.rotation.pick(self.now)
        if self.rotation.paces.fresh:  # type: ignore[union-attr]
            # A new upstream: the keeper syncs it at once, and a worker picks again.
            self.sync()
            job = job or self.rotation.pick(self.now)
        if job is None:
            assert not certain, f"nothing picked though {sorted(certain)} may start"
            return
        assert job.id in startable, f"{job.id} started on {self.next_upstream(job.id)}"
        job.start()
        self.running.add(job.id)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), answer=st.sampled_from(list(Answer)), after=st.sampled_from([0.0, 2.0]))
    def returns(self, data: st.DataObject, answer: Answer, after: float) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        job = self.jobs[job_id]
        name = self.next_upstream(job_id)
        self.rotation.returned(job, answer, 0.01, after, self.now)
        self.running.discard(job_id)
        if answer is Answer.BUSY:
            pace = self.rotation.paces.get(name)  # type: ignore[union-attr]
            assert pace is not None
            self.held_until[name] = pace.held_until
            assert pace.held_until >= self.now + after
            job.hold_until(self.now + 0.5)
        else:
            job.advance(answer is Answer.DONE)
        if self.rotation.settle(job):
            del self.jobs[job_id]

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 3.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def within_limits(self) -> None:
        for name, limit in CONCURRENCY.items():
            assert self.inflight(name) <= limit


class TestPacedRotation(PacedRotation.TestCase):  # type: ignore[name-defined]
    settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
