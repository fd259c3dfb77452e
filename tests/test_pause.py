"""Pause (SPEC §2f): no new target starts for a paused caller or of a
paused upstream, on any runner of the store, until unpaused; what is in
flight finishes, and the jobs go on where they stopped."""

from __future__ import annotations

import pytest

import batch
import store
from batch.context import Context
from batch.rotation import LiveJob, Rotation
from tests.helpers import TIMEOUT, MakeRunner, Script, StepClock, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


def host(target: batch.Target) -> str:
    return target.ref.split("/")[0]


def test_a_paused_caller_starts_nothing_new_until_unpaused(
    db: store.Store, runner: MakeRunner
) -> None:
    """The target in flight finishes and is stored; the caller's next one
    waits, another caller's jobs go on; once unpaused, the job goes on
    where it stopped."""
    script = Script()
    with runner(db, script, workers=2) as r:
        script.hold("a1")
        a = r.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        r.pause(ALICE)
        script.release("a1")
        assert eventually(lambda: r.explain(ALICE, a)["state"] == "paused")
        assert r.explain(ALICE, a) == {
            "id": a,
            "status": "running",
            "state": "paused",
            "caller": "alice",
        }
        b = r.submit(BOB, ["b1", "b2"])
        assert r.wait(BOB, b, TIMEOUT).status == "done"
        assert [t.status for t in r.status(ALICE, a).targets] == ["done", "pending"]
        r.unpause(ALICE)
        assert r.wait(ALICE, a, TIMEOUT).status == "done"
    assert script.calls == ["a1", "b1", "b2", "a2"]


def test_a_paused_upstream_holds_the_jobs_whose_next_target_is_its(
    db: store.Store, runner: MakeRunner
) -> None:
    script = Script()
    known = {"slow.example": batch.Limit()}  # a pause names an upstream the runner knows
    with runner(db, script, workers=2, upstream=host, limits=known) as r:
        r.pause(upstream="slow.example")
        mixed = r.submit(ALICE, ["fast.example/1", "slow.example/2", "fast.example/3"])
        fast = r.submit(BOB, ["fast.example/4"])
        assert r.wait(BOB, fast, TIMEOUT).status == "done"
        assert eventually(lambda: r.explain(ALICE, mixed)["state"] == "paused")
        assert r.explain(ALICE, mixed)["upstream"] == "slow.example"
        assert "slow.example/2" not in script.calls
        r.unpause(upstream="slow.example")
        assert r.wait(ALICE, mixed, TIMEOUT).status == "done"
    assert script.calls.index("slow.example/2") < script.calls.index("fast.example/3")


def test_a_limited_upstream_first_met_while_paused_starts_once_unpaused(
    db: store.Store, runner: MakeRunner
) -> None:
    """A job's next target is of a limited upstream the runner first met
    while it was paused (so it told the store no job wanted it): once
    unpaused, the runner asks the store for its share at once, not at its
    next periodic sync. The runner's clock stands still here, so without
    that ask the target would never start: the stall the runner model
    found."""
    script = Script()
    clock = StepClock()
    limits = {"slow.example": batch.Limit(concurrency=1)}
    with runner(db, script, clock=clock, upstream=host, limits=limits) as r:
        script.hold("fast.example/1")
        r.pause(upstream="slow.example")
        job = r.submit(ALICE, ["fast.example/1", "slow.example/2"])
        script.started("fast.example/1")
        script.release("fast.example/1")
        assert eventually(lambda: r.explain(ALICE, job)["state"] == "paused")
        r.unpause(upstream="slow.example")
        assert r.wait(ALICE, job, TIMEOUT).status == "done"
    assert script.calls == ["fast.example/1", "slow.example/2"]


def test_every_runner_of_the_store_honours_a_pause(location: str) -> None:
    """A pause made through one runner holds the jobs of another (another
    handle on the store, as another process would have) from its next
    beat; so does the unpause."""
    script = Script()
    with (
        store.open(location) as mine,
        store.open(location) as theirs,
        batch.Runner(mine, Script()) as here,
        batch.Runner(theirs, script, batch.Config(takeover_after=0.3)) as there,
    ):
        script.hold("a1")
        job = there.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        here.pause(ALICE)
        assert eventually(lambda: ("caller", "alice") in there._s.pauses)
        script.release("a1")
        assert eventually(lambda: there.explain(ALICE, job)["state"] == "paused")
        assert script.calls == ["a1"]
        here.unpause(ALICE)
        assert there.wait(ALICE, job, TIMEOUT).status == "done"
    assert script.calls == ["a1", "a2"]


