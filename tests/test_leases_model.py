"""Job leases between runners against a plain-Python model.

A Hypothesis state machine drives a real store file with two to four runners
("actors", all of this process, each with its own lapse, registered with it
or with the store's default) through beats, clock steps small and large,
stop and resume, kill, retire, cancel, and writes fenced by the lease an actor
believes it holds: at once, or begun now and landed later in one batch (a
fetch in flight), maybe after the job went to another actor and came back.
A model of ``store/runners.py`` and the fenced writes of ``store/jobs.py``
predicts every ``Beat`` (held, ended, taken and the new tokens) and whether
every write is accepted; after every step the store file must hold exactly
the model's leases, tokens, statuses, targets, runners (heartbeat, lapse,
closed) and lease clock. A lease is free once it lapsed by its own expiry,
or its owner closed; silence past a runner's own lapse only makes the jobs
submitted through it that nobody holds orphans. On
top: no target is stored twice; an accepted write named the job's owner and
token at that moment; an actor whose leases are valid by its own last beat
holds every job it believes it holds (so no two do); tokens only grow; a
stall (no beat for over half a lease) takes no job that was held when it
began. Teardown drives every job to its end through the protocol.

``tests/test_leases.py`` spells out the key facts one by one.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import store
from store import Conflict, Lease, TargetOutcome, ended_status
from store.ledger import Ledger
from tests.helpers import EXAMPLES, Clock, Raw, examples
from tests.leases_model import LAPSE, MJob, Model, MRunner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 * max(1.0, EXAMPLES))]

LAPSES = (LAPSE, LAPSE, 2 * LAPSE)
#: The lapse ``register_runner`` records when given none.
DEFAULT_LAPSE = 5.0
ACTORS = ("r0", "r1", "r2", "r3")
CALLERS = ("alice", "bob")
MAX_JOBS = 8
#: Clock steps (all exact in binary, so the store's sums match the model's).
#: A small one alone is no stall; several in a row without a beat may be.
SMALL = (0.25, 0.5, 1.0, 2.0, 2.5, 3.0, 4.75, 5.0)
#: Each of these, with no beat, is a stall for a beat of LAPSE: over LAPSE / 2.
BIG = (5.25, 6.0, 10.0, 10.25, 15.0, 40.0)
#: How a job is created: leased to the actor it is submitted through, left
#: waiting (unleased) with that actor as its home, or with no home at all.
HOW = st.sampled_from(["leased", "leased", "waiting", "homeless"])


# -- the actors: what each runner believes ------------------------------------------


@dataclass
class Belief:
    """A job an actor believes it holds: the token it got it with, what it
    knows of its targets, and whether it told the store the job started."""

    token: int
    view: list[str]
    started: bool = False


@dataclass
class Actor:
    name: str
    #: active, stopped (frozen: neither beats nor writes), killed, retired.
    mode: str
    #: Its lease length (``takeover_after``): of every beat and new job.
    lapse: float
    #: Its last beat (or registration), by the store's clock: it trusts its
    #: leases until ``seen + lapse``, like a runner's ``valid_until``.
    seen: float
    beliefs: dict[str, Belief] = field(default_factory=dict)
    #: Writes it began (job, target, the lease then) and has not sent yet.
    inflight: list[tuple[str, int, Lease]] = field(default_factory=list)

    def valid(self, now: float) -> bool:
        return now <= self.seen + self.lapse


class LeaseMachine(RuleBasedStateMachine):
    #: Makes a new store for each example (the test sets it, per engine).
    fresh: Callable[[], contextlib.AbstractContextManager[str]]

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.patch = contextlib.ExitStack()
        try:
            where = self.patch.enter_context(self.fresh())
            self.db = self.patch.enter_context(store.open(where, clock=self.clock.time))
            self.raw = Raw(self.db.path)
            self.patch.callback(self.raw.close)
        except BaseException:
            self.patch.close()
            raise
        self.model = Model(now=self.clock.now)
        self.actors: dict[str, Actor] = {}
        self.tokens: dict[str, int] = {}
        self.stored: set[tuple[str, int]] = set()
        #: The clock reading of the last stall, and the jobs held when it began.
        self.stall_at: float | None = None
        self.protected: dict[str, tuple[str | None, int]] = {}

    # -- helpers -------------------------------------------------------------

    def in_mode(self, *modes: str) -> list[Actor]:
        return [a for a in self.actors.values() if a.mode in modes]

    def pick(self, i: int, *modes: str) -> Actor:
        them = self.in_mode(*modes)
        return them[i % len(them)]

    def register(self, name: str, lapse: float, named: bool = True) -> Actor:
        """A new actor beating with ``lapse``; registered with it if
        ``named``, else with the store's default until its first beat."""
        if named:
            Ledger.of(self.db).register_runner(name, lapse)
        else:
            Ledger.of(self.db).register_runner(name)
        self.model.runners[name] = MRunner(self.model.now, lapse if named else DEFAULT_LAPSE)
        actor = self.actors[name] = Actor(name, "active", lapse, self.model.now)
        return actor

    def tick(self, dt: float) -> None:
        self.clock.tick(dt)
        self.model.now = self.clock.now

    def raw_lease(self, job_id: str) -> tuple[str | None, int]:
        owner, token = self.raw.one(
            "SELECT lease_owner, lease_token FROM jobs WHERE id = ?", (job_id,)
        )
        return owner, token

    def do_beat(self, actor: Actor, room: int | None, foreign: bool, keep: bool = True) -> None:
        """The actor beats; ``keep``: it names the jobs it has a write in
        flight for, whose leases it keeps even if they ended (as the keeper
        does)."""
        m = self.model
        kept = sorted({job_id for job_id, _, _ in actor.inflight}) if keep else []
        before = {j.id: (j.owner, j.token) for j in m.jobs.values()}
        if m.stall(actor.lapse):
            # Held at the last beat: leased, not lapsed, owner not closed.
            closed = m.ended(None)
            self.stall_at = m.now
            self.protected = {
                j.id: (j.owner, j.token)
                for j in m.jobs.values()
                if j.live
                and j.owner is not None
                and j.owner not in closed
                and j.until is not None
                and j.until >= m.last_beat
            }
            event("stall" + (" with held jobs" if self.protected else ""))
        got = Ledger.of(self.db).beat_runner(
            actor.name, actor.lapse, room=room, foreign=foreign, keep=kept
        )
        held, ended, taken = m.beat(actor.name, actor.lapse, room, foreign, set(kept))
        assert got.held == held, (actor.name, got.held, held)
        assert got.ended == ended, (actor.name, got.ended, ended)
        if ended & set(kept):
            event("an ended job's lease kept: a write in flight")
        assert [(row.id, token) for row, token in got.taken] == taken, (got.taken, taken)
        for row, _ in got.taken:
            j = m.jobs[row.id]
            assert (row.owner, row.runner_id, row.status) == (j.caller, j.home, j.status)
            assert [t.status for t in row.targets] == j.targets
            if before[row.id][0] is not None:
                event("taken from another runner")
        if self.stall_at == m.now:
            for row, _ in got.taken:
                assert before[row.id] != self.protected.get(row.id), (
                    f"a stall cost {before[row.id]} job {row.id}"
                )
        for job_id, token in held.items():
            b = actor.beliefs.get(job_id)
            assert b is not None and b.token == token, (actor.name, job_id, token, b)
        beliefs = {job_id: actor.beliefs[job_id] for job_id in held}
        for row, token in got.taken:
            view = [t.status for t in row.targets]
            beliefs[row.id] = Belief(token, view, started=row.status == "running")
        actor.beliefs = beliefs
        actor.seen = m.now

    def attempt(self, actor: Actor, job_id: str, how: str, status: str = "done") -> bool:
        """The actor writes for a job it believes it holds, with its lease:
        ``next`` (its next pending target, or the job's end once none is
        left), ``again`` (a target it knows stored) or ``interrupt``. The model
        says whether the store must take it. True if it did."""
        b = actor.beliefs[job_id]
        lease = Lease(actor.name, b.token)
        j = self.model.jobs[job_id]
        if how == "interrupt":
            return self.attempt_interrupt(actor, j, lease)
        pending = [p for p, s in enumerate(b.view) if s == "pending"]
        stored = [p for p, s in enumerate(b.view) if s != "pending"]
        if how == "again" and stored:
            return self.store_one(actor, job_id, stored[0], lease, status)
        if pending:
            return self.store_one(actor, job_id, pending[0], lease, status)
        return self.attempt_end(actor, j, lease)

    def store_one(self, actor: Actor, job_id: str, pos: int, lease: Lease, status: str) -> bool:
        """Store one target's outcome with the actor's lease."""
        return self.store_batch(actor, [(job_id, pos, lease, status)]) == [True]

    def store_batch(self, actor: Actor, writes: list[tuple[str, int, Lease, str]]) -> list[bool]:
        """Store these outcomes in one ``store_targets`` call, each with its
        lease (the actor's current one, or an older one a write in flight was
        made with), starting the jobs the actor holds and has not started.
        The model says which are stored; returns that, by index."""
        m = self.model
        for job_id, _, _, _ in writes:
            assert self.raw_lease(job_id) == (m.jobs[job_id].owner, m.jobs[job_id].token)
        starting: list[tuple[str, Lease]] = []
        for job_id, _, lease, _ in writes:
            b = actor.beliefs.get(job_id)
            if b is not None and b.token == lease.token and not b.started:
                b.started = True
                starting.append((job_id, lease))
        outcomes = [
            TargetOutcome(job_id, pos, status, result=f'"{actor.name}"', lease=lease)
            for job_id, pos, lease, status in writes
        ]
        got = Ledger.of(self.db).store_targets(outcomes, starting=starting)
        for job_id, lease in starting:
            j = m.jobs[job_id]
            if j.holds(lease) and j.status == "queued":
                j.status = "running"
        accepted = [
            self.stored_or_not(actor, write, got.refused.get(i)) for i, write in enumerate(writes)
        ]
        assert set(got.refused) == {i for i, ok in enumerate(accepted) if not ok}, got
        assert got.cancelled == {
            i for i, ok in enumerate(accepted) if ok and not m.jobs[writes[i][0]].live
        }, got
        assert (got.ended, got.evicted) == (frozenset(), []), got
        return accepted

    def stored_or_not(
        self, actor: Actor, write: tuple[str, int, Lease, str], err: Exception | None
    ) -> bool:
        """Whether the model stores this write, in turn; checks the store's
        answer ``err`` for it (None: stored) agrees."""
        job_id, pos, lease, status = write
        j = self.model.jobs[job_id]
        fenced = j.takes_outcome(lease)
        b = actor.beliefs.get(job_id)
        current = b is not None and b.token == lease.token
        if fenced and j.targets[pos] == "pending":
            # An accepted write named the job's owner and token as it is now,
            # and its writer, if it still goes on with the job, knew it as
            # stored. (One that gave up a job cancelled meanwhile still holds
            # its lease until its next beat: its write in flight is stored.)
            assert err is None, (actor.name, write, err)
            assert (job_id, pos) not in self.stored, f"{job_id}/{pos} stored twice"
            self.stored.add((job_id, pos))
            if b is None:
                assert not j.live, (actor.name, write, j)
                event("write in flight stored for a job given up")
            else:
                assert current, (actor.name, write, b)
                assert b.view == j.targets, (actor.name, job_id, b.view, j.targets)
                b.view[pos] = status
            j.targets[pos] = status
            return True
        assert isinstance(err, Conflict), (actor.name, write, err)
        assert ("no longer leased" in str(err)) == (not fenced), err
        if fenced:
            event("write refused: stored already")
        elif j.owner == lease.owner:
            event("write refused: its writer holds the job again, with a new token")
        else:
            event("write refused: lease")
        if current and not fenced:
            del actor.beliefs[job_id]  # it lost the job: it stops with it
        return False

    def attempt_end(self, actor: Actor, j: MJob, lease: Lease) -> bool:
        view = actor.beliefs.pop(j.id).view
        final = ended_status(view.count("done"), view.count("failed"))
        got = Ledger.of(self.db).set_job_status(j.id, final, lease)
        expect = j.live and j.holds(lease)
        assert got == expect, (actor.name, j, lease)
        if expect:
            assert view == j.targets
            j.status, j.owner = final, None
        return got

    def attempt_interrupt(self, actor: Actor, j: MJob, lease: Lease) -> bool:
        del actor.beliefs[j.id]
        got = Ledger.of(self.db).interrupt_job(j.id, "stopped", lease)
        if j.live and j.holds(lease):
            n = j.targets.count("pending")
            j.targets = ["failed" if s == "pending" else s for s in j.targets]
            j.status = ended_status(j.targets.count("done"), j.targets.count("failed"))
            j.owner = None
            assert got == (j.status, n)
            return True
        assert got is None
        return False

    def resume_actor(self, actor: Actor) -> None:
        """A stopped actor goes on: first, the write it was about to make for
        every job it believes it holds, with the token it had."""
        actor.mode = "active"
        self.land_all(actor)
        for job_id in list(actor.beliefs):
            stale = self.model.jobs[job_id].token != actor.beliefs[job_id].token
            accepted = self.attempt(actor, job_id, "next")
            if stale:
                event("stale write after resume")
                assert not accepted, f"{actor.name}'s stale write for {job_id} was stored"

    def land_all(self, actor: Actor) -> None:
        """Send every write the actor has in flight, in one batch."""
        self.land_some(actor, len(actor.inflight), "done")

    def land_some(self, actor: Actor, n: int, status: str) -> None:
        """Send the actor's oldest ``n`` writes in flight, in one batch."""
        writes = [(job_id, pos, lease, status) for job_id, pos, lease in actor.inflight[:n]]
        del actor.inflight[:n]
        stale = [self.model.jobs[job_id].token != lease.token for job_id, _, lease, _ in writes]
        if writes:
            for ok, old in zip(self.store_batch(actor, writes), stale, strict=True):
                if old and not ok:
                    event("stale write in flight refused")

    # -- rules ---------------------------------------------------------------

    @initialize(
        lapses=st.lists(st.sampled_from(LAPSES), min_size=2, max_size=4),
        named=st.lists(st.booleans(), min_size=4, max_size=4),
        jobs=st.lists(
            st.tuples(st.integers(0, 3), st.sampled_from(CALLERS), st.integers(1, 4), HOW),
            max_size=4,
        ),
    )
    def start(
        self, lapses: list[float], named: list[bool], jobs: list[tuple[int, str, int, str]]
    ) -> None:
        for name, lapse, told in zip(ACTORS, lapses, named, strict=False):
            self.register(name, lapse, told)
        for i, caller, size, how in jobs:
            self.create(i, caller, size, how)

    @precondition(lambda self: len(self.model.jobs) < MAX_JOBS and self.in_mode("active"))
    @rule(
        i=st.integers(0, 3),
        caller=st.sampled_from(CALLERS),
        n=st.integers(1, 4),
        how=HOW,
        late=st.sampled_from([0.0, 0.0, 4.0]),
    )
    def create(self, i: int, caller: str, n: int, how: str, late: float = 0.0) -> None:
        """A job submitted through an actor, ``late`` seconds after the rest
        of the machine last moved: its lease outlasts the actor's last beat
        by that much."""
        self.tick(late)
        actor = self.pick(i, "active")
        job_id = f"j{len(self.model.jobs)}"
        home = None if how == "homeless" else actor.name
        leased = how == "leased"
        refs = [f"{job_id}/{pos}" for pos in range(n)]
        lease_for = actor.lapse if leased else None
        Ledger.of(self.db).create_job(job_id, caller, refs, home, lease_for=lease_for)
        job = self.model.jobs[job_id] = MJob(job_id, caller, home, ["pending"] * n)
        if leased:
            job.owner, job.token, job.until = actor.name, 1, self.model.now + actor.lapse
            actor.beliefs[job_id] = Belief(1, ["pending"] * n)

    @precondition(lambda self: self.in_mode("active"))
    @rule(
        i=st.integers(0, 3),
        room=st.none() | st.integers(0, 3),
        foreign=st.booleans(),
        keep=st.booleans(),
    )
    def beat(self, i: int, room: int | None, foreign: bool, keep: bool) -> None:
        self.do_beat(self.pick(i, "active"), room, foreign, keep)

    @precondition(lambda self: self.in_mode("active"))
    @rule(order=st.permutations(range(len(ACTORS))), foreign=st.booleans())
    def beat_all(self, order: list[int], foreign: bool) -> None:
        """Every running actor beats once, now."""
        for k in order:
            if k < len(self.actors):
                actor = self.actors[ACTORS[k]]
                if actor.mode == "active":
                    self.do_beat(actor, None, foreign)

    @rule(dt=st.sampled_from(SMALL))
    def advance(self, dt: float) -> None:
        self.tick(dt)

    @precondition(lambda self: self.in_mode("active"))
    @rule(dt=st.sampled_from(SMALL), i=st.integers(0, 3), foreign=st.booleans())
    def advance_and_beat(self, dt: float, i: int, foreign: bool) -> None:
        """Time passes while one actor beats and the others are silent: their
        leases lapse while the store can be written."""
        self.tick(dt)
        self.do_beat(self.pick(i, "active"), None, foreign)

    @precondition(lambda self: self.in_mode("active"))
    @rule(
        i=st.integers(0, 3),
        foreign=st.booleans(),
        rounds=st.integers(3, 6),
        dt=st.sampled_from((1.25, 2.5, 3.0, 5.0)),
    )
    def only_one_beats(self, i: int, foreign: bool, rounds: int, dt: float) -> None:
        """For a lease or so, one actor beats and every other is silent."""
        actor = self.pick(i, "active")
        for _ in range(rounds):
            self.tick(dt)
            self.do_beat(actor, None, foreign)

    @precondition(lambda self: len(self.in_mode("active")) > 1)
    @rule(i=st.integers(0, 3), k=st.integers(0, 2), foreign=st.booleans())
    def take_turns(self, i: int, k: int, foreign: bool) -> None:
        """One actor beats alone for over a lease, then another does, with a
        write in flight for every job it held: its jobs go to the first and
        may come back to it with a new token before those writes land."""
        them = self.in_mode("active")
        first = them[i % len(them)]
        others = [a for a in them if a is not first]
        second = others[k % len(others)]
        for job_id, b in second.beliefs.items():
            if "pending" in b.view:
                second.inflight.append(
                    (job_id, b.view.index("pending"), Lease(second.name, b.token))
                )
        for actor in (first, second):
            for _ in range(6):  # 24 s: past the longest lease
                self.tick(4.0)
                self.do_beat(actor, None, foreign or actor is second)

    @rule(dt=st.sampled_from(BIG))
    def stall(self, dt: float) -> None:
        """Nobody beats for over half a lease."""
        self.tick(dt)

    @precondition(lambda self: self.in_mode("active"))
    @rule(i=st.integers(0, 3))
    def stop(self, i: int) -> None:
        self.pick(i, "active").mode = "stopped"

    @precondition(lambda self: self.in_mode("stopped"))
    @rule(i=st.integers(0, 3))
    def resume(self, i: int) -> None:
        self.resume_actor(self.pick(i, "stopped"))

    @precondition(lambda self: len(self.in_mode("active", "stopped")) > 1)
    @rule(i=st.integers(0, 3))
    def kill(self, i: int) -> None:
        actor = self.pick(i, "active", "stopped")
        actor.mode = "killed"
        actor.beliefs.clear()
        actor.inflight.clear()

    @precondition(
        lambda self: self.in_mode("active") and len(self.in_mode("active", "stopped")) > 1
    )
    @rule(i=st.integers(0, 3))
    def retire(self, i: int) -> None:
        actor = self.pick(i, "active")
        Ledger.of(self.db).retire_runner(actor.name)
        self.model.retire(actor.name)
        actor.mode = "retired"
        actor.beliefs.clear()
        actor.inflight.clear()

    @precondition(lambda self: any(a.beliefs for a in self.in_mode("active")))
    @rule(
        i=st.integers(0, 3),
        k=st.integers(0, MAX_JOBS - 1),
        how=st.sampled_from(["next", "next", "next", "again", "interrupt"]),
        status=st.sampled_from(["done", "failed"]),
    )
    def write(self, i: int, k: int, how: str, status: str) -> None:
        holders = [a for a in self.in_mode("active") if a.beliefs]
        actor = holders[i % len(holders)]
        mine = list(actor.beliefs)
        self.attempt(actor, mine[k % len(mine)], how, status)

    @precondition(lambda self: any(a.beliefs for a in self.in_mode("active")))
    @rule(i=st.integers(0, 3), k=st.integers(0, MAX_JOBS - 1))
    def begin(self, i: int, k: int) -> None:
        """The actor starts the next pending target of a job it holds: its
        outcome, with the lease of now, is sent later (``land``)."""
        holders = [a for a in self.in_mode("active") if a.beliefs]
        actor = holders[i % len(holders)]
        job_id = list(actor.beliefs)[k % len(actor.beliefs)]
        b = actor.beliefs[job_id]
        if "pending" in b.view:
            actor.inflight.append((job_id, b.view.index("pending"), Lease(actor.name, b.token)))

    @precondition(lambda self: any(a.inflight for a in self.in_mode("active")))
    @rule(i=st.integers(0, 3), n=st.integers(1, 3), status=st.sampled_from(["done", "failed"]))
    def land(self, i: int, n: int, status: str) -> None:
        """Writes in flight reach the store, in one batch, each with the lease
        it began with."""
        senders = [a for a in self.in_mode("active") if a.inflight]
        self.land_some(senders[i % len(senders)], n, status)

    @precondition(lambda self: self.model.jobs)
    @rule(k=st.integers(0, MAX_JOBS - 1), wrong=st.booleans())
    def cancel(self, k: int, wrong: bool) -> None:
        jobs = list(self.model.jobs.values())
        j = jobs[k % len(jobs)]
        caller = next(c for c in CALLERS if c != j.caller) if wrong else j.caller
        got = self.db.cancel_job(j.id, caller)
        expect = j.live and caller == j.caller
        assert got == expect, (j, caller)
        if expect:
            j.status = "cancelled"  # the lease stays, for its holder to release

    # -- invariants -----------------------------------------------------------

    @invariant()
    def store_is_the_model(self) -> None:
        m = self.model
        jobs = [
            (job_id, status, owner, token, until, home)
            for job_id, status, owner, token, until, home in self.raw.rows(
                "SELECT id, status, lease_owner, lease_token, lease_until, runner_id"
                " FROM jobs ORDER BY seq"
            )
        ]
        assert jobs == [
            (j.id, j.status, j.owner, j.token, j.until, j.home) for j in m.jobs.values()
        ]
        targets: dict[str, list[str]] = {}
        for job_id, status in self.raw.rows(
            "SELECT job_id, status FROM targets ORDER BY job_id, pos"
        ):
            targets.setdefault(job_id, []).append(status)
        assert targets == {j.id: j.targets for j in m.jobs.values()}
        runners = {
            r: (hb, lapse, bool(closed))
            for r, hb, lapse, closed in self.raw.rows(
                "SELECT id, heartbeat_at, lapse, closed FROM runners"
            )
        }
        assert runners == {r: (x.heartbeat, x.lapse, x.closed) for r, x in m.runners.items()}
        assert self.raw.one("SELECT beat_at FROM lease_clock") == (m.last_beat,)
        for j in m.jobs.values():
            assert j.token >= self.tokens.get(j.id, 0), f"{j.id}'s token went down"
            self.tokens[j.id] = j.token

    @invariant()
    def one_holder_by_its_own_clock(self) -> None:
        """An actor whose leases are valid by its own last beat holds in the
        store every job it believes it holds, with its token: so no two do."""
        now = self.model.now
        holders: dict[str, str] = {}
        for actor in self.in_mode("active", "stopped"):
            if not actor.valid(now):
                continue
            for job_id, b in actor.beliefs.items():
                j = self.model.jobs[job_id]
                assert (j.owner, j.token) == (actor.name, b.token), (actor.name, job_id, b, j)
                assert holders.setdefault(job_id, actor.name) == actor.name

    # -- teardown: every job to its end ----------------------------------------

    def teardown(self) -> None:
        try:
            if sys.exc_info()[1] is None:  # not after a failed step
                self.finish()
        finally:
            self.patch.close()

    def finish(self) -> None:
        for actor in self.in_mode("stopped"):
            self.resume_actor(actor)
        if not self.in_mode("active"):
            self.register("finisher", LAPSE)
        for _ in range(100):
            if not any(j.live for j in self.model.jobs.values()):
                break
            for actor in self.in_mode("active"):
                self.land_all(actor)
                self.do_beat(actor, None, True)
                for job_id in list(actor.beliefs):
                    while job_id in actor.beliefs:
                        self.attempt(actor, job_id, "next")
            self.store_is_the_model()
            self.one_holder_by_its_own_clock()
            self.tick(LAPSE / 4)
        assert not [j for j in self.model.jobs.values() if j.live], "jobs never ended"
        for actor in self.in_mode("active"):
            # Its last writes in flight land, then its beat releases the
            # leases it kept for them and those of jobs cancelled meanwhile.
            self.land_all(actor)
            self.do_beat(actor, None, True)
        self.store_is_the_model()
        # Only a killed actor still holds leases: of jobs cancelled meanwhile,
        # which nobody takes (it would have released them at its next beat).
        killed = {a.name for a in self.in_mode("killed")}
        assert all(j.owner is None or j.owner in killed for j in self.model.jobs.values())
        assert self.raw.one("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')") == (
            0,
        )


SETTINGS = settings(max_examples=examples(70), stateful_step_count=25, deadline=None)


def test_leases_against_the_model(
    fresh_location: Callable[[], contextlib.AbstractContextManager[str]],
    request: pytest.FixtureRequest,
) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(LeaseMachine, "fresh", fresh_location, create=True))
        # A store costs ten times more on PostgreSQL (a database each, and a
        # round trip per statement): fewer examples there, the same rules.
        engine = request.node.callspec.params["fresh_location"]
        examples = SETTINGS.max_examples if engine == "sqlite" else SETTINGS.max_examples // 3
        run_state_machine_as_test(LeaseMachine, settings=settings(SETTINGS, max_examples=examples))
