"""Jobs that start later (SPEC §2f): ``not_before`` a time, ``after`` other
jobs (``after_ok``: only if they ended done). Times are the store's clock,
moved by the test, but where a test measures when a job starts."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, ChildProcess, Clock, MakeRunner, Recorder, Script, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")

#: Runners that beat every 0.1 s: a job freed by the store's clock moving
#: is taken within that.
QUICK = {"takeover_after": 0.3}


def failing(ctx: batch.Context, n: int) -> object:
    raise batch.TargetError("no such thing")


def test_a_job_waits_queued_for_its_time(db: store.Store, clock: Clock, runner: MakeRunner) -> None:
    script = Script()
    with runner(db, script, **QUICK) as r:
        job = r.submit(ALICE, ["a"], not_before=clock.now + 60)
        assert r.explain(ALICE, job) == {
            "id": job,
            "status": "queued",
            "state": "later",
            "not_before": clock.now + 60,
        }
        other = r.submit(ALICE, ["b"])
        r.wait(ALICE, other, TIMEOUT)
        assert r.status(ALICE, job).status == "queued"
        assert r.status(ALICE, job).not_before == clock.now + 60
        clock.tick(61)
        assert r.wait(ALICE, job, TIMEOUT).status == "done"
    assert script.calls == ["b", "a"]


def test_a_time_past_is_no_wait(db: store.Store, clock: Clock, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        job = r.submit(ALICE, ["a"], not_before=clock.now - 1)
        assert r.wait(ALICE, job, TIMEOUT).status == "done"


def test_no_target_starts_before_its_time(location: str) -> None:
    """By the real clock: the fetch starts at not_before or after, and soon
    after (the runner beats at the time it knows)."""
    started: list[float] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        started.append(time.time())

    with store.open(location) as db, batch.Runner(db, fetch) as r:
        at = time.time() + 0.3
        job = r.submit(ALICE, ["a"], not_before=at)
        r.wait(ALICE, job, TIMEOUT)
    assert at <= started[0] < at + 1.0


def test_a_job_after_others_starts_once_they_all_ended(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    with runner(db, script, workers=2) as r:
        script.hold("a", "b")
        a = r.submit(ALICE, ["a"])
        b = r.submit(ALICE, ["b"])
        c = r.submit(ALICE, ["c"], after=[a, b, a])
        script.started("a")
        script.started("b")
        assert r.explain(ALICE, c) == {
            "id": c,
            "status": "queued",
            "state": "later",
            "not_before": None,
            "waits_after": 2,
        }
        assert sorted(Ledger.of(db).after_of(c)) == sorted([a, b])
        script.release("a")
        r.wait(ALICE, a, TIMEOUT)
        assert eventually(lambda: r.explain(ALICE, c).get("waits_after") == 1)
        assert "c" not in script.calls
        script.release("b")
        assert r.wait(ALICE, c, TIMEOUT).status == "done"
    assert script.calls[-1] == "c"


def test_after_ok_runs_only_after_jobs_done(db: store.Store, runner: MakeRunner) -> None:
    """One of them failed: the job ends cancelled, saying which (and the
    hooks are told); a plain ``after`` runs all the same; after jobs all
    done, it runs."""
    script = Script()
    script.on("bad", failing)
    hooks = Recorder()
    with runner(db, script, hooks) as r:
        good = r.submit(ALICE, ["good"])
        bad = r.submit(ALICE, ["bad"])
        ok = r.submit(ALICE, ["ok"], after=[good], after_ok=True)
        unmet = r.submit(ALICE, ["unmet"], after=[good, bad], after_ok=True)
        anyway = r.submit(ALICE, ["anyway"], after=[bad])
        assert r.wait(ALICE, ok, TIMEOUT).status == "done"
        assert r.wait(ALICE, anyway, TIMEOUT).status == "done"
        job = r.wait(ALICE, unmet, TIMEOUT)
    assert job.status == "cancelled"
    assert job.reason == f"job {bad} it waited after ended failed"
    # Told once, by the runner whose beat ended it.
    assert sorted(hooks.jobs) == ["cancelled", "done", "done", "done", "failed"]
    assert [t.status for t in job.targets] == ["pending"]
    assert "unmet" not in script.calls


def test_a_job_after_jobs_that_ended_already_runs_at_once(
    db: store.Store, runner: MakeRunner
) -> None:
    with runner(db, Script()) as r:
        a = r.submit(ALICE, ["a"])
        r.wait(ALICE, a, TIMEOUT)
        b = r.submit(ALICE, ["b"], after=[a], after_ok=True)
        assert r.wait(ALICE, b, TIMEOUT).status == "done"


def test_cancels_before_and_after(db: store.Store, clock: Clock, runner: MakeRunner) -> None:
    """A job that waits is cancelled at once and never runs; a cancelled
    job lets the jobs after it go (and ends those after_ok)."""
    script = Script()
    with runner(db, script, **QUICK) as r:
        later = r.submit(ALICE, ["later"], not_before=clock.now + 60)
        assert r.cancel(ALICE, later)
        assert r.wait(ALICE, later, TIMEOUT).status == "cancelled"
        first = r.submit(ALICE, ["first"], not_before=clock.now + 60)
        plain = r.submit(ALICE, ["plain"], after=[first])
        strict = r.submit(ALICE, ["strict"], after=[first], after_ok=True)
        assert r.cancel(ALICE, first)
        assert r.wait(ALICE, plain, TIMEOUT).status == "done"
        assert r.wait(ALICE, strict, TIMEOUT).status == "cancelled"
        clock.tick(61)
    assert script.calls == ["plain"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after": ["nope"]}, "no job 'nope' to wait after"),
        ({"after": "abc"}, "after is a list of job ids, not str"),
        ({"after": [7]}, "a job id is a str, not int"),
        ({"after_ok": True}, "after_ok=True needs the jobs to wait after (after=[...])"),
        ({"after_ok": 1}, "after_ok is a bool, not int"),
        ({"not_before": "soon"}, "not_before is an epoch time (seconds) or None, not 'soon'"),
        ({"not_before": float("inf")}, "not_before is an epoch time (seconds) or None, not inf"),
    ],
)
def test_bad_later_is_refused_and_nothing_stored(
    db: store.Store, runner: MakeRunner, kwargs: dict[str, object], message: str
) -> None:
    with runner(db, Script()) as r:
        with pytest.raises(batch.InvalidJob) as raised:
            r.submit(ALICE, ["a"], **kwargs)  # type: ignore[arg-type]
        assert str(raised.value) == message
        assert r.statistics().live == 0
    assert db.list_jobs() == []


def test_another_callers_job_is_no_job_to_wait_after(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        bobs = r.submit(BOB, ["b"])
        with pytest.raises(batch.InvalidJob):
            r.submit(ALICE, ["a"], after=[bobs])
        r.wait(BOB, bobs, TIMEOUT)
    assert [j.owner for j in db.list_jobs()] == ["bob"]


def test_submit_many_later_holds_for_every_job(
    db: store.Store, clock: Clock, runner: MakeRunner
) -> None:
    script = Script()
    with runner(db, script, **QUICK) as r:
        ids = r.submit_many(ALICE, [["a"], ["b"]], not_before=clock.now + 10)
        assert [r.explain(ALICE, i)["state"] for i in ids] == ["later", "later"]
        clock.tick(11)
        assert [r.wait(ALICE, i, TIMEOUT).status for i in ids] == ["done", "done"]
    assert sorted(script.calls) == ["a", "b"]


#: A runner in a process of its own: it submits one job whose fetch waits
#: until the parent says "go" on its stdin, and says the job's id.
HOLDER = textwrap.dedent(
    """
    import json, sys, threading
    import batch, store

    go = threading.Event()

    def fetch(ctx, caller, target):
        go.wait(60)
        return "held"

    with store.open(sys.argv[1]) as db, batch.Runner(db, fetch) as runner:
        caller = batch.Caller("alice")
        job = runner.submit(caller, ["held"])
        print(json.dumps({"job": job}), flush=True)
        sys.stdin.readline()
        go.set()
        runner.wait(caller, job, 60)
        print(json.dumps({"ended": True}), flush=True)
        sys.stdin.readline()
    """
)


def test_a_job_after_one_another_process_runs(location: str, tmp_path: Path) -> None:
    """The job waited after runs in another process; the one after it,
    submitted here, starts here once that one ended there."""
    holder = ChildProcess(
        "holder", [sys.executable, "-c", HOLDER, location], tmp_path / "holder.err"
    )
    script = Script()
    try:
        held = holder.read("job")["job"]
        with store.open(location) as db, batch.Runner(db, script, batch.Config(**QUICK)) as r:
            after = r.submit(ALICE, ["after"], after=[held], after_ok=True)
            assert r.explain(ALICE, after)["state"] == "later"
            holder.send("go")
            holder.read("ended")
            assert r.wait(ALICE, after, TIMEOUT).status == "done"
            assert [t.result for t in r.status(ALICE, held).targets] == ["held"]
            assert Ledger.of(db).after_of(after) == [held]
        holder.send("bye")
        assert holder.proc.wait(TIMEOUT) == 0, holder.stderr()
    finally:
        holder.reap()
    assert script.calls == ["after"]
