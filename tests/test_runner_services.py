"""What services and scripts use beside submit and wait (SPEC §2b): many jobs
submitted at once, a fetch's own job's context, the hooks that say which
job, the counts of statistics(), waiting for many jobs or from asyncio,
and requeueing what failed."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
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


# -- as_completed ------------------------------------------------------------------


def test_as_completed_yields_jobs_in_the_order_they_end(
    db: store.Store, runner: MakeRunner
) -> None:
    """Jobs already ended first, then each as it ends, each id once."""
    script = Script()
    script.hold("a", "b", "c")
    with runner(db, script, workers=3) as r:
        early = r.submit(ALICE, ["early"])
        assert r.wait(ALICE, early, TIMEOUT).status == "done"
        ids = {ref: r.submit(ALICE, [ref]) for ref in "abc"}
        for ref in "abc":
            script.started(ref)
        script.release("c")
        after = {ids["c"]: "a", ids["a"]: "b"}  # each released once the one before ended
        seen = []
        for job in r.as_completed(ALICE, [ids["a"], early, ids["b"], ids["c"], ids["a"]], TIMEOUT):
            seen.append(job)
            if job.id in after:
                script.release(after[job.id])
    assert [j.id for j in seen] == [early, ids["c"], ids["a"], ids["b"]]
    assert all(j.status == "done" for j in seen)


def test_as_completed_times_out_after_yielding_what_ended(
    db: store.Store, runner: MakeRunner
) -> None:
    script = Script()
    script.hold("stuck")
    with runner(db, script, workers=2) as r:
        done = r.submit(ALICE, ["fine"])
        stuck = r.submit(ALICE, ["stuck"])
        r.wait(ALICE, done, TIMEOUT)
        completed = r.as_completed(ALICE, [done, stuck], timeout=0.2)
        assert next(completed).id == done
        with pytest.raises(TimeoutError):
            next(completed)
        script.release("stuck")


def test_as_completed_refuses_unknown_and_foreign_jobs(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        theirs = r.submit(BOB, ["x"])
        r.wait(BOB, theirs, TIMEOUT)
        for ids in (["nope"], [theirs]):
            with pytest.raises(batch.JobNotFound):
                list(r.as_completed(ALICE, ids, TIMEOUT))
        with pytest.raises(TypeError):
            r.as_completed(ALICE, "abc")  # type: ignore[arg-type]
        assert list(r.as_completed(ALICE, [], TIMEOUT)) == []


def test_as_completed_sees_jobs_another_runner_holds(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    script.hold("far")
    with runner(db, script) as running, runner(db, Script()) as asking:
        job_id = running.submit(ALICE, ["far"])
        script.started("far")
        completed = asking.as_completed(ALICE, [job_id], TIMEOUT)
        script.release("far")
        (job,) = list(completed)
    assert job.status == "done"


#: Seconds longer than any test may last.
NEVER = 600.0


@contextlib.contextmanager
def held_elsewhere(
    location: str, runner: MakeRunner
) -> Iterator[tuple[store.Store, batch.Runner[Any], str, Script]]:
    """A job of one target ("far", in flight until released) held by a runner
    on one handle of the store; another runner on another handle to wait
    for it: that handle, that runner, the job's id, and the fetch's script."""
    script = Script()
    script.hold("far")
    with (
        store.open(location) as here,
        store.open(location) as there,
        runner(there, script) as running,
        runner(here, Script()) as asking,
    ):
        job_id = running.submit(ALICE, ["far"])
        script.started("far")
        yield here, asking, job_id, script


@pytest.mark.parametrize("how", ["wait", "as_completed", "wait_async"])
def test_a_wait_on_a_job_another_handle_holds_is_woken_by_its_end(
    location: str, monkeypatch: pytest.MonkeyPatch, runner: MakeRunner, how: str
) -> None:
    """A waiter through one runner on a job another runner holds, on
    another handle of the store, returns at the job's end as the store's
    events tell it, not at a look every WAIT_POLL (made longer than the
    test may last, as is the waiter's own timeout)."""
    monkeypatch.setattr(batch.waits, "WAIT_POLL", NEVER)
    with held_elsewhere(location, runner) as (here, asking, job_id, script):
        waited: list[batch.Job] = []

        def wait() -> None:
            if how == "wait":
                waited.append(asking.wait(ALICE, job_id, NEVER))
            elif how == "as_completed":
                waited.extend(asking.as_completed(ALICE, [job_id], NEVER))
            else:

                async def main() -> batch.Job:
                    # Its look at the store, on a thread the test knows.
                    pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="waiter")
                    asyncio.get_running_loop().set_default_executor(pool)
                    return await asking.wait_async(ALICE, job_id, timeout=NEVER)

                waited.append(asyncio.run(main()))

        # Released once the waiter has looked at the store (and so watches).
        looked = threading.Event()

        def seen() -> None:
            if threading.current_thread().name.startswith("waiter"):
                looked.set()

        for name in ("list_jobs", "job_status"):
            monkeypatch.setattr(here, name, _then(getattr(here, name), seen))
        waiter = threading.Thread(target=wait, name="waiter")
        waiter.start()
        assert looked.wait(TIMEOUT)
        script.release("far")
        waiter.join(TIMEOUT)
        assert not waiter.is_alive()
    assert [job.status for job in waited] == ["done"]


