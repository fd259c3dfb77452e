"""The runner's edges: close, eviction, ownership and bad input."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, Recorder, Script, raising

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


# -- close -----------------------------------------------------------------


def test_close_cancels_a_fetch_waiting_on_its_context(db: store.Store, runner: MakeRunner) -> None:
    """close() cancels the context a fetch waits on, stores what that fetch
    returns, starts nothing more, and leaves the rest pending and live."""
    started = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        if target.ref == "slow":
            started.set()
            return {"cancelled": ctx.wait(TIMEOUT)}
        return "fast"

    r = runner(db, fetch, workers=1)
    job_id = r.submit(ALICE, ["slow", "next"])
    assert started.wait(TIMEOUT)
    r.close()
    job = r.status(ALICE, job_id)
    assert job.status == "running"
    assert [(t.status, t.result) for t in job.targets] == [
        ("done", {"cancelled": True}),
        ("pending", None),
    ]
    r.close()  # idempotent
    with pytest.raises(batch.RunnerClosed):
        r.submit(ALICE, ["x"])
    with pytest.raises(batch.RunnerClosed):
        r.wait(ALICE, job_id, TIMEOUT)
    assert r.statistics() == batch.Statistics(
        workers=0, live=1, inflight=0, waiting_retry=0, closed=True, stored=1
    )


def test_close_ends_a_job_whose_last_target_was_in_flight(
    db: store.Store, runner: MakeRunner
) -> None:
    """A job whose last target returns during close still ends by rule 3, and
    a waiter sees it end."""
    started = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        started.set()
        ctx.wait(TIMEOUT)
        return "late"

    r = runner(db, fetch, workers=1)
    job_id = r.submit(ALICE, ["only"])
    assert started.wait(TIMEOUT)
    r.close()
    assert r.wait(ALICE, job_id, TIMEOUT).status == "done"


def test_close_with_a_timeout_reports_a_stuck_fetch(db: store.Store, runner: MakeRunner) -> None:
    """close(timeout) raises TimeoutError while a fetch ignores its context;
    a later close() waits for it."""
    release = threading.Event()
    started = threading.Event()

    def stubborn(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        started.set()
        release.wait(TIMEOUT)
        return None

    r = runner(db, stubborn, workers=1)
    r.submit(ALICE, ["x"])
    assert started.wait(TIMEOUT)
    with pytest.raises(TimeoutError):
        r.close(timeout=0.01)
    release.set()
    r.close()


def test_close_that_cannot_have_the_runner_at_once_still_starts_nothing_more(
    db: store.Store, runner: MakeRunner
) -> None:
    """close(timeout=0) while a hook holds the runner raises TimeoutError,
    and closing has begun all the same: the fetch in flight sees its context
    cancelled, and once it returns no further target starts."""
    in_hook, let_hook_go = threading.Event(), threading.Event()
    started, release, stored = threading.Event(), threading.Event(), threading.Event()
    fetched: list[str] = []

    class Holding(batch.Hooks):
        def depth(self, live: int) -> None:
            if live == 2:  # the second job joins: hold the runner
                in_hook.set()
                let_hook_go.wait(TIMEOUT)

        def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
            stored.set()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        fetched.append(target.ref)
        started.set()
        release.wait(TIMEOUT)
        return {"cancelled": ctx.cancelled()}

    r = runner(db, fetch, Holding(), workers=1)
    job_id = r.submit(ALICE, ["a0", "a1"])
    assert started.wait(TIMEOUT)
    submitting = threading.Thread(target=r.submit, args=(BOB, ["b0"]))
    submitting.start()
    assert in_hook.wait(TIMEOUT)
    with pytest.raises(TimeoutError, match="hook held the runner"):
        r.close(timeout=0)
    let_hook_go.set()
    submitting.join(TIMEOUT)
    release.set()
    assert stored.wait(TIMEOUT)
    # The worker that stored a0 picks under the same hold of the runner's
    # lock: once statistics() has the lock, that pick was made.
    assert r.statistics().inflight == 0
    r.close(timeout=TIMEOUT)
    assert fetched == ["a0"]
    job = r.status(ALICE, job_id)
    assert [(t.status, t.result) for t in job.targets] == [
        ("done", {"cancelled": True}),
        ("pending", None),
    ]


def test_wait_times_out(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    script.hold("x")
    with runner(db, script) as r:
        job_id = r.submit(ALICE, ["x"])
        with pytest.raises(TimeoutError):
            r.wait(ALICE, job_id, timeout=0.01)
        script.release("x")
        assert r.wait(ALICE, job_id, TIMEOUT).status == "done"


@pytest.mark.parametrize(
    ("timeout", "error"), [(-1, ValueError), (float("nan"), ValueError), ("5", TypeError)]
)
def test_wait_refuses_a_bad_timeout(
    db: store.Store, timeout: object, error: type, runner: MakeRunner
) -> None:
    with runner(db, Script()) as r:
        job_id = r.submit(ALICE, ["x"])
        with pytest.raises(error, match="timeout"):
            r.wait(ALICE, job_id, timeout)  # type: ignore[arg-type]


def test_wait_takes_a_huge_timeout(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        assert r.wait(ALICE, r.submit(ALICE, ["x"]), 1e300).status == "done"


# -- store faults ----------------------------------------------------------


def test_a_store_write_that_fails_is_retried_and_loses_no_worker(
    db: store.Store,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    runner: MakeRunner,
) -> None:
    """A target outcome the store refuses (locked, disk full) is written again
    with backoff until the store takes it: fetched once, stored once; the
    worker lives on and memory and disk agree throughout. The first failure
    is logged as a warning (with its traceback), not every try, and the
    first try that succeeds says how many failed."""
    real = Ledger.of(db).store_targets
    failures = iter([True, True, True])

    def flaky(outcomes: object, *args: object, **kwargs: object) -> object:
        # Outcomes only: the keeper's own write of ``running`` (no outcome)
        # may come first on a slow host, and has its own warning.
        if outcomes and next(failures, False):
            raise store.StoreError("database is locked")
        return real(outcomes, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Ledger.of(db), "store_targets", flaky)
    script = Script()
    with runner(db, script, workers=1) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["a", "b"]), TIMEOUT)
        assert r.statistics().workers == 1
    assert job.status == "done"
    assert script.calls == ["a", "b"]
    assert caplog.text.count("outcome(s); trying again") == 1
    assert "after 3 failed tries" in caplog.text


def test_close_returns_while_the_store_refuses_writes(
    db: store.Store,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    runner: MakeRunner,
) -> None:
    """A store that refuses every write does not hold close(): the outcome is
    dropped, the target stays pending (and the job live) for the next runner."""
    refused = threading.Event()

    def broken(*args: object, **kwargs: object) -> object:
        refused.set()
        raise store.StoreError("disk full")

    monkeypatch.setattr(Ledger.of(db), "store_targets", broken)
    r = runner(db, Script(), workers=1)
    job_id = r.submit(ALICE, ["a"])
    assert refused.wait(TIMEOUT)
    r.close(timeout=TIMEOUT)
    job = r.status(ALICE, job_id)
    assert (job.status, job.targets[0].status) == ("queued", "pending")  # nothing stored
    assert "dropped" in caplog.text


# -- eviction --------------------------------------------------------------


def test_eviction_removes_oldest_terminal_jobs_and_keeps_live_ones(
    db: store.Store, runner: MakeRunner
) -> None:
    """Past max_bytes, the least recently touched terminal jobs go first; a
    live job is never evicted; touch moves a job to the back of the line."""
    script = Script()
    with runner(db, script, workers=1, max_bytes=40) as r:
        old = r.submit(ALICE, ["old"])  # result {"ref":"old"}: 13 bytes
        r.wait(ALICE, old, TIMEOUT)
        kept = r.submit(ALICE, ["kept"])
        r.wait(ALICE, kept, TIMEOUT)
        r.touch(ALICE, old)  # now "kept" is the least recently touched
        script.hold("live-1")
        live = r.submit(ALICE, ["live-0", "live-1"])
        script.started("live-1")  # live-0 stored: 13 + 14 + 16 bytes -> evict one
        with pytest.raises(batch.JobNotFound):
            r.status(ALICE, kept)
        assert r.status(ALICE, old).status == "done"
        script.release("live-1")
        assert r.wait(ALICE, live, TIMEOUT).status == "done"  # live-1: 45 bytes -> evict old
        with pytest.raises(batch.JobNotFound):
            r.status(ALICE, old)
    assert Ledger.of(db).total_bytes() == 32


def test_live_jobs_survive_a_budget_they_alone_exceed(db: store.Store, runner: MakeRunner) -> None:
    """A live job is never evicted; once it ends, the budget holds again in
    the same commit."""
    script = Script()
    script.hold("b")
    hooks = Recorder()
    with runner(db, script, hooks, workers=1, max_bytes=0) as r:
        job_id = r.submit(ALICE, ["a", "b"])
        script.started("b")
        assert r.status(ALICE, job_id).targets[0].status == "done"
        script.release("b")
        hooks.wait_for(lambda h: h.jobs == ["done"])
        with pytest.raises(batch.JobNotFound):
            r.status(ALICE, job_id)
    assert Ledger.of(db).total_bytes() == 0


# -- ownership -------------------------------------------------------------


def test_another_callers_job_looks_unknown(db: store.Store, runner: MakeRunner) -> None:
    """Status, touch and wait on another caller's job raise the same error, with
    the same message, as on an id that does not exist."""
    with runner(db, Script()) as r:
        job_id = r.submit(ALICE, ["x"])
        r.wait(ALICE, job_id, TIMEOUT)
        for call in (r.status, r.touch, r.wait):
            with pytest.raises(batch.JobNotFound) as foreign:
                call(BOB, job_id)
            with pytest.raises(batch.JobNotFound) as unknown:
                call(BOB, "0" * 32)
            assert str(foreign.value) == str(unknown.value).replace("0" * 32, job_id)
        assert isinstance(foreign.value, LookupError)


# -- bad input -------------------------------------------------------------


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ([], "at least one target"),
        ("doc-1", "list of str"),
        (42, "list of str"),
        (["ok", 7], "target 1: expected a str or batch.Target, not int"),
        (["ok", ""], "target 1: a target ref must not be empty"),
        (["a\x00b"], "NUL"),
        (["\udcff"], "surrogates"),
        (["x" * 9000], "bytes long"),
        ([f"t{i}" for i in range(11)], "at most 10 targets"),
        ((f"t{i}" for i in range(10**9)), "at most 10 targets"),
    ],
)
def test_bad_target_lists_are_refused_and_store_nothing(
    db: store.Store, targets: object, message: str, runner: MakeRunner
) -> None:
    hooks = Recorder()
    with runner(db, Script(), hooks, max_targets=10) as r:
        with pytest.raises(batch.InvalidJob, match=message) as e:
            r.submit(ALICE, targets)  # type: ignore[arg-type]
        assert isinstance(e.value, ValueError)
        assert r.statistics().live == 0
    assert hooks.depths == []
    assert Ledger.of(db).total_bytes() == 0


@pytest.mark.parametrize("caller", [object(), batch.Caller.__new__(batch.Caller), 5])
def test_a_caller_needs_a_string_id(db: store.Store, caller: object, runner: MakeRunner) -> None:
    with runner(db, Script()) as r, pytest.raises(TypeError, match="non-empty str attribute 'id'"):
        r.submit(caller, ["x"])  # type: ignore[arg-type]


def test_caller_with_empty_id_is_refused() -> None:
    with pytest.raises(TypeError, match="non-empty"):
        batch.Caller("")


def test_job_id_must_be_a_string(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r, pytest.raises(TypeError, match="job id is a str"):
        r.status(ALICE, 12)  # type: ignore[arg-type]


def test_a_job_id_that_cannot_exist_is_unknown(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        for call in (r.status, r.touch, r.wait):
            with pytest.raises(batch.JobNotFound):
                call(ALICE, "\udcff")
        assert r.cancel(ALICE, "\udcff") is False


def test_a_caller_id_that_cannot_be_stored_is_refused(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r, pytest.raises(TypeError, match="non-empty str"):
        r.submit(batch.Caller.__new__(batch.Caller), ["x"])
    with pytest.raises(TypeError):
        batch.Caller("\udcff")


@pytest.mark.parametrize("path", [None, b"jobs.sqlite3", 123])
def test_store_open_refuses_a_path_that_is_not_text(tmp_path: Path, path: object) -> None:
    with pytest.raises(TypeError, match="store path"):
        store.open(path)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("workers", 0, ValueError),
        ("workers", 1.5, TypeError),
        ("workers", True, TypeError),
        ("retry_wait", -1, ValueError),
        ("retry_for", float("inf"), ValueError),
        ("retry_wait", "1", TypeError),
        ("max_bytes", -1, ValueError),
        ("max_targets", 0, ValueError),
        ("fair", "tenant", ValueError),
    ],
)
def test_config_is_validated(field: str, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"Config\.{field}"):
        batch.Config(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fair", "weights", "error", "says"),
    [
        ("job", {"alice": 2}, ValueError, "needs fair='caller'"),
        ("caller", ["alice"], TypeError, "must be a mapping"),
        ("caller", {"alice": 0}, ValueError, r"weights\['alice'\] must be an int >= 1"),
        ("caller", {"alice": 1.5}, ValueError, "must be an int >= 1"),
        ("caller", {"alice": True}, ValueError, "must be an int >= 1"),
        ("caller", {"": 2}, TypeError, "caller ids"),
        ("caller", {7: 2}, TypeError, "caller ids"),
    ],
)
def test_weights_are_validated(
    fair: str, weights: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        batch.Config(fair=fair, weights=weights)  # type: ignore[arg-type]


def test_runner_refuses_what_is_not_a_store_or_a_fetch(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"store\.Store"):
        batch.Runner("jobs.sqlite3", Script())  # type: ignore[arg-type]
    with store.open(tmp_path / "s.sqlite3") as db, pytest.raises(TypeError, match="callable"):
        batch.Runner(db, "fetch")  # type: ignore[arg-type]


def test_readme_example_runs_to_done(tmp_path: Path) -> None:
    """The shape of the README's example: submit, status, touch, wait."""

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        return {"ref": target.ref, "size": len(target.ref)}

    with (
        store.open(tmp_path / "jobs.sqlite3") as db,
        batch.Runner(db, fetch, batch.Config(workers=4), hooks=batch.Hooks()) as r,
    ):
        job_id = r.submit(ALICE, ["doc-1", batch.Target("doc-2")])
        r.status(ALICE, job_id)
        r.touch(ALICE, job_id)
        job = r.wait(ALICE, job_id, timeout=TIMEOUT)
    assert job.status == "done"
    assert [t.result for t in job.targets] == [
        {"ref": "doc-1", "size": 5},
        {"ref": "doc-2", "size": 5},
    ]


