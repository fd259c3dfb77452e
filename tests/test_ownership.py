"""What a runner owes every job, whichever runner holds it: no worker dies,
``running`` shows at once, cancel and wait from any runner, hints, the
budget after each commit, interrupted targets reported, close on time,
``max_live``. (Several processes: ``test_ownership_processes.py``; the lease
protocol against a model: ``test_leases_model.py``.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, Recorder, Script, StepClock, eventually, raising

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


# -- no worker ever dies ---------------------------------------------------------


class BadItems(dict[str, Any]):
    """A result whose encoding raises: json asks for its items."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(x=1)
        self.exc = exc

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        raise self.exc


class BadText:
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class ExitHooks(batch.Hooks):
    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        raise SystemExit(3)

    def inflight(self, n: int) -> None:
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    "answer",
    [
        lambda ctx, n: BadItems(KeyError("items")),
        lambda ctx, n: BadItems(MemoryError()),
        raising(batch.TargetError(BadText())),  # type: ignore[arg-type]
        raising(batch.TargetError("gone", hint=BadText())),  # type: ignore[arg-type]
        raising(SystemExit(2)),
        raising(KeyboardInterrupt()),
    ],
    ids=["items-raise", "memory-error", "msg-str-raises", "hint-str-raises", "exit", "ctrl-c"],
)
def test_nothing_a_fetch_does_ends_a_worker(db: store.Store, answer: Any) -> None:
    """The target is stored failed (``internal error``, never the exception's
    text), the job ends, and every worker is still there."""
    script = Script()
    script.on("bad", answer)
    with batch.Runner(db, script, batch.Config(workers=2)) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["bad", "good"]), TIMEOUT)
        assert r.statistics().workers == 2
        # The workers go on with new work.
        assert r.wait(ALICE, r.submit(ALICE, ["more"]), TIMEOUT).status == "done"
    assert job.status == "partial"
    bad = job.targets[0]
    assert bad.status == "failed"
    assert bad.error in ("internal error", "result is not JSON-serializable")
    assert "no text" not in f"{bad.error} {bad.hint}"


def test_hooks_that_exit_end_no_worker(db: store.Store) -> None:
    with batch.Runner(db, Script(), batch.Config(workers=2), ExitHooks()) as r:
        ids = [r.submit(ALICE, ["a", "b"]) for _ in range(3)]
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done"] * 3
        assert r.statistics().workers == 2


# -- running is visible -----------------------------------------------------------


def test_running_shows_at_once_and_in_the_store_within_a_tenth(
    db: store.Store, location: str
) -> None:
    """Seed rule 1: a job is running from its first target. Through its runner
    at once; in the store (for any other reader: another store here, as
    another process) within 0.1 s, with nothing else being written
    meanwhile."""
    script = Script()
    script.hold("only")
    with store.open(location) as other, batch.Runner(db, script, batch.Config(workers=1)) as r:
        job_id = r.submit(ALICE, ["only"])
        assert other.get_job(job_id, "alice") is not None  # its connection made
        script.started("only")
        assert r.status(ALICE, job_id).status == "running"

        # Asked every 5 ms: a reader asking more often takes the time of the
        # keeper that writes it, on a busy machine.
        def running() -> bool:
            return other.get_job(job_id, "alice").status == "running"  # type: ignore[union-attr]

        assert eventually(running, 0.1, every=0.005)
        script.release("only")
        assert r.wait(ALICE, job_id, TIMEOUT).status == "done"


def test_a_resumed_job_not_reached_before_shows_running_once_started(
    db: store.Store, location: str
) -> None:
    Ledger.of(db).register_runner("gone")
    Ledger.of(db).retire_runner("gone")
    Ledger.of(db).create_job("j1", "alice", ["x", "y"], "gone")
    script = Script()
    script.hold("x")
    with store.open(location) as other:
        assert other.get_job("j1", "alice") is not None  # its connection made
        with batch.Runner(db, script, batch.Config(resume=lambda cid: ALICE)) as r:
            script.started("x")
            assert r.status(ALICE, "j1").status == "running"

            def running() -> bool:
                return other.get_job("j1", "alice").status == "running"  # type: ignore[union-attr]

            assert eventually(running, 0.1, every=0.005)  # as above
            script.release("x")
            assert r.wait(ALICE, "j1", TIMEOUT).status == "done"


