"""The runner's contract: rules 1-5 of the workers design, as a user sees them."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

import batch
import store
from tests import pgserver
from tests.helpers import TIMEOUT, MakeRunner, Recorder, Script, fresh, raising

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


@pytest.fixture(params=["file", "memory", "postgres"])
def db(
    request: pytest.FixtureRequest, tmp_path: Path, pg_server: pgserver.Server | None
) -> Iterator[store.Store]:
    """Every runner test runs on a store file, an in-memory store, and a
    PostgreSQL database."""
    with contextlib.ExitStack() as stack:
        if request.param == "postgres":
            where = stack.enter_context(fresh("postgres", tmp_path, pg_server))
        else:
            where = str(tmp_path / "jobs.sqlite3") if request.param == "file" else ":memory:"
        yield stack.enter_context(store.open(where))


@pytest.fixture
def script() -> Script:
    return Script()


@pytest.fixture
def hooks() -> Recorder:
    return Recorder()


def statuses(job: batch.Job) -> list[str]:
    return [t.status for t in job.targets]


# -- rule 1: the rotation --------------------------------------------------


def test_round_robin_alternates_jobs_with_one_worker(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """With one worker, two live jobs take turns: a1 b1 a2 b2 a3 b3."""
    script.hold("a1")
    with runner(db, script, workers=1) as r:
        a = r.submit(ALICE, ["a1", "a2", "a3"])
        script.started("a1")
        b = r.submit(BOB, ["b1", "b2", "b3"])
        script.release("a1")
        assert r.wait(ALICE, a, TIMEOUT).status == "done"
        assert r.wait(BOB, b, TIMEOUT).status == "done"
    assert script.calls == ["a1", "b1", "a2", "b2", "a3", "b3"]


@pytest.mark.parametrize(
    ("fair", "weights", "order"),
    [
        ("job", None, "a1 b1 c1 d1 a2 b2 c2 d2 a3 d3"),
        ("caller", None, "a1 d1 b1 d2 c1 d3 a2 b2 c2 a3"),
        ("caller", {"alice": 2}, "a1 b1 d1 c1 a2 d2 b2 c2 d3 a3"),
    ],
    ids=["job", "caller", "weighted"],
)
def test_fair_says_who_takes_turns(
    db: store.Store,
    script: Script,
    fair: Literal["job", "caller"],
    weights: dict[str, int] | None,
    order: str,
) -> None:
    """Alice has three jobs and Bob one. Taking turns by job, Alice gets three
    turns to Bob's one; by caller, one each (Alice's jobs taking turns among
    themselves); weighted 2, Alice gets two in a row to Bob's one.

    Worker threads: each records its outcome before it picks again, so every
    job but the one in flight is ready at each pick. (An async runner's
    writer records outcomes while its loop picks: the model test steps it.)"""
    script.hold("a1")
    config = batch.Config(workers=1, fair=fair, weights=weights)
    with batch.Runner(db, script, config) as r:
        jobs = [(ALICE, r.submit(ALICE, ["a1", "a2", "a3"]))]
        script.started("a1")
        jobs += [(ALICE, r.submit(ALICE, ["b1", "b2"])), (ALICE, r.submit(ALICE, ["c1", "c2"]))]
        jobs.append((BOB, r.submit(BOB, ["d1", "d2", "d3"])))
        script.release("a1")
        for caller, job_id in jobs:
            assert r.wait(caller, job_id, TIMEOUT).status == "done"
    assert script.calls == order.split()


def test_newcomer_goes_next_when_only_job_is_in_flight(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """A job submitted while the only other job has a target in flight is next:
    the rotation does not start over before the newcomer's turn."""
    script.hold("a1")
    with runner(db, script, workers=1) as r:
        a = r.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        b = r.submit(ALICE, ["b1"])
        c = r.submit(ALICE, ["c1"])
        script.release("a1")
        for job_id in (a, b, c):
            r.wait(ALICE, job_id, TIMEOUT)
    assert script.calls == ["a1", "b1", "c1", "a2"]