def test_an_end_between_a_waiters_look_and_its_wait_is_not_missed(
    location: str, monkeypatch: pytest.MonkeyPatch, runner: MakeRunner
) -> None:
    """The job another runner holds ends, and its end is told, right after
    the waiter looked at the store (watching its events by then) and
    before it waits: the waiter sees that an end was told since its look,
    and looks again."""
    monkeypatch.setattr(batch.waits, "WAIT_POLL", NEVER)
    with held_elsewhere(location, runner) as (here, asking, job_id, script):
        ends = asking._s.ends
        told = threading.Event()
        real_tell = ends._tell

        def tell(ended: str | None) -> None:
            real_tell(ended)
            if ended == job_id:
                told.set()

        monkeypatch.setattr(ends, "_tell", tell)
        ended = False

        def end_after_the_first_watched_look() -> None:
            nonlocal ended
            if ends.watching and not ended:
                ended = True
                script.release("far")
                assert told.wait(TIMEOUT)

        monkeypatch.setattr(
            here, "list_jobs", _then(here.list_jobs, end_after_the_first_watched_look)
        )
        waited: list[batch.Job] = []
        waiter = threading.Thread(target=lambda: waited.append(asking.wait(ALICE, job_id, NEVER)))
        waiter.start()
        waiter.join(TIMEOUT)
        assert not waiter.is_alive()
    assert [job.status for job in waited] == ["done"]


@pytest.mark.parametrize("how", ["wait", "as_completed", "wait_async"])
def test_a_wait_that_finds_the_job_ended_watches_no_events(
    location: str, runner: MakeRunner, how: str
) -> None:
    """A wait through a runner that does not hold the job, which finds it
    ended already, returns it and leaves the runner reading no events (a
    watch reads every event of the store, for as long as the runner
    lives)."""
    with held_elsewhere(location, runner) as (here, asking, job_id, script):
        with here.watch(since=0, timeout=TIMEOUT) as events:
            script.release("far")
            assert any(e.kind == "job.ended" and e.id == job_id for e in events)
        if how == "wait":
            assert asking.wait(ALICE, job_id, TIMEOUT).status == "done"
        elif how == "as_completed":
            assert [j.status for j in asking.as_completed(ALICE, [job_id], TIMEOUT)] == ["done"]
        else:
            assert asyncio.run(asking.wait_async(ALICE, job_id, timeout=TIMEOUT)).status == "done"
        assert not asking._s.ends.watching


def _then(call: Any, after: Any) -> Any:
    """``call``, followed by ``after()`` each time."""

    def both(*args: object, **kwargs: object) -> object:
        try:
            return call(*args, **kwargs)
        finally:
            after()

    return both