# -- any runner serves every job of the caller ------------------------------------


def test_cancel_and_wait_through_another_runner(db: store.Store) -> None:
    """A job one runner holds is cancelled through another at once: True,
    ``cancelled`` in the store, the target in flight stored, nothing further
    started; a wait through the other runner returns it."""
    script = Script()
    script.hold("a1")
    hooks = Recorder()
    held = Recorder()
    with (
        batch.Runner(db, script, batch.Config(workers=1), held) as owner,
        batch.Runner(db, Script(), hooks=hooks) as other,
    ):
        job_id = owner.submit(ALICE, ["a1", "a2", "a3"])
        script.started("a1")
        waited: list[batch.Job] = []
        waiter = threading.Thread(target=lambda: waited.append(other.wait(ALICE, job_id, TIMEOUT)))
        waiter.start()
        assert other.cancel(BOB, job_id) is False  # not bob's
        assert other.cancel(ALICE, job_id) is True
        assert other.status(ALICE, job_id).status == "cancelled"
        assert other.cancel(ALICE, job_id) is False  # terminal now
        script.release("a1")
        waiter.join(TIMEOUT)
        assert owner.wait(ALICE, job_id, TIMEOUT).status == "cancelled"
        # The target in flight is stored, then the job leaves its holder.
        held.wait_for(lambda h: len(h.targets) == 1 and h.depths[-1] == 0)
        assert owner.statistics().live == 0
        job = owner.status(ALICE, job_id)
    assert [j.status for j in waited] == ["cancelled"]
    assert [t.status for t in job.targets] == ["done", "pending", "pending"]
    assert script.calls == ["a1"]
    assert hooks.jobs == ["cancelled"]


def test_wait_through_another_runner_returns_when_the_job_ends(db: store.Store) -> None:
    script = Script()
    script.hold("a")
    with batch.Runner(db, script) as owner, batch.Runner(db, Script()) as other:
        job_id = owner.submit(ALICE, ["a"])
        with pytest.raises(TimeoutError):
            other.wait(ALICE, job_id, 0.01)
        with pytest.raises(batch.JobNotFound):
            other.wait(BOB, job_id, TIMEOUT)
        script.release("a")
        assert other.wait(ALICE, job_id, TIMEOUT).status == "done"


# -- the hint of a busy target -----------------------------------------------------


