"""Waiting for jobs (SPEC §2b): ``as_completed`` in the order jobs end,
``wait``, ``as_completed`` and ``wait_async`` on jobs another handle holds
(woken by the store's events, none missed between a look and a wait), and
``wait_async`` leaving the event loop its turn."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import batch
import store
from tests.helpers import TIMEOUT, MakeRunner, Script

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


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