def test_a_pause_is_stored_and_outlives_the_runner(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    with runner(db, script, upstream=host, limits={"slow.example": batch.Limit()}) as first:
        first.pause("alice")
        first.pause(upstream="slow.example")
        first.pause("alice")  # again: it keeps the time it was first paused
    paused = db.paused()
    assert set(paused.callers) == {"alice"}
    assert set(paused.upstreams) == {"slow.example"}
    with runner(db, script) as second:
        job = second.submit(ALICE, ["a1"])
        assert eventually(lambda: second.explain(ALICE, job)["state"] == "paused")
        assert script.calls == []
        second.unpause("alice")
        assert second.wait(ALICE, job, TIMEOUT).status == "done"
    assert db.paused() == store.Paused({}, {"slow.example": paused.upstreams["slow.example"]})


def test_a_paused_job_is_cancelled_at_once(db: store.Store, runner: MakeRunner) -> None:
    script = Script()
    with runner(db, script) as r:
        r.pause(ALICE)
        job = r.submit(ALICE, ["a1"])
        assert eventually(lambda: r.explain(ALICE, job)["state"] == "paused")
        assert r.cancel(ALICE, job)
        assert r.wait(ALICE, job, TIMEOUT).status == "cancelled"
        assert r.statistics().live == 0
        r.unpause(ALICE)
    assert script.calls == []


def test_unpausing_what_is_not_paused_changes_nothing(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        r.unpause(ALICE, upstream="nowhere")
        job = r.submit(ALICE, ["a1"])
        assert r.wait(ALICE, job, TIMEOUT).status == "done"
    assert db.paused() == store.Paused()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "give a caller, an upstream, or both"),
        ({"caller": ""}, "caller is a non-empty str, not ''"),
        ({"upstream": 7}, "upstream is a non-empty str, not 7"),
    ],
)
def test_pause_of_nothing_or_of_a_bad_name_is_refused(
    db: store.Store, runner: MakeRunner, args: dict[str, object], message: str
) -> None:
    with runner(db, Script()) as r:
        with pytest.raises(TypeError) as raised:
            r.pause(**args)  # type: ignore[arg-type]
        assert str(raised.value) == message
        with pytest.raises(TypeError):
            r.unpause(**args)  # type: ignore[arg-type]
    assert db.paused() == store.Paused()


def test_a_held_job_keeps_its_turn_whether_or_not_a_pick_passed_it() -> None:
    """The turn after a pause is the rotation's, not the timing's: a pick
    that found a paused job (a worker woken by a beat, say) moves nothing."""

    def rotation(picked_while_paused: bool) -> list[str]:
        rot: Rotation[str] = Rotation()
        jobs = {
            name: LiveJob(
                name, owner, owner, [batch.Target("t")], 0.0, store.Lease("r", 1), Context()
            )
            for name, owner in [("a0", "alice"), ("b1", "bob"), ("b2", "bob")]
        }
        rot.add(jobs["a0"])
        rot.add(jobs["b1"])
        running = rot.pick(0.0)
        assert running is jobs["a0"]
        running.start()
        rot.pause(frozenset({("caller", "bob")}))
        if picked_while_paused:
            assert rot.pick(0.0) is None  # b1 held; a0 is running
        rot.add(jobs["b2"])
        rot.pause(frozenset())
        running.advance(True)
        rot.settle(running)
        return [job.id for job in iter(lambda: rot.pick(0.0), None)]

    assert rotation(picked_while_paused=True) == rotation(picked_while_paused=False)
    assert rotation(picked_while_paused=True) == ["b1", "b2"]


@pytest.mark.parametrize(
    ("paused", "upstream", "covered"),
    [
        ("http://127.0.0.1:8765", "http://127.0.0.1:8765", True),  # its own name
        ("127.0.0.1", "http://127.0.0.1:8765", True),  # its host: every port
        ("127.0.0.1:8765", "http://127.0.0.1:8765", True),  # host:port
        ("127.0.0.1:80", "http://127.0.0.1:8765", False),  # another port
        ("http://127.0.0.1:8765/docs/a.pdf", "http://127.0.0.1:8765", True),  # a URL of it
        ("https://127.0.0.1:8765/", "http://127.0.0.1:8765", False),  # another scheme
        ("Example.ORG", "https://example.org:443", True),  # a host in any case
        ("https://example.org/", "https://example.org:443", True),  # the scheme's port
        ("example.org", "https://www.example.org:443", False),  # not a subdomain
        ("[::1]", "http://[::1]:80", True),
        ("[::1]:80", "http://[::1]:80", True),
        ("slow.example", "slow.example", True),  # a name of the user's own
        ("Slow.example", "slow.example", False),  # ... as given, case and all
        ("slow", "slow.example", False),
    ],
)
def test_a_pause_covers_an_upstream_by_the_names_a_person_knows_it_by(
    paused: str, upstream: str, covered: bool
) -> None:
    assert store.jobs.pauses.covers(paused, upstream) is covered