def test_busy_past_retry_for_says_so_not_that_the_upstream_asked(db: store.Store) -> None:
    """Busy with no Retry-After past retry_for: the hint names retry_for, not
    an upstream that asked to wait 0 s. Time is stepped, not waited for."""
    clock = StepClock()
    tries = threading.Semaphore(0)

    def busy(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        tries.release()
        raise batch.RetryLater("still busy")

    config = batch.Config(workers=1, retry_wait=1.0, retry_for=5.0, takeover_after=600)
    with batch.Runner(db, busy, config, clock=clock) as r:
        job_id = r.submit(ALICE, ["a"])
        assert tries.acquire(timeout=TIMEOUT)  # at 0: busy from now on
        clock.tick(3)
        assert tries.acquire(timeout=TIMEOUT)  # at 3: within retry_for, held back again
        clock.tick(3)
        job = r.wait(ALICE, job_id, TIMEOUT)  # at 6: past retry_for
    assert (job.status, job.targets[0].error) == ("failed", "still busy")
    assert job.targets[0].hint == "still busy after retrying for 5s; try again later"


# -- the byte budget holds after every commit --------------------------------------


def test_budget_holds_when_several_jobs_end_in_one_commit(db: store.Store) -> None:
    """Three one-target jobs of 10 bytes end together under max_bytes=12:
    once they are stored, one job and 10 bytes are left."""
    gate = threading.Barrier(3, timeout=TIMEOUT)

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        gate.wait()  # all three in flight, so they end in (nearly) one batch
        return "12345678"  # 10 bytes of JSON

    hooks = Recorder()
    with batch.Runner(db, fetch, batch.Config(workers=3, max_bytes=12), hooks) as r:
        ids = [r.submit(ALICE, [f"t{i}"]) for i in range(3)]
        hooks.wait_for(lambda h: len(h.jobs) == 3)
        assert Ledger.of(db).total_bytes() == 10
        left = [i for i in ids if db.get_job(i, "alice") is not None]
    assert len(left) == 1


# -- interrupted targets are reported --------------------------------------------


def test_interrupted_targets_call_the_target_hook(db: store.Store) -> None:
    script = Script()
    script.on("a1", lambda ctx, n: ctx.wait(TIMEOUT))
    first = batch.Runner(db, script, batch.Config(workers=1))
    job_id = first.submit(ALICE, ["a1", "a2", "a3"])
    script.started("a1")
    first.close()  # a1 is stored; a2, a3 stay pending
    hooks = Recorder()
    with batch.Runner(db, Script(), hooks=hooks) as second:
        assert second.status(ALICE, job_id).status == "partial"
    assert [(type(e).__name__, str(e), n) for e, _, n in hooks.targets] == [
        ("TargetError", "interrupted", 0)
    ] * 2
    assert hooks.jobs == ["partial"]


# -- close keeps its timeout --------------------------------------------------------


class BlockingHooks(batch.Hooks):
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        self.entered.set()
        self.release.wait(TIMEOUT)


def test_close_keeps_its_timeout_while_a_hook_blocks(db: store.Store) -> None:
    hooks = BlockingHooks()
    r = batch.Runner(db, Script(), batch.Config(workers=1), hooks)
    r.submit(ALICE, ["a", "b"])
    assert hooks.entered.wait(TIMEOUT)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        r.close(timeout=0.5)
    assert time.monotonic() - start < 0.6
    hooks.release.set()
    r.close(timeout=TIMEOUT)
    assert r.statistics().closed


# -- max_live ------------------------------------------------------------------------


def test_max_live_holds_that_many_and_the_rest_wait_in_order(db: store.Store) -> None:
    """Past max_live, jobs wait queued in the store, unleased, and join the
    rotation in submit order as room frees."""
    script = Script()
    script.hold("j0-a", "j1-a")
    hooks = Recorder()
    with batch.Runner(db, script, batch.Config(workers=2, max_live=2), hooks) as r:
        ids = [r.submit(ALICE, [f"j{k}-a", f"j{k}-b"]) for k in range(5)]
        script.started("j0-a")
        script.started("j1-a")
        assert r.statistics().live == 2
        assert [r.status(ALICE, i).status for i in ids[2:]] == ["queued"] * 3
        script.release("j0-a")
        script.release("j1-a")
        jobs = [r.wait(ALICE, i, TIMEOUT) for i in ids]
    assert [j.status for j in jobs] == ["done"] * 5
    assert max(hooks.depths) == 2
    firsts = [c for c in script.calls if c.endswith("-a")]
    assert firsts == [f"j{k}-a" for k in range(5)]


def test_jobs_waiting_for_room_go_to_a_runner_with_room(db: store.Store) -> None:
    """A runner that can resume other callers' jobs and has room takes the
    jobs another runner stored waiting, in submit order."""
    script = Script()
    script.hold("busy")
    with batch.Runner(db, script, batch.Config(workers=1, max_live=1)) as full:
        full.submit(ALICE, ["busy"])
        script.started("busy")
        waiting = [full.submit(ALICE, [f"w{k}"]) for k in range(3)]
        seen: list[str] = []

        def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
            seen.append(target.ref)
            return target.ref

        config = batch.Config(workers=1, resume=batch.Caller)
        with batch.Runner(db, fetch, config) as roomy:
            assert [roomy.wait(ALICE, i, TIMEOUT).status for i in waiting] == ["done"] * 3
        script.release("busy")
    assert seen == ["w0", "w1", "w2"]


def test_max_live_holds_under_concurrent_submits(db: store.Store) -> None:
    """Room is promised under the lock: eight threads submitting at once to a
    runner with max_live=1 never make it hold two jobs."""
    hooks = Recorder()
    start = threading.Barrier(8, timeout=TIMEOUT)
    ids: list[str] = []

    with batch.Runner(db, Script(), batch.Config(workers=2, max_live=1), hooks) as r:

        def submit() -> None:
            start.wait()
            ids.append(r.submit(ALICE, ["a", "b"]))

        threads = [threading.Thread(target=submit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done"] * 8
    assert max(hooks.depths) == 1