@pytest.mark.parametrize("workers", [2, 4])
def test_each_job_is_serial_with_several_workers(
    db: store.Store, script: Script, workers: int, runner: MakeRunner
) -> None:
    """A job's target i+1 never starts before target i is stored, whatever the
    number of workers; the fetch itself checks the store."""
    violations: list[str] = []
    jobs: dict[str, str] = {}
    r = runner(db, script, workers=workers)

    def check(ctx: batch.Context, n: int, ref: str) -> object:
        name, i = ref.split("-")
        if int(i) > 0:
            job = r.status(ALICE, jobs[name])
            if job.targets[int(i) - 1].status == "pending":
                violations.append(ref)
        return ref

    refs = {name: [f"{name}-{i}" for i in range(15)] for name in "abcd"}
    for name_refs in refs.values():
        for ref in name_refs:
            script.on(ref, lambda ctx, n, ref=ref: check(ctx, n, ref))
    with r:
        for name, name_refs in refs.items():
            jobs[name] = r.submit(ALICE, name_refs)
        for job_id in jobs.values():
            assert r.wait(ALICE, job_id, TIMEOUT).status == "done"
    assert violations == []


def test_job_not_reached_stays_queued(db: store.Store, script: Script, runner: MakeRunner) -> None:
    """A job no worker has reached yet is ``queued``; a job a worker took up
    is stored ``running`` with the next commit (its fetch does not wait for
    it): here another job's outcome."""
    script.hold("a1")
    script.hold("b1")
    with runner(db, script, workers=2) as r:
        a = r.submit(ALICE, ["a1", "a2"])
        b = r.submit(ALICE, ["b1"])
        script.started("a1")
        script.started("b1")
        c = r.submit(ALICE, ["c1"])
        assert r.status(ALICE, c).status == "queued"
        script.release("b1")
        assert r.wait(ALICE, b, TIMEOUT).status == "done"
        assert r.status(ALICE, a).status == "running"
        script.release("a1")
        assert r.wait(ALICE, a, TIMEOUT).status == "done"
        assert r.wait(ALICE, c, TIMEOUT).status == "done"


# -- rule 2: one target ----------------------------------------------------


def test_busy_target_is_retried_after_retry_wait(
    db: store.Store, script: Script, hooks: Recorder, runner: MakeRunner
) -> None:
    """A target that raises RetryLater stays pending and is fetched again no
    sooner than retry_wait later; busy attempts are not stored."""
    starts: list[float] = []

    def busy_twice(ctx: batch.Context, n: int) -> object:
        starts.append(time.monotonic())
        if n <= 2:
            raise batch.RetryLater("upstream busy")
        return "ok"

    script.on("x", busy_twice)
    with runner(db, script, hooks, workers=2, retry_wait=0.05) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT)
    assert job.status == "done"
    assert job.targets[0].result == "ok"
    assert [b - a >= 0.05 for a, b in itertools.pairwise(starts)] == [True, True]
    assert len(hooks.targets) == 1


def test_busy_target_holds_no_worker(db: store.Store, script: Script, runner: MakeRunner) -> None:
    """With one worker, another job runs to the end while a busy target waits."""
    b_ended = threading.Event()

    def busy_until_b_ends(ctx: batch.Context, n: int) -> object:
        if not b_ended.is_set():
            raise batch.RetryLater("busy")
        return n

    script.on("a1", busy_until_b_ends)
    with runner(db, script, workers=1, retry_wait=0.001, retry_for=60) as r:
        a = r.submit(ALICE, ["a1"])
        b = r.submit(ALICE, ["b1", "b2", "b3"])
        assert r.wait(ALICE, b, TIMEOUT).status == "done"
        assert statuses(r.status(ALICE, a)) == ["pending"]
        b_ended.set()
        assert r.wait(ALICE, a, TIMEOUT).status == "done"


def test_busy_for_longer_than_retry_for_is_stored_failed(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """A target still busy after retry_for is stored failed with the busy
    error's text, and the job ends by rule 3."""
    script.on("x", raising(batch.RetryLater("rate limited")))
    with runner(db, script, workers=1, retry_wait=0.01, retry_for=0.05) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x", "y"]), TIMEOUT)
    assert job.status == "partial"
    failed = job.targets[0]
    assert (failed.status, failed.error) == ("failed", "rate limited")
    assert failed.hint is not None and "retry" in failed.hint
    assert script.calls.count("x") >= 2


def test_retry_later_is_found_in_the_exception_chain(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """A RetryLater wrapped by another exception (raise ... from) still means busy."""

    def wrapped(ctx: batch.Context, n: int) -> object:
        if n == 1:
            try:
                raise batch.RetryLater("busy")
            except batch.RetryLater as e:
                raise ConnectionError("wrapped") from e
        return "second try"

    script.on("x", wrapped)
    with runner(db, script, workers=1) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT)
    assert (job.status, job.targets[0].result) == ("done", "second try")


def test_unexpected_exception_is_stored_as_internal_error(
    db: store.Store, script: Script, caplog: pytest.LogCaptureFixture, runner: MakeRunner
) -> None:
    """A fetch that raises anything else stores ``internal error``, never the
    exception's text, which goes to the log."""

    def leak(ctx: batch.Context, n: int) -> object:
        raise RuntimeError("password=hunter2")

    script.on("x", leak)
    with caplog.at_level(logging.ERROR, logger="batch"), runner(db, script) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT)
    t = job.targets[0]
    assert (job.status, t.status, t.error, t.hint, t.result) == (
        "failed",
        "failed",
        "internal error",
        None,
        None,
    )
    assert "hunter2" in caplog.text
    with store.open(db.path) if db.path != ":memory:" else db as check:
        row = check.get_job(job.id, "alice")
        assert row is not None and "hunter2" not in repr(row)