def test_as_completed_does_not_poll_for_jobs_this_runner_holds(
    db: store.Store, monkeypatch: pytest.MonkeyPatch, runner: MakeRunner
) -> None:
    """While a job this runner holds is in flight, as_completed waits on the
    runner's condition: it reads the store once, not every WAIT_POLL."""
    script = Script()
    script.hold("slow")
    with runner(db, script) as r:
        job_id = r.submit(ALICE, ["slow"])
        script.started("slow")
        reads = 0
        real = db.list_jobs

        def counted(**kwargs: object) -> list[store.JobSummary]:
            nonlocal reads
            reads += 1
            return real(**kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(db, "list_jobs", counted)
        with pytest.raises(TimeoutError):
            list(r.as_completed(ALICE, [job_id], timeout=0.5))
        assert reads == 0
        script.release("slow")


# -- wait_async ----------------------------------------------------------------------


def test_wait_async_lets_the_event_loop_run(db: store.Store, runner: MakeRunner) -> None:
    """While wait_async awaits a job in flight, the loop keeps ticking."""
    script = Script()
    script.hold("slow")
    with runner(db, script) as r:
        job_id = r.submit(ALICE, ["slow"])
        script.started("slow")

        async def main() -> tuple[batch.Job, int]:
            ticks = 0
            enough = asyncio.Event()

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1
                    if ticks == 20:
                        enough.set()

            ticker = asyncio.create_task(tick())
            waiting = asyncio.create_task(r.wait_async(ALICE, job_id, timeout=TIMEOUT))
            await enough.wait()
            script.release("slow")
            job = await waiting
            ticker.cancel()
            return job, ticks

        job, ticks = asyncio.run(main())
    assert job.status == "done"
    assert ticks >= 20


def test_wait_async_many_at_once_take_no_thread_each(db: store.Store, runner: MakeRunner) -> None:
    """A service awaiting 200 jobs at once holds no thread per waiter."""
    script = Script()
    script.hold("gate")
    with runner(db, script, workers=1) as r:
        gate = r.submit(ALICE, ["gate"])
        script.started("gate")
        ids = r.submit_many(ALICE, [[f"t{k}"] for k in range(200)])

        async def main() -> list[batch.Job]:
            waiting = [asyncio.create_task(r.wait_async(ALICE, i, TIMEOUT)) for i in ids]
            await asyncio.sleep(0)  # every waiter registered
            threads = threading.active_count()
            script.release("gate")
            jobs = await asyncio.gather(*waiting)
            # No thread per waiter: at most what the default executors of
            # two event loops hold (this one's, reading the store, and the
            # async runner's, running the test's blocking fetch).
            assert threading.active_count() <= threads + 2 * min(32, (os.cpu_count() or 1) + 4)
            return jobs

        jobs = asyncio.run(main())
        r.wait(ALICE, gate, TIMEOUT)
    assert [j.status for j in jobs] == ["done"] * 200


def test_wait_async_errors_as_wait(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    script.hold("slow")
    r = runner(db, script, workers=1)
    job_id = r.submit(ALICE, ["slow", "after"])
    script.started("slow")
    with pytest.raises(TimeoutError):
        asyncio.run(r.wait_async(ALICE, job_id, timeout=0.05))
    with pytest.raises(batch.JobNotFound):
        asyncio.run(r.wait_async(ALICE, "nope", timeout=TIMEOUT))
    with pytest.raises(batch.JobNotFound):
        asyncio.run(r.wait_async(BOB, job_id, timeout=TIMEOUT))
    closing = threading.Thread(target=r.close)
    closing.start()
    script.release("slow")
    closing.join(TIMEOUT)
    with pytest.raises(batch.RunnerClosed):
        asyncio.run(r.wait_async(ALICE, job_id, timeout=TIMEOUT))


def test_wait_async_sees_a_job_another_runner_holds(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    script.hold("far")
    with runner(db, script) as running, runner(db, Script()) as asking:
        job_id = running.submit(ALICE, ["far"])
        script.started("far")

        async def main() -> batch.Job:
            waiting = asyncio.create_task(asking.wait_async(ALICE, job_id, TIMEOUT))
            await asyncio.sleep(0.01)
            script.release("far")
            return await waiting

        assert asyncio.run(main()).status == "done"


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
