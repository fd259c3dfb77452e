"""What services and scripts use beside submit and wait (SPEC §2b): many jobs
submitted at once, a fetch's own job's context, the hooks that say which
job, and the counts of statistics()."""

from __future__ import annotations

import threading
import time

import pytest

import batch
import store
from tests.helpers import TIMEOUT, Recorder, Script, raising

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


def runner(
    db: store.Store,
    fetch: batch.Fetch[batch.Caller],
    hooks: batch.Hooks | None = None,
    **config: object,
) -> batch.Runner[batch.Caller]:
    config.setdefault("retry_wait", 0.01)
    return batch.Runner(db, fetch, batch.Config(**config), hooks)  # type: ignore[arg-type]


# -- submit_many ---------------------------------------------------------------


def test_submit_many_joins_the_rotation_in_order(db: store.Store) -> None:
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


def test_submit_many_reports_the_depth_once(db: store.Store) -> None:
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
    db: store.Store, jobs: object, message: str
) -> None:
    """A bad list anywhere: InvalidJob naming the job's index (and the
    target's position), and not one of the jobs is stored."""
    with runner(db, Script()) as r:
        with pytest.raises(batch.InvalidJob) as raised:
            r.submit_many(ALICE, jobs)  # type: ignore[arg-type]
        assert str(raised.value) == message
        assert r.statistics().live == 0
    assert db.list_jobs() == []


def test_submit_many_of_no_job_stores_nothing(db: store.Store) -> None:
    with runner(db, Script()) as r:
        assert r.submit_many(ALICE, []) == []
        assert r.submit_many(ALICE, iter([])) == []
    assert db.list_jobs() == []


def test_submit_many_takes_any_iterable(db: store.Store) -> None:
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
    db: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that refuses the write: the caller gets the StoreError, no job
    is stored, and the runner's room is as before (a later submit joins)."""
    script = Script()
    hooks = Recorder()
    with runner(db, script, hooks, workers=1, max_live=2) as r:
        real = db.create_jobs

        def refused(*args: object, **kwargs: object) -> None:
            raise store.StoreError("disk full")

        monkeypatch.setattr(db, "create_jobs", refused)
        with pytest.raises(store.StoreError):
            r.submit_many(ALICE, [["a"], ["b"], ["c"]])
        assert db.list_jobs() == []
        monkeypatch.setattr(db, "create_jobs", real)
        ids = r.submit_many(ALICE, [["d"], ["e"]])
        assert hooks.depths[0] == 2  # both joined: no room was kept by the refused call
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done", "done"]


def test_submit_many_past_max_live_waits_in_order(db: store.Store) -> None:
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


def test_submit_many_after_close_is_refused(db: store.Store) -> None:
    r = runner(db, Script())
    r.close()
    with pytest.raises(batch.RunnerClosed):
        r.submit_many(ALICE, [["a"]])
    assert db.list_jobs() == []


# -- the context of a fetch's own job -------------------------------------------


def test_a_fetch_sees_its_own_job_cancelled_at_once(db: store.Store) -> None:
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


def test_close_cancels_every_fetch_context_with_reason_closed(db: store.Store) -> None:
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


def test_retry_is_told_each_busy_answer_that_will_be_tried_again(db: store.Store) -> None:
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


def test_no_retry_is_told_for_a_busy_answer_stored_failed(db: store.Store) -> None:
    script = Script()
    script.on("a", raising(batch.RetryLater("busy", after=60)))
    told = Told()
    with runner(db, script, told, retry_for=1.0) as r:
        job_id = r.submit(ALICE, ["a"])
        assert r.wait(ALICE, job_id, TIMEOUT).status == "failed"
    assert told.retries == []


def test_ended_names_each_job_once_whatever_ends_it(db: store.Store) -> None:
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
