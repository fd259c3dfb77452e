"""A runner takes over the live jobs of runners that are gone, and only those."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, Clock, Recorder, Script, within

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


def leave_unfinished(db: store.Store, jobs: dict[batch.Caller, list[str]]) -> list[str]:
    """Submit jobs to a one-worker runner that fetches each job's first target,
    then the first job's second, and closes while that one is in flight (so
    close stores it). Returns the job ids, in submit order."""
    script = Script()
    first_refs = next(iter(jobs.values()))
    script.hold(first_refs[0])
    script.on(first_refs[1], lambda ctx, n: ctx.wait(TIMEOUT))
    first = batch.Runner(db, script, batch.Config(workers=1))
    ids = [first.submit(caller, refs) for caller, refs in jobs.items()]
    script.release(first_refs[0])
    script.started(first_refs[1])
    first.close()
    return ids


def test_without_resume_left_jobs_end_interrupted(db: store.Store) -> None:
    """A job a closed runner left live is ended by the next runner at once:
    its pending targets failed ``interrupted`` with a hint, its status by
    its targets, its hooks called as for any ending job."""
    (job_id,) = leave_unfinished(db, {ALICE: ["a1", "a2", "a3"]})
    hooks = Recorder()
    with batch.Runner(db, Script(), hooks=hooks) as second:
        job = second.status(ALICE, job_id)
        assert second.statistics().live == 0
    assert job.status == "partial"
    assert [t.status for t in job.targets] == ["done", "done", "failed"]
    interrupted = job.targets[2]
    assert interrupted.error == "interrupted"
    assert interrupted.hint is not None and "resume" in interrupted.hint
    assert hooks.jobs == ["partial"]
    assert len(hooks.seconds) == 1


def test_with_resume_left_jobs_rejoin_in_submit_order(db: store.Store) -> None:
    """With Config(resume=...), each left job rejoins the rotation at its first
    pending target, in the order the jobs were submitted, and runs to the end
    with the caller resume gives; a caller resume refuses ends interrupted."""
    ids = leave_unfinished(
        db, {ALICE: ["a1", "a2", "a3"], BOB: ["b1", "b2", "b3"], batch.Caller("eve"): ["e1", "e2"]}
    )
    callers = {"alice": ALICE, "bob": BOB}
    seen: list[tuple[str, str]] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        seen.append((caller.id, target.ref))
        return target.ref

    config = batch.Config(workers=1, resume=callers.get)
    with batch.Runner(db, fetch, config) as second:
        alice, bob = (second.wait(c, i, TIMEOUT) for c, i in ((ALICE, ids[0]), (BOB, ids[1])))
        eve = second.status(batch.Caller("eve"), ids[2])
    assert (alice.status, bob.status, eve.status) == ("done", "done", "partial")
    # a1, b1, e1 were stored, then a2 by close; the second runner goes on in
    # the rotation's order.
    assert seen == [("alice", "a3"), ("bob", "b2"), ("bob", "b3")]
    assert eve.targets[1].error == "interrupted"


def test_resume_that_raises_ends_the_job(db: store.Store) -> None:
    (job_id,) = leave_unfinished(db, {ALICE: ["a1", "a2", "a3"]})

    def broken(caller_id: str) -> batch.Caller:
        raise RuntimeError("no such user")

    with batch.Runner(db, Script(), batch.Config(resume=broken)) as second:
        assert second.status(ALICE, job_id).status == "partial"


def test_a_live_runners_jobs_are_never_taken(db: store.Store) -> None:
    """A second runner on the same file leaves the first one's jobs alone."""
    script = Script()
    script.hold("a1")
    with batch.Runner(db, script, batch.Config(workers=1)) as first:
        job_id = first.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        with batch.Runner(db, Script(), batch.Config(resume=lambda cid: ALICE)) as second:
            assert second.statistics().live == 0
            # a1 is in flight: running through its runner at once, through
            # any other within 0.1 s.
            assert first.status(ALICE, job_id).status == "running"
            assert within(0.1, lambda: second.status(ALICE, job_id).status == "running")
            with pytest.raises(TimeoutError):
                second.wait(ALICE, job_id, 0.05)
            script.release("a1")
            assert second.wait(ALICE, job_id, TIMEOUT).status == "done"
        assert first.wait(ALICE, job_id, TIMEOUT).status == "done"


def test_a_runner_silent_past_the_lapse_is_gone(db: store.Store, clock: Clock) -> None:
    """A runner that stopped beating for longer than takeover_after while
    others beat is gone, even if a process with its id still runs."""
    Ledger.of(db).register_runner("silent")
    Ledger.of(db).create_job("j1", "alice", ["x"], "silent", lease_for=5)
    Ledger.of(db).register_runner("watcher")
    with batch.Runner(db, Script(), batch.Config(takeover_after=5)) as early:
        assert early.status(ALICE, "j1").status == "queued"
    for _ in range(3):  # another runner beats while "silent" does not
        clock.tick(2)
        Ledger.of(db).beat_runner("watcher", 5, room=0, foreign=True)  # takes nothing
    with batch.Runner(db, Script(), batch.Config(takeover_after=5)) as late:
        assert late.status(ALICE, "j1").status == "failed"