def test_target_error_message_and_hint_are_stored(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """TargetError's message and hint are stored with the failed target."""

    def missing(ctx: batch.Context, n: int) -> object:
        raise batch.TargetError("no such document", hint="check the id")

    script.on("x", missing)
    with runner(db, script) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT)
    t = job.targets[0]
    assert (t.status, t.error, t.hint) == ("failed", "no such document", "check the id")


def test_target_error_wins_over_a_retry_later_it_wraps(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    """A fetch that turns a busy upstream into a TargetError has decided: failed."""

    def give_up(ctx: batch.Context, n: int) -> object:
        try:
            raise batch.RetryLater("busy")
        except batch.RetryLater as e:
            raise batch.TargetError("gave up", hint="later") from e

    script.on("x", give_up)
    with runner(db, script) as r:
        t = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT).targets[0]
    assert (t.status, t.error, t.hint) == ("failed", "gave up", "later")
    assert script.calls == ["x"]


def test_message_and_hint_that_are_not_plain_text_are_stored_as_text(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    script.on("x", raising(batch.TargetError("bad \udc00", hint={"a": 1})))  # type: ignore[arg-type]
    with runner(db, script) as r:
        t = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT).targets[0]
    assert (t.status, t.error, t.hint) == ("failed", "bad \\udc00", "{'a': 1}")


def test_a_result_with_a_lone_surrogate_round_trips(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    script.on("x", lambda ctx, n: {"name": "caf\udce9"})
    with runner(db, script) as r:
        t = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT).targets[0]
    assert (t.status, t.result) == ("done", {"name": "caf\udce9"})


@pytest.mark.parametrize("value", [{1, 2}, float("nan"), object()])
def test_result_that_is_not_json_is_stored_failed(
    db: store.Store, script: Script, value: object, runner: MakeRunner
) -> None:
    """A result that JSON cannot hold is stored failed with an error that says so."""
    script.on("x", lambda ctx, n: value)
    with runner(db, script) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["x"]), TIMEOUT)
    t = job.targets[0]
    assert t.status == "failed"
    assert t.error is not None and "JSON" in t.error


# -- rule 3: the terminal status -------------------------------------------


@pytest.mark.parametrize(
    ("fails", "status"),
    [((), "done"), (("t0", "t1", "t2"), "failed"), (("t1",), "partial")],
)
def test_terminal_status_follows_the_targets(
    db: store.Store,
    script: Script,
    hooks: Recorder,
    fails: tuple[str, ...],
    status: str,
    runner: MakeRunner,
) -> None:
    """All done -> done; all failed -> failed; a mix -> partial; the job and
    job_seconds hooks are called once."""
    for ref in fails:
        script.on(ref, raising(batch.TargetError("no")))
    with runner(db, script, hooks) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["t0", "t1", "t2"]), TIMEOUT)
        hooks.wait_for(lambda h: len(h.seconds) == 1)
    assert job.status == status
    assert hooks.jobs == [status]
    assert len(hooks.seconds) == 1 and hooks.seconds[0] >= 0
    assert [t.target.ref for t in job.targets] == ["t0", "t1", "t2"]


# -- rule 4: cancel --------------------------------------------------------


def test_cancel_of_a_queued_job(
    db: store.Store, script: Script, hooks: Recorder, runner: MakeRunner
) -> None:
    """A job cancelled before any target ran is cancelled at once, all its
    targets pending, and never starts."""
    script.hold("a1")
    with runner(db, script, hooks, workers=1) as r:
        a = r.submit(ALICE, ["a1"])
        script.started("a1")
        b = r.submit(BOB, ["b1", "b2"])
        assert r.cancel(BOB, b) is True
        assert r.status(BOB, b).status == "cancelled"
        script.release("a1")
        r.wait(ALICE, a, TIMEOUT)
        hooks.wait_for(lambda h: h.depths[-1:] == [0])
    assert statuses(r.status(BOB, b)) == ["pending", "pending"]
    assert "b1" not in script.calls
    assert sorted(hooks.jobs) == ["cancelled", "done"]
    assert len(hooks.seconds) == 1


