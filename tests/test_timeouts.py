"""The time limit per target (SPEC §2g, ``Config.timeout``): a fetch that
hangs is abandoned, its target stored ``failed`` ``timed out``, a fresh
worker takes its place and the runner's other jobs go on; one that returns
within the grace is stored as it returned; a runner whose workers are all
abandoned lets its jobs go to another."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import batch
import batch.metrics
import store
from batch.timeouts import GRACE
from tests.helpers import TIMEOUT, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


class Hang:
    """Fetches whose ref starts with ``hang`` block until :meth:`release`
    (a thread on an event, or a coroutine awaiting one that ignores its
    cancel: the worst a fetch can do); the others return at once. Counts
    the fetches that returned after the runner gave up on them."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started: dict[str, float] = {}
        self._lock = threading.Lock()

    def _start(self, ref: str) -> bool:
        with self._lock:
            self.started[ref] = time.monotonic()
        return ref.startswith("hang")

    def threaded(self, ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if self._start(target.ref):
            assert self.gate.wait(TIMEOUT)
        return target.ref

    async def coroutine(self, ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if self._start(target.ref):
            while not self.gate.is_set():
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if target.ref.endswith("stubborn"):
                        continue  # swallows its cancel
                    raise
        return target.ref

    def release(self) -> None:
        self.gate.set()


@pytest.fixture(params=["threads", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hang() -> Iterator[Hang]:
    h = Hang()
    yield h
    h.release()  # nothing is left blocked past the test


def _fetch(hang: Hang, kind: str) -> Callable[..., Any]:
    return hang.coroutine if kind == "async" else hang.threaded


def test_hung_fetches_are_abandoned_and_the_runners_other_jobs_go_on(
    db: store.Store, hang: Hang, kind: str
) -> None:
    """The issue's case: 4 workers, 4 fetches that never return,
    ``timeout=1``: each hung target is stored ``failed`` ``timed out``
    within 1 s plus the grace, its job goes on to its next target, and the
    jobs of the other caller all end meanwhile, while the hung fetches have
    still not returned."""
    config = batch.Config(workers=4, timeout=1, retry_wait=0.01)
    with batch.Runner(db, _fetch(hang, kind), config) as r:
        hung = [r.submit(ALICE, [f"hang{i}", f"after{i}"]) for i in range(4)]
        assert eventually(lambda: len(hang.started) == 4)
        others = [r.submit(BOB, [f"ok{j}.{k}" for k in range(3)]) for j in range(10)]
        for job_id in others:
            assert r.wait(BOB, job_id, TIMEOUT).status == "done"
        for i, job_id in enumerate(hung):
            job = r.wait(ALICE, job_id, TIMEOUT)
            first, second = job.targets
            assert (first.status, first.error) == ("failed", "timed out")
            assert "timeout=1s" in (first.hint or "")
            assert (second.status, second.result) == ("done", f"after{i}")
            # Given up within the limit plus the grace (and a scheduling
            # slack): the job's next target started then.
            took = hang.started[f"after{i}"] - hang.started[f"hang{i}"]
            assert 1 <= took <= 1 + GRACE + 0.5
        assert not hang.gate.is_set()
        stats = r.statistics()
        assert stats.workers == 4
        if kind == "threads":
            assert stats.abandoned == 4  # the hung threads, until they return
            hang.release()
            assert eventually(lambda: r.statistics().abandoned == 0)
            assert r.statistics().workers == 4  # they ended: fresh ones took their place
        assert r.statistics().stored == 4 * 2 + 10 * 3


def test_a_task_that_swallows_its_cancel_is_counted_until_it_ends(
    db: store.Store, hang: Hang
) -> None:
    """The async runner cancels the task of a fetch past its limit; one
    that swallows the cancel is counted abandoned until it returns, and
    what it returns then is not stored."""
    config = batch.Config(workers=2, timeout=0.2, retry_wait=0.01)
    with batch.Runner(db, hang.coroutine, config) as r:
        job_id = r.submit(ALICE, ["hang-stubborn"])
        job = r.wait(ALICE, job_id, TIMEOUT)
        assert (job.targets[0].status, job.targets[0].error) == ("failed", "timed out")
        assert r.statistics().abandoned == 1
        hang.release()
        assert eventually(lambda: r.statistics().abandoned == 0)
    assert db.get_job(job_id, "alice").targets[0].error == "timed out"


def test_a_close_does_not_wait_out_a_time_limit(db: store.Store, kind: str) -> None:
    """The watch that keeps the limits ends as soon as nothing is in
    flight at close, not at the next limit it would have kept."""
    fetch = Hang()
    r = batch.Runner(db, _fetch(fetch, kind), batch.Config(workers=2, timeout=60))
    job = r.wait(ALICE, r.submit(ALICE, ["a", "b"]), TIMEOUT)
    assert job.status == "done"
    r.submit(ALICE, ["c"])
    began = time.monotonic()
    r.close(timeout=10)
    assert time.monotonic() - began < 5


def test_an_async_runner_closes_past_a_task_that_swallows_its_cancel(
    db: store.Store, hang: Hang
) -> None:
    """Its loop thread is left behind with the task, as a worker thread
    abandoned in a fetch is: close returns; the task is counted until it
    ends."""
    r = batch.Runner(db, hang.coroutine, batch.Config(workers=2, timeout=0.2))
    job_id = r.submit(ALICE, ["hang-stubborn"])
    assert r.wait(ALICE, job_id, TIMEOUT).targets[0].error == "timed out"
    r.close(timeout=TIMEOUT)
    assert r.statistics().abandoned == 1
    hang.release()
    assert eventually(lambda: r.statistics().abandoned == 0)


def test_a_fetch_that_returns_within_the_grace_is_stored_as_it_returned(
    db: store.Store, kind: str
) -> None:
    """At the limit the fetch's context is cancelled (``reason`` says
    ``timed out``); what it returns then is stored, and the job's next
    fetch gets a context that is not cancelled."""
    seen: list[tuple[str, str | None]] = []

    def fetch(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if target.ref == "slow":
            assert ctx.wait(TIMEOUT)
        seen.append((target.ref, ctx.reason))
        return {"ref": target.ref, "cut": ctx.cancelled()}

    async def fetch_async(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if target.ref == "slow":
            assert await ctx.wait_async(TIMEOUT)
        seen.append((target.ref, ctx.reason))
        return {"ref": target.ref, "cut": ctx.cancelled()}

    config = batch.Config(workers=1, timeout=0.3)
    with batch.Runner(db, fetch_async if kind == "async" else fetch, config) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["slow", "next"]), TIMEOUT)
        assert [t.status for t in job.targets] == ["done", "done"]
        assert [t.result for t in job.targets] == [
            {"ref": "slow", "cut": True},
            {"ref": "next", "cut": False},
        ]
        assert seen == [("slow", "timed out"), ("next", None)]
        assert r.statistics().abandoned == 0


def test_a_cancel_during_the_grace_stands(db: store.Store, kind: str) -> None:
    """A job cancelled while its fetch is past the limit stays cancelled:
    no fresh context lets another of its targets start."""
    cut = threading.Event()
    calls: list[str] = []

    def fetch(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        calls.append(target.ref)
        assert ctx.wait(TIMEOUT)
        cut.set()
        assert gate.wait(TIMEOUT)
        return target.ref

    async def fetch_async(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        return await asyncio.to_thread(fetch, ctx, caller, target)

    gate = threading.Event()
    config = batch.Config(workers=1, timeout=0.2)
    with batch.Runner(db, fetch_async if kind == "async" else fetch, config) as r:
        job_id = r.submit(ALICE, ["a", "b"])
        assert cut.wait(TIMEOUT)
        r.cancel(ALICE, job_id)
        gate.set()
        assert r.wait(ALICE, job_id, TIMEOUT).status == "cancelled"
    assert calls == ["a"]


def test_a_runner_whose_workers_all_hang_lets_its_jobs_go(
    db: store.Store, hang: Hang, location: str
) -> None:
    """One worker, every fetch of the job hangs: the first is abandoned and
    replaced, the second too, and then no thread is left to replace it:
    the runner renews no lease, so another runner on the store takes the
    job once its lease lapses and runs the rest of it."""
    config = batch.Config(workers=1, timeout=0.2, takeover_after=1.0, retry_wait=0.01)
    with batch.Runner(db, hang.threaded, config) as stuck:
        job_id = stuck.submit(ALICE, ["hang1", "hang2", "rest"])
        assert eventually(lambda: stuck.statistics().abandoned == 2)
        assert stuck.statistics().workers == 0
        with (
            store.open(location) as other_db,
            batch.Runner(
                other_db,
                lambda ctx, caller, t: t.ref,
                batch.Config(resume=batch.Caller, takeover_after=1.0),
            ) as other,
        ):
            job = other.wait(ALICE, job_id, TIMEOUT)
            assert [(t.status, t.error) for t in job.targets] == [
                ("failed", "timed out"),
                ("failed", "timed out"),
                ("done", None),
            ]
            assert job.targets[2].result == "rest"
        hang.release()
        assert eventually(lambda: stuck.statistics().abandoned == 0)
        assert stuck.statistics().workers == 1  # a thread that came back rejoined


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan")])
def test_a_time_limit_must_be_a_positive_number_of_seconds(timeout: float) -> None:
    with pytest.raises(ValueError, match=r"Config\.timeout"):
        batch.Config(timeout=timeout)


def test_a_time_limit_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Config\.timeout must be a number of seconds"):
        batch.Config(timeout="1")  # type: ignore[arg-type]


def test_the_abandoned_fetches_are_a_metric(db: store.Store, hang: Hang) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics = batch.metrics.Metrics(registry)
    config = batch.Config(workers=2, timeout=0.2)
    with batch.Runner(db, hang.threaded, config, metrics) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["hang"]), TIMEOUT)
        assert job.targets[0].error == "timed out"
        assert registry.get_sample_value("batch_abandoned_fetches") == 1
        hang.release()
        assert eventually(lambda: registry.get_sample_value("batch_abandoned_fetches") == 0)
