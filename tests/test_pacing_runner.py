"""Pacing in a runner (SPEC §2d): the targets of one upstream share its
limits and its holds, whatever their job; other upstreams go on."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, eventually

ALICE = batch.Caller("alice")


def host(target: batch.Target) -> str | None:
    """Targets name their upstream before a slash: ``h1/a``."""
    return target.ref.split("/", 1)[0] if "/" in target.ref else None


class Log:
    """What the fetch saw: start times by ref, and the most in flight at once."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.starts: dict[str, list[float]] = {}
        self.inflight = 0
        self.peak = 0
        self.seconds = seconds

    def fetch(self, ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        with self.lock:
            self.starts.setdefault(target.ref, []).append(time.monotonic())
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
        try:
            if self.seconds:
                ctx.wait(self.seconds)  # the fetch's own work: an upstream that takes time
            return target.ref
        finally:
            with self.lock:
                self.inflight -= 1


@pytest.mark.timeout(TIMEOUT)
def test_concurrency_holds_across_jobs(db: store.Store, runner: MakeRunner) -> None:
    log = Log(seconds=0.01)
    limits = {"h1": batch.Limit(concurrency=2)}
    with runner(db, log.fetch, workers=6, upstream=host, limits=limits) as r:
        ids = [r.submit(ALICE, [f"h1/{j}-{i}" for i in range(5)]) for j in range(6)]
        for job_id in ids:
            assert r.wait(ALICE, job_id, timeout=TIMEOUT).status == batch.JobStatus.DONE
    assert log.peak == 2


@pytest.mark.timeout(TIMEOUT)
def test_a_rate_spaces_the_starts_of_every_job_of_the_upstream(
    db: store.Store, runner: MakeRunner
) -> None:
    log = Log()
    rate = 50.0
    with runner(db, log.fetch, workers=4, upstream=host, limits={"*": batch.Limit(rate=rate)}) as r:
        ids = [r.submit(ALICE, [f"h1/{j}-{i}" for i in range(5)]) for j in range(4)]
        for job_id in ids:
            r.wait(ALICE, job_id, timeout=TIMEOUT)
    starts = sorted(t for times in log.starts.values() for t in times)
    assert len(starts) == 20
    # A bucket of one token: n starts take at least (n - 1) / rate seconds.
    assert starts[-1] - starts[0] >= (len(starts) - 1) / rate * 0.99


@pytest.mark.timeout(TIMEOUT)
def test_a_busy_answer_holds_every_target_of_its_upstream_and_no_other(
    db: store.Store, runner: MakeRunner
) -> None:
    """A ``Retry-After`` holds the other jobs' targets of that upstream for
    as long; a job on another upstream starts meanwhile."""
    after = 2.0
    raised: list[float] = []
    log = Log()

    def fetch(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if target.ref == "h1/first" and not raised:
            raised.append(time.monotonic())
            raise batch.RetryLater(after=after)
        return log.fetch(ctx, caller, target)

    class Busy(batch.Hooks):
        def __init__(self) -> None:
            self.seen = threading.Event()
            self.told: list[tuple[str, float | None]] = []

        def retry(self, err: BaseException, wait: float) -> None:
            self.seen.set()

        def upstream_held(self, upstream: str, seconds: float) -> None:
            self.told.append((upstream, seconds))

        def upstream_released(self, upstream: str) -> None:
            self.told.append((upstream, None))

    hooks = Busy()
    with runner(db, fetch, hooks, workers=2, upstream=host) as r:
        first = r.submit(ALICE, ["h1/first"])
        assert hooks.seen.wait(TIMEOUT)  # the upstream is held by now
        held = r.submit(ALICE, ["h1/second"])
        other = r.submit(ALICE, ["h2/other"])
        # The job on h1 waits on it, seen from upstreams() while it does.
        assert eventually(lambda: _upstream(r, "h1").waiting == 1)
        h1 = _upstream(r, "h1")
        assert h1.held_until is not None and 0 < h1.held_until - time.time() <= after
        assert (h1.busy, h1.inflight, h1.breaker) == (1, 0, "closed")
        why = r.explain(ALICE, held)
        assert (why["state"], why["why"], why["upstream"]) == ("upstream", "held", "h1")
        assert why["held_until"] is not None
        for job_id in (first, held, other):
            assert r.wait(ALICE, job_id, timeout=TIMEOUT).status == batch.JobStatus.DONE
        assert r.explain(ALICE, held)["state"] == "ended"
    assert log.starts["h1/second"][0] >= raised[0] + after
    assert log.starts["h2/other"][0] < log.starts["h1/second"][0]
    # The hooks heard of the hold once, and of its end once.
    [(name, held_for), released] = hooks.told
    assert name == "h1" and 0 < held_for <= after
    assert released == ("h1", None)


def _upstream(r: batch.Runner[Any], name: str) -> batch.UpstreamState:
    (state,) = [u for u in r.upstreams() if u.name == name]
    return state


@pytest.mark.timeout(TIMEOUT)
def test_without_config_upstream_nothing_is_paced(db: store.Store, runner: MakeRunner) -> None:
    log = Log()
    with runner(db, log.fetch, workers=2) as r:
        r.wait(ALICE, r.submit(ALICE, ["h1/a", "h1/b"]), timeout=TIMEOUT)
        assert r.upstreams() == []


@pytest.mark.timeout(TIMEOUT)
def test_the_breaker_stops_an_upstream_that_keeps_failing(
    db: store.Store, runner: MakeRunner
) -> None:
    """Two failures in a row open h1's breaker: its next target waits the
    cool-down, then one is tried, and its success closes it."""
    cool_down = 1.0
    failed_at: list[float] = []
    log = Log()

    def fetch(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        if target.ref.startswith("h1/broken"):
            failed_at.append(time.monotonic())
            raise batch.TargetError("broken")
        return log.fetch(ctx, caller, target)

    limits = {"h1": batch.Limit(break_after=2, cool_down=cool_down)}
    with runner(db, fetch, workers=2, upstream=host, limits=limits) as r:
        broken = r.submit(ALICE, ["h1/broken-1", "h1/broken-2"])
        assert r.wait(ALICE, broken, timeout=TIMEOUT).status == batch.JobStatus.FAILED
        after = r.submit(ALICE, ["h1/fine"])
        assert r.wait(ALICE, after, timeout=TIMEOUT).status == batch.JobStatus.DONE
        assert _upstream(r, "h1").breaker == "closed"
    assert log.starts["h1/fine"][0] >= failed_at[-1] + cool_down


@pytest.mark.timeout(TIMEOUT)
def test_a_store_that_refuses_the_sync_only_delays_a_limited_upstream(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until its share is known, a limited upstream starts nothing; a sync
    the store fails (anything it raises) is tried again, and then the jobs
    go on: no thread dies of it, and the other upstreams never waited."""
    real = Ledger.of(db).sync_upstreams
    refusals = threading.Semaphore(3)
    answered: list[float] = []

    def sync(*args: Any, **kw: Any) -> Any:
        if refusals.acquire(blocking=False):
            raise store.StoreError("the store is away")
        shares = real(*args, **kw)
        answered.append(time.monotonic())
        return shares

    monkeypatch.setattr(Ledger.of(db), "sync_upstreams", sync)
    log = Log()
    limits = {"h1": batch.Limit(concurrency=1)}
    with runner(db, log.fetch, workers=2, upstream=host, limits=limits) as r:
        free = r.submit(ALICE, ["h2/a", "h2/b"])
        limited = r.submit(ALICE, ["h1/a", "h1/b"])
        assert r.wait(ALICE, free, timeout=TIMEOUT).status == batch.JobStatus.DONE
        assert r.wait(ALICE, limited, timeout=TIMEOUT).status == batch.JobStatus.DONE
        assert r.statistics().workers == 2
    assert log.starts["h1/a"][0] >= answered[0]  # not before its share was known


@pytest.mark.timeout(TIMEOUT)
def test_an_upstream_function_that_raises_leaves_its_target_unpaced(
    db: store.Store, runner: MakeRunner, caplog: pytest.LogCaptureFixture
) -> None:
    def upstream(target: batch.Target) -> str:
        raise ValueError(target.ref)

    log = Log()
    with runner(db, log.fetch, workers=1, upstream=upstream) as r:
        job = r.submit(ALICE, ["x", "y"])
        assert r.wait(ALICE, job, timeout=TIMEOUT).status == batch.JobStatus.DONE
        assert r.statistics().workers == 1
    assert "Config.upstream raised" in caplog.text


def test_the_store_lists_an_upstream_a_runner_paces_between_its_fetches(
    db: store.Store, runner: MakeRunner
) -> None:
    """``Store.upstreams`` (``batch-runner upstreams``) lists an upstream
    while a live runner paces it, not only at the moments one of its
    targets is in flight or waits: no job wants it here once the job ended,
    and it is listed all the same (as wanted by no runner)."""
    with runner(db, lambda ctx, caller, target: None, upstream=host) as r:
        job = r.submit(ALICE, ["h1/a"])
        assert r.wait(ALICE, job, TIMEOUT).status == "done"
        assert eventually(
            lambda: [(v.name, v.runners, v.demand) for v in db.upstreams()] == [("h1", 0, 0)]
        )