# -- the wait an upstream asks for (RetryLater.after) ---------------------------


def test_retry_later_after_holds_the_next_try_back_that_long(
    db: store.Store, runner: MakeRunner
) -> None:
    """A busy upstream that says how long to wait is not asked again sooner,
    even when retry_wait is shorter."""
    tries: list[float] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise batch.RetryLater("429 Too Many Requests", after=0.2)
        return "ok"

    with runner(db, fetch, workers=2, retry_wait=0.001) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["a"]), TIMEOUT)
    assert job.status == "done"
    assert tries[1] - tries[0] >= 0.2


def test_retry_later_after_past_retry_for_fails_at_once(
    db: store.Store, runner: MakeRunner
) -> None:
    """Waiting as long as the upstream asks would outlast retry_for: the
    target fails now, with a hint saying so, instead of holding its job."""
    script = Script()
    script.on("a", raising(batch.RetryLater("busy", after=120)))
    with runner(db, script, retry_for=60) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["a"]), TIMEOUT)
    assert job.status == "failed"
    assert job.targets[0].error == "busy"
    assert job.targets[0].hint == (
        "the upstream asked to wait 120s, past retry_for=60s; try again later"
    )


@pytest.mark.parametrize(
    ("after", "error"),
    [(-1, ValueError), (math.inf, ValueError), ("1", TypeError), (True, TypeError)],
)
def test_retry_later_refuses_a_bad_after(after: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="after"):
        batch.RetryLater("busy", after=after)  # type: ignore[arg-type]


def test_a_cancelled_job_whose_outcome_is_dropped_at_close_leaves(
    db: store.Store, monkeypatch: pytest.MonkeyPatch, runner: MakeRunner
) -> None:
    """A job cancelled with its target in flight, whose outcome the store
    then refuses until close drops it, still leaves the rotation: it is
    over (cancelled in the store), and nothing keeps its caller."""
    refused = threading.Event()

    def broken(*args: object, **kwargs: object) -> object:
        refused.set()
        raise store.StoreError("disk full")

    script, hooks = Script(), Recorder()
    script.hold("a")
    r = runner(db, script, hooks, workers=1)
    job_id = r.submit(ALICE, ["a", "b"])
    script.started("a")
    assert r.cancel(ALICE, job_id)
    monkeypatch.setattr(Ledger.of(db), "store_targets", broken)
    script.release("a")
    assert refused.wait(TIMEOUT)
    r.close(timeout=TIMEOUT)
    assert r.statistics().live == 0
    assert hooks.depths[-1] == 0
    assert r.status(ALICE, job_id).status == "cancelled"
