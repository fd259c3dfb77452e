"""What services and scripts use beside submit and wait (SPEC §2b): many jobs
submitted at once, a fetch's own job's context, the hooks that say which
job, requeueing what failed, an async fetch's resources and loop, the
group commit. Waiting for jobs is ``test_runner_waits``."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, Recorder, Script, raising

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


# -- submit_many ---------------------------------------------------------------


def test_submit_many_joins_the_rotation_in_order(db: store.Store, runner: MakeRunner) -> None:
    """The jobs of one call take turns in the order given, like jobs
    submitted one by one: a1 b1 c1 a2 b2 c2 with one worker."""
    script = Script()
    with runner(db, script, workers=1) as r:
        script.hold("x")
        r.submit(ALICE, ["x"])
        script.started("x")
        ids = r.submit_many(ALICE, [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]])
        script.release("x")
        jobs = [r.wait(ALICE, job_id, TIMEOUT) for job_id in ids]
    assert [j.status for j in jobs] == ["done"] * 3
    assert script.calls == ["x", "a1", "b1", "c1", "a2", "b2", "c2"]
    assert [[t.target.ref for t in j.targets] for j in jobs] == [
        ["a1", "a2"],
        ["b1", "b2"],
        ["c1", "c2"],
    ]


def test_submit_many_reports_the_depth_once(db: store.Store, runner: MakeRunner) -> None:
    """The jobs join at once: the live count goes up once, by all of them."""
    script = Script()
    hooks = Recorder()
    script.hold("a")
    with runner(db, script, hooks, workers=1) as r:
        ids = r.submit_many(ALICE, [["a"], ["b"], ["c"]])
        script.started("a")
        assert hooks.depths == [3]
        script.release("a")
        for job_id in ids:
            r.wait(ALICE, job_id, TIMEOUT)


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ([["a"], []], "job 1: a job needs at least one target"),
        ([["a"], ["b", 7]], "job 1: target 1: expected a str or batch.Target, not int"),
        ([["a"], "bc"], "job 1: targets must be a list of str or batch.Target, not str"),
        ("abc", "jobs must be a list of target lists, not str"),
        (None, "jobs must be a list of target lists, not NoneType"),
    ],
)
def test_submit_many_names_the_bad_job_and_stores_nothing(
    db: store.Store, jobs: object, message: str, runner: MakeRunner
) -> None:
    """A bad list anywhere: InvalidJob naming the job's index (and the
    target's position), and not one of the jobs is stored."""
    with runner(db, Script()) as r:
        with pytest.raises(batch.InvalidJob) as raised:
            r.submit_many(ALICE, jobs)  # type: ignore[arg-type]
        assert str(raised.value) == message
        assert r.statistics().live == 0
    assert db.list_jobs() == []