def test_a_stall_of_the_whole_store_takes_no_lease(db: store.Store, clock: Clock) -> None:
    """When no runner could beat (the store could not be written), the time
    is given back to every lease: a runner silent only for that long keeps
    its jobs."""
    Ledger.of(db).register_runner("stalled")
    Ledger.of(db).create_job("j1", "alice", ["x"], "stalled", lease_for=5)
    Ledger.of(db).register_runner("watcher")
    Ledger.of(db).beat_runner("watcher", 5, room=0, foreign=True)
    clock.tick(10)  # nobody beat: a stall
    got = Ledger.of(db).beat_runner("watcher", 5, foreign=True)
    assert got.taken == []
    clock.tick(1)
    assert Ledger.of(db).beat_runner("stalled", 5).held == {"j1": 1}


CHILD = textwrap.dedent(
    """
    import sys, threading, batch, store
    started = threading.Event()
    def fetch(ctx, caller, target):
        started.set()
        threading.Event().wait()  # forever: the parent kills this process
    db = store.open(sys.argv[1])
    runner = batch.Runner(db, fetch, batch.Config(workers=1, takeover_after=60))
    ids = [runner.submit(batch.Caller("alice"), ["t1", "t2"]) for _ in range(2)]
    started.wait()
    print(" ".join(ids), flush=True)
    threading.Event().wait()
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_jobs_of_a_killed_process_are_taken_over_at_once(tmp_path: Path) -> None:
    """Two processes on one file: while the other runner's process lives, its
    jobs stay its own; once it is killed, the next runner takes them over at
    once (its process is gone on this host) and finishes them."""
    path = tmp_path / "shared.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None
        ids = child.stdout.readline().split()
        assert len(ids) == 2, "the child runner never started"
        config = batch.Config(resume=lambda cid: ALICE, takeover_after=60)
        with store.open(path) as db:
            with batch.Runner(db, Script(), config) as bystander:
                assert bystander.statistics().live == 0
                # Both live, nothing stored yet: t1 of the first is in
                # flight, so that job shows running within 0.1 s.
                assert within(
                    0.1,
                    lambda: (
                        [bystander.status(ALICE, i).status for i in ids] == ["running", "queued"]
                    ),
                )
            child.send_signal(signal.SIGKILL)
            child.wait(TIMEOUT)
            with batch.Runner(db, Script(), config) as heir:
                jobs = [heir.wait(ALICE, i, TIMEOUT) for i in ids]
    finally:
        child.kill()
        child.wait(TIMEOUT)
        if child.stdout is not None:
            child.stdout.close()
    assert [j.status for j in jobs] == ["done", "done"]
    # t1 of the first job was in flight when the child died: fetched again.
    assert [t.result for t in jobs[0].targets] == [{"ref": "t1"}, {"ref": "t2"}]


def test_a_live_runner_takes_over_jobs_of_one_that_goes_silent(
    db: store.Store, clock: Clock
) -> None:
    """Jobs of a runner that stops beating are taken over within seconds by
    a runner already running, not only by one that starts later."""
    hooks = Recorder()
    config = batch.Config(takeover_after=0.3, resume=lambda cid: ALICE)
    with batch.Runner(db, Script(), config, hooks) as live:
        Ledger.of(db).register_runner("silent")
        Ledger.of(db).create_job("j1", "alice", ["x", "y"], "silent")
        clock.tick(1)  # "silent" last beat a second ago: gone
        hooks.wait_for(lambda h: h.jobs == ["done"])
        job = live.status(ALICE, "j1")
    assert [t.result for t in job.targets] == [{"ref": "x"}, {"ref": "y"}]


def test_a_runner_is_gone_by_its_own_lapse_not_the_lookers(db: store.Store, clock: Clock) -> None:
    """A runner with a long lease, silent for less than it, keeps its jobs
    from a runner with a shorter one; past its own lapse, they are taken."""
    Ledger.of(db).register_runner("slow", 30)
    Ledger.of(db).create_job("j", "alice", ["x"], "slow", lease_for=30)
    Ledger.of(db).register_runner("fast", 5)
    for _ in range(6):  # +7.5 s: fast's lapse passed, slow's did not
        clock.tick(1.25)
        assert Ledger.of(db).beat_runner("fast", 5, foreign=True).taken == []
    taken = []
    for _ in range(20):  # +32.5 s: past slow's own lapse
        clock.tick(1.25)
        taken += Ledger.of(db).beat_runner("fast", 5, foreign=True).taken
    assert [(row.id, token) for row, token in taken] == [("j", 2)]