def test_cancel_with_a_target_in_flight(
    db: store.Store, script: Script, hooks: Recorder, runner: MakeRunner
) -> None:
    """Cancel takes effect at once; the target in flight finishes and is
    stored; the status stays cancelled; later targets stay pending."""
    script.hold("a1")
    with runner(db, script, hooks, workers=2) as r:
        a = r.submit(ALICE, ["a1", "a2", "a3"])
        script.started("a1")
        assert r.cancel(ALICE, a) is True
        assert r.status(ALICE, a).status == "cancelled"
        assert r.wait(ALICE, a, TIMEOUT).status == "cancelled"
        assert r.cancel(ALICE, a) is False
        script.release("a1")
        hooks.wait_for(lambda h: len(h.targets) == 1 and h.depths[-1:] == [0])
        job = r.status(ALICE, a)
    assert job.status == "cancelled"
    assert statuses(job) == ["done", "pending", "pending"]
    assert script.calls == ["a1"]
    assert hooks.jobs == ["cancelled"]
    assert hooks.seconds == []


def test_cancel_returns_false_for_unknown_foreign_and_terminal_jobs(
    db: store.Store, script: Script, runner: MakeRunner
) -> None:
    with runner(db, script) as r:
        a = r.submit(ALICE, ["a1"])
        r.wait(ALICE, a, TIMEOUT)
        b = r.submit(ALICE, ["b1"])
        assert r.cancel(ALICE, "no-such-job") is False
        assert r.cancel(BOB, b) is False
        assert r.cancel(ALICE, a) is False
        assert r.wait(ALICE, b, TIMEOUT).status == "done"


# -- rule 5: the gauges ----------------------------------------------------


def test_depth_and_inflight_see_every_change(
    db: store.Store, script: Script, hooks: Recorder, runner: MakeRunner
) -> None:
    """depth gets the live-job count and inflight the in-flight count on every change."""
    script.hold("a1")
    with runner(db, script, hooks, workers=1) as r:
        a = r.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        b = r.submit(ALICE, ["b1", "b2"])
        script.release("a1")
        r.wait(ALICE, a, TIMEOUT)
        r.wait(ALICE, b, TIMEOUT)
        hooks.wait_for(lambda h: h.depths[-1:] == [0])
    assert hooks.depths == [1, 2, 1, 0]
    assert hooks.inflights == [1, 0] * 4
    assert hooks.jobs == ["done", "done"]


def test_a_hook_that_raises_changes_nothing(
    db: store.Store, script: Script, caplog: pytest.LogCaptureFixture, runner: MakeRunner
) -> None:
    """Every hook raising: logged, and the jobs still end as they should."""

    class Broken(batch.Hooks):
        def depth(self, live: int) -> None:
            raise ValueError("depth")

        def inflight(self, n: int) -> None:
            raise ValueError("inflight")

        def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
            raise ValueError("target")

        def job(self, status: str) -> None:
            raise ValueError("job")

        def job_seconds(self, seconds: float) -> None:
            raise ValueError("job_seconds")

    with caplog.at_level(logging.ERROR, logger="batch"), runner(db, script, Broken()) as r:
        ids = [r.submit(ALICE, ["x", "y"]) for _ in range(3)]
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done"] * 3
        assert r.cancel(ALICE, r.submit(ALICE, ["z"])) in (True, False)
    assert "hook" in caplog.text


def test_statistics_is_a_snapshot(
    db: store.Store, script: Script, hooks: Recorder, runner: MakeRunner
) -> None:
    """statistics() counts live jobs, targets in flight and jobs waiting on a retry."""
    script.hold("a1")
    script.on("b1", raising(batch.RetryLater("busy")))
    with runner(db, script, hooks, workers=2, retry_wait=60, retry_for=600) as r:
        r.submit(ALICE, ["a1"])
        script.started("a1")
        r.submit(ALICE, ["b1"])
        hooks.wait_for(lambda h: h.inflights == [1, 2, 1] and len(h.retries) == 1)  # b1 busy
        stats = r.statistics()
        with pytest.raises(AttributeError):
            stats.live = 0  # type: ignore[misc]
        script.release("a1")
    assert stats == batch.Statistics(
        workers=2, live=2, inflight=1, waiting_retry=1, closed=False, stored=0, retries=1, ended={}
    )
    after = r.statistics()
    assert (after.closed, after.stored, after.retries, dict(after.ended)) == (
        True,
        1,
        1,
        {"done": 1},
    )
