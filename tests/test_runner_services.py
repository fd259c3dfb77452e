"""What services and scripts use beside submit and wait (SPEC §2b): many jobs
submitted at once."""

from __future__ import annotations

import pytest

import batch
import store
from tests.helpers import TIMEOUT, Recorder, Script

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")


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