def test_submit_many_of_no_job_stores_nothing(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        assert r.submit_many(ALICE, []) == []
        assert r.submit_many(ALICE, iter([])) == []
    assert db.list_jobs() == []


def test_submit_many_takes_any_iterable(db: store.Store, runner: MakeRunner) -> None:
    """Generators of generators are read once, in order."""
    with runner(db, Script(), workers=2) as r:
        ids = r.submit_many(ALICE, ((f"{k}-{i}" for i in range(2)) for k in range(3)))
        jobs = [r.wait(ALICE, job_id, TIMEOUT) for job_id in ids]
    assert [[t.target.ref for t in j.targets] for j in jobs] == [
        ["0-0", "0-1"],
        ["1-0", "1-1"],
        ["2-0", "2-1"],
    ]


def test_submit_many_stores_all_or_nothing(
    db: store.Store, monkeypatch: pytest.MonkeyPatch, runner: MakeRunner
) -> None:
    """A store that refuses the write: the caller gets the StoreError, no job
    is stored, and the runner's room is as before (a later submit joins)."""
    script = Script()
    hooks = Recorder()
    with runner(db, script, hooks, workers=1, max_live=2) as r:
        real = Ledger.of(db).create_jobs

        def refused(*args: object, **kwargs: object) -> None:
            raise store.StoreError("disk full")

        monkeypatch.setattr(Ledger.of(db), "create_jobs", refused)
        with pytest.raises(store.StoreError):
            r.submit_many(ALICE, [["a"], ["b"], ["c"]])
        assert db.list_jobs() == []
        monkeypatch.setattr(Ledger.of(db), "create_jobs", real)
        ids = r.submit_many(ALICE, [["d"], ["e"]])
        assert hooks.depths[0] == 2  # both joined: no room was kept by the refused call
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done", "done"]


def test_submit_many_past_max_live_waits_in_order(db: store.Store, runner: MakeRunner) -> None:
    """Under max_live, the first jobs that fit join; the rest wait queued in
    the store and join in the order given as room frees."""
    script = Script()
    script.hold("j0-a")
    hooks = Recorder()
    with runner(db, script, hooks, workers=1, max_live=2) as r:
        ids = r.submit_many(ALICE, [[f"j{k}-a", f"j{k}-b"] for k in range(5)])
        script.started("j0-a")
        assert r.statistics().live == 2
        assert [r.status(ALICE, i).status for i in ids[2:]] == ["queued"] * 3
        script.release("j0-a")
        jobs = [r.wait(ALICE, i, TIMEOUT) for i in ids]
    assert [j.status for j in jobs] == ["done"] * 5
    assert max(hooks.depths) == 2
    assert [c for c in script.calls if c.endswith("-a")] == [f"j{k}-a" for k in range(5)]


def test_submit_many_after_close_is_refused(db: store.Store, runner: MakeRunner) -> None:
    r = runner(db, Script())
    r.close()
    with pytest.raises(batch.RunnerClosed):
        r.submit_many(ALICE, [["a"]])
    assert db.list_jobs() == []


# -- the context of a fetch's own job -------------------------------------------


def test_a_fetch_sees_its_own_job_cancelled_at_once(db: store.Store, runner: MakeRunner) -> None:
    """Cancelling a job cancels the context its fetch in flight waits on
    (reason "cancelled"): a long fetch gives up at once instead of holding
    its worker, and what it returns is stored. Another job's fetch goes on."""
    started = {ref: threading.Event() for ref in ("a", "b")}
    seen: dict[str, tuple[bool, str | None]] = {}

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        started[target.ref].set()
        cancelled = ctx.wait(TIMEOUT if target.ref == "a" else 0.05)
        seen[target.ref] = (cancelled, ctx.reason)
        return {"gave up": cancelled}

    hooks = Recorder()
    with runner(db, fetch, hooks, workers=2) as r:
        a = r.submit(ALICE, ["a", "a2"])
        b = r.submit(ALICE, ["b"])
        started["a"].wait(TIMEOUT)
        started["b"].wait(TIMEOUT)
        began = time.monotonic()
        assert r.cancel(ALICE, a)
        hooks.wait_for(lambda h: len(h.targets) == 2)  # a's outcome, and b's
        assert time.monotonic() - began < TIMEOUT / 2
        job = r.status(ALICE, a)
        assert r.wait(ALICE, b, TIMEOUT).status == "done"
    assert seen == {"a": (True, "cancelled"), "b": (False, None)}
    assert job.status == "cancelled"
    assert [(t.status, t.result) for t in job.targets] == [
        ("done", {"gave up": True}),
        ("pending", None),
    ]


def test_close_cancels_every_fetch_context_with_reason_closed(
    db: store.Store, runner: MakeRunner
) -> None:
    started = threading.Event()
    seen: list[str | None] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        assert ctx.reason is None
        started.set()
        ctx.wait(TIMEOUT)
        seen.append(ctx.reason)
        return None

    r = runner(db, fetch, workers=1)
    r.submit(ALICE, ["a", "b"])
    assert started.wait(TIMEOUT)
    r.close()
    assert seen == ["closed"]


# -- the hooks that say which job, and the busy answers --------------------------


class Told(batch.Hooks):
    """Records retry and ended calls."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.retries: list[tuple[str, float]] = []
        self.endings: list[tuple[str, str, str]] = []
        self.jobs: list[str] = []

    def retry(self, err: BaseException, wait: float) -> None:
        with self.lock:
            self.retries.append((type(err).__name__, wait))

    def ended(self, job_id: str, owner: str, status: str) -> None:
        with self.lock:
            self.endings.append((job_id, owner, status))

    def job(self, status: str) -> None:
        with self.lock:
            self.jobs.append(status)


def test_retry_is_told_each_busy_answer_that_will_be_tried_again(
    db: store.Store, runner: MakeRunner
) -> None:
    """Two busy answers, then done: two retry calls with the wait the
    runner will make (retry_wait, or the longer wait the upstream asked
    for), and the job ends done."""
    script = Script()
    answers = iter([batch.RetryLater("busy"), batch.RetryLater("busy", after=0.03)])

    def answer(ctx: batch.Context, n: int) -> object:
        err = next(answers, None)
        if err is not None:
            raise err
        return "ok"

    script.on("a", answer)
    told = Told()
    with runner(db, script, told, retry_wait=0.01) as r:
        job_id = r.submit(ALICE, ["a"])
        assert r.wait(ALICE, job_id, TIMEOUT).status == "done"
        stats = r.statistics()
    assert told.retries == [("RetryLater", 0.01), ("RetryLater", 0.03)]
    assert (stats.stored, stats.retries, dict(stats.ended)) == (1, 2, {"done": 1})


def test_no_retry_is_told_for_a_busy_answer_stored_failed(
    db: store.Store, runner: MakeRunner
) -> None:
    script = Script()
    script.on("a", raising(batch.RetryLater("busy", after=60)))
    told = Told()
    with runner(db, script, told, retry_for=1.0) as r:
        job_id = r.submit(ALICE, ["a"])
        assert r.wait(ALICE, job_id, TIMEOUT).status == "failed"
    assert told.retries == []


def test_ended_names_each_job_once_whatever_ends_it(db: store.Store, runner: MakeRunner) -> None:
    """Done, failed, partial and cancelled jobs each get one ended call with
    their id, owner and status, beside job(status)."""
    script = Script()
    script.on("bad", raising(batch.TargetError("no")))
    script.hold("held")
    told = Told()
    with runner(db, script, told, workers=2) as r:
        ids = {
            "done": r.submit(ALICE, ["ok"]),
            "failed": r.submit(BOB, ["bad"]),
            "partial": r.submit(ALICE, ["ok2", "bad"]),
            "cancelled": r.submit(BOB, ["held", "never"]),
        }
        script.started("held")
        assert r.cancel(BOB, ids["cancelled"])
        script.release("held")
        for status, job_id in ids.items():
            caller = BOB if status in ("failed", "cancelled") else ALICE
            assert r.wait(caller, job_id, TIMEOUT).status == status
        stats = r.statistics()
    assert sorted(told.endings) == sorted(
        (job_id, "bob" if status in ("failed", "cancelled") else "alice", status)
        for status, job_id in ids.items()
    )
    assert sorted(told.jobs) == sorted(ids)
    assert dict(stats.ended) == {status: 1 for status in ids}


# -- requeue_failed ----------------------------------------------------------------


def test_requeue_failed_submits_the_failed_targets_in_order(
    db: store.Store, runner: MakeRunner
) -> None:
    script = Script()
    for ref in ("b", "d"):
        script.on(ref, raising(batch.TargetError("down")))
    with runner(db, script) as r:
        first = r.submit(ALICE, ["a", "b", "c", "d"])
        assert r.wait(ALICE, first, TIMEOUT).status == "partial"
        script.on("b", lambda ctx, n: "now fine")
        again = r.requeue_failed(ALICE, first)
        job = r.wait(ALICE, again, TIMEOUT)
    assert again != first
    assert [(t.target.ref, t.status) for t in job.targets] == [("b", "done"), ("d", "failed")]


def test_requeue_failed_refuses_what_it_cannot_requeue(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    script.hold("held")
    with runner(db, script, workers=2) as r:
        fine = r.submit(ALICE, ["ok"])
        r.wait(ALICE, fine, TIMEOUT)
        live = r.submit(ALICE, ["held"])
        script.started("held")
        with pytest.raises(batch.InvalidJob, match="no failed target"):
            r.requeue_failed(ALICE, fine)
        with pytest.raises(batch.InvalidJob, match="still running"):
            r.requeue_failed(ALICE, live)
        with pytest.raises(batch.JobNotFound):
            r.requeue_failed(BOB, fine)
        with pytest.raises(batch.JobNotFound):
            r.requeue_failed(ALICE, "nope")
        script.release("held")


# -- an async fetch's own resources -----------------------------------------------


def test_an_async_fetch_object_is_closed_on_the_runners_loop(db: store.Store) -> None:
    """An object with an async __call__ and an aclose(): the fetches and the
    aclose run on one loop, the runner's, and aclose once it closes."""

    class Fetch:
        def __init__(self) -> None:
            self.loops: set[asyncio.AbstractEventLoop] = set()
            self.closed_on: asyncio.AbstractEventLoop | None = None

        async def __call__(
            self, ctx: batch.Context, caller: batch.Caller, target: batch.Target
        ) -> object:
            self.loops.add(asyncio.get_running_loop())
            return target.ref

        async def aclose(self) -> None:
            self.closed_on = asyncio.get_running_loop()

    fetch = Fetch()
    with batch.Runner(db, fetch, batch.Config(workers=3)) as r:
        ids = r.submit_many(ALICE, [["a", "b"], ["c"], ["d"]])
        assert [j.status for j in r.as_completed(ALICE, ids, TIMEOUT)] == ["done"] * 3
        assert fetch.closed_on is None
    (loop,) = fetch.loops
    assert fetch.closed_on is loop


def test_an_aclose_that_raises_is_logged_and_the_runner_closes(
    db: store.Store, caplog: pytest.LogCaptureFixture
) -> None:
    class Fetch:
        async def __call__(
            self, ctx: batch.Context, caller: batch.Caller, target: batch.Target
        ) -> object:
            return None

        async def aclose(self) -> None:
            raise OSError("socket already gone")

    r = batch.Runner(db, Fetch())
    r.close(timeout=TIMEOUT)
    assert r.statistics().closed
    assert "aclose() raised" in caplog.text


# -- the event loop an async runner runs on -----------------------------------------


def _loop_of(db: store.Store, config: batch.Config) -> asyncio.AbstractEventLoop:
    """The loop an async fetch of a runner with ``config`` ran on."""
    loops: list[asyncio.AbstractEventLoop] = []

    async def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        loops.append(asyncio.get_running_loop())
        return None

    with batch.Runner(db, fetch, config) as r:
        assert r.wait(ALICE, r.submit(ALICE, ["a"]), TIMEOUT).status == "done"
    return loops[0]


@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_an_async_runner_runs_on_uvloop_where_installed(db: store.Store, choice: str) -> None:
    uvloop = pytest.importorskip("uvloop")
    assert isinstance(_loop_of(db, batch.Config(loop=choice)), uvloop.Loop)


def test_an_async_runner_runs_on_asyncio_when_asked(db: store.Store) -> None:
    loop = _loop_of(db, batch.Config(loop="asyncio"))
    assert type(loop).__module__.startswith("asyncio.")


def test_without_uvloop_auto_is_asyncio_and_uvloop_refused(
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop fails
    assert type(_loop_of(db, batch.Config())).__module__.startswith("asyncio.")
    with pytest.raises(ValueError, match=r"batch-store\[speed\]"):
        batch.Config(loop="uvloop")


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="'auto', 'asyncio' or 'uvloop'"):
        batch.Config(loop="trio")


# -- the group commit ----------------------------------------------------------------


def test_outcomes_of_quick_fetches_in_flight_share_one_commit(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch about to be written waits for quick fetches still in flight,
    and stores their outcomes with its own in one commit: three jobs'
    fetches run together; the first returns at once, the other two only
    once its outcome waits to be recorded. Without the wait, the first is
    written alone."""
    monkeypatch.setattr(batch.commit, "GATHER_FOR", TIMEOUT)  # no bound to reach
    batches: list[int] = []
    real = Ledger.of(db).store_targets

    def store_targets(outcomes: Any, **kwargs: Any) -> store.Stored:
        # Outcomes only: the keeper's own write of ``running`` (no outcome)
        # may come first on a busy host.
        if outcomes:
            batches.append(len(outcomes))
        return real(outcomes, **kwargs)

    monkeypatch.setattr(Ledger.of(db), "store_targets", store_targets)
    together = threading.Barrier(3, timeout=TIMEOUT)
    first_back = threading.Event()

    class Told(batch.Hooks):
        most = 0

        def inflight(self, n: int) -> None:
            if n < self.most:
                first_back.set()  # the first fetch is back: its outcome waits
            self.most = max(self.most, n)

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        together.wait()
        if target.ref != "first":
            assert first_back.wait(TIMEOUT)
        return target.ref

    with runner(db, fetch, Told(), workers=3) as r:
        ids = r.submit_many(ALICE, [["first"], ["second"], ["third"]])
        for job_id in ids:
            assert r.wait(ALICE, job_id, TIMEOUT).status == "done"
    assert batches == [3]
