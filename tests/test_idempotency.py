"""Idempotent submit (SPEC §2f): one job per caller and key, whoever
submits it, in any thread or process; the second submit gets the first
job's id and stores nothing."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import batch
import store
from tests.helpers import TIMEOUT, ChildProcess, MakeRunner, Recorder, Script, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")


def test_a_key_used_again_gives_the_first_job_whatever_its_state(
    db: store.Store, runner: MakeRunner
) -> None:
    """Live, done or cancelled: the first job's id, nothing stored, nothing
    run again, and the job keeps its key."""
    script = Script()
    with runner(db, script, workers=1) as r:
        script.hold("a")
        first = r.submit(ALICE, ["a"], idempotency_key="order-1")
        script.started("a")
        assert r.submit(ALICE, ["a"], idempotency_key="order-1") == first
        script.release("a")
        assert r.wait(ALICE, first, TIMEOUT).status == "done"
        assert r.submit(ALICE, ["a"], idempotency_key="order-1") == first
        other = r.submit(ALICE, ["b"], idempotency_key="order-2")
        r.wait(ALICE, other, TIMEOUT)
        assert r.submit(ALICE, ["b"], idempotency_key="order-2") == other
        assert r.status(ALICE, first).key == "order-1"
    assert script.calls == ["a", "b"]
    assert [j.id for j in db.list_jobs()] == [first, other]


def test_a_key_reused_with_other_targets_gives_the_first_job_unchanged(
    db: store.Store, runner: MakeRunner
) -> None:
    with runner(db, Script()) as r:
        first = r.submit(ALICE, ["a", "b"], idempotency_key="k")
        r.wait(ALICE, first, TIMEOUT)
        assert r.submit(ALICE, ["x"], idempotency_key="k", name="other") == first
        job = r.status(ALICE, first)
    assert [t.target.ref for t in job.targets] == ["a", "b"]
    assert job.name is None


def test_keys_are_each_callers_own(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        a = r.submit(ALICE, ["a"], idempotency_key="k")
        b = r.submit(BOB, ["a"], idempotency_key="k")
        assert a != b
        assert r.wait(BOB, b, TIMEOUT).key == "k"
        with pytest.raises(batch.JobNotFound):
            r.status(BOB, a)


def test_submit_many_gives_each_job_its_keys_job(db: store.Store, runner: MakeRunner) -> None:
    """Per job: a key used before gives that job, one used earlier in the
    same call gives the earlier job, None always makes a new job; only the
    jobs made run, in order."""
    script = Script()
    with runner(db, script, workers=1) as r:
        old = r.submit(ALICE, ["old"], idempotency_key="k0")
        r.wait(ALICE, old, TIMEOUT)
        ids = r.submit_many(
            ALICE,
            [["a"], ["b"], ["c"], ["d"], ["e"]],
            idempotency_keys=["k0", "k1", None, "k1", None],
        )
        for job_id in set(ids):
            r.wait(ALICE, job_id, TIMEOUT)
    assert ids[0] == old
    assert ids[3] == ids[1]
    assert len({ids[1], ids[2], ids[4], old}) == 4
    assert script.calls == ["old", "b", "c", "e"]
    assert len(db.list_jobs()) == 4


def test_jobs_whose_key_was_used_neither_join_nor_wait(db: store.Store, runner: MakeRunner) -> None:
    """Under max_live, with the room taken: the new jobs wait and run, the
    ones whose key was used take no room and leave nothing waiting."""
    script = Script()
    hooks = Recorder()
    with runner(db, script, hooks, workers=1, max_live=1) as r:
        done = r.submit_many(ALICE, [["a"], ["b"]], idempotency_keys=["ka", "kb"])
        for job_id in done:
            r.wait(ALICE, job_id, TIMEOUT)
        script.hold("x")
        x = r.submit(ALICE, ["x"])
        script.started("x")
        ids = r.submit_many(ALICE, [["a"], ["c"], ["b"]], idempotency_keys=["ka", "kc", "kb"])
        assert [ids[0], ids[2]] == done
        assert r.statistics().live == 1
        script.release("x")
        assert r.wait(ALICE, ids[1], TIMEOUT).status == "done"
        r.wait(ALICE, x, TIMEOUT)
        # "c" ended in the store (what its wait, through the store's events,
        # saw) a moment before the runner lets go of it.
        assert eventually(lambda: r.statistics().live == 0)
    assert script.calls == ["a", "b", "x", "c"]
    assert max(hooks.depths) == 1


def test_a_key_is_free_again_once_its_job_is_evicted(db: store.Store, runner: MakeRunner) -> None:
    with runner(db, Script()) as r:
        first = r.submit(ALICE, ["a"], idempotency_key="k")
        r.wait(ALICE, first, TIMEOUT)
        # Eviction passes over a job another transaction holds (the
        # runner's beat, say): it is evicted at a later try.
        evicted: list[str] = []

        def evict() -> bool:
            evicted.extend(db.evict(0))
            return bool(evicted)

        assert eventually(evict)
        assert evicted == [first]
        second = r.submit(ALICE, ["b"], idempotency_key="k")
        assert second != first
        assert r.wait(ALICE, second, TIMEOUT).key == "k"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (7, "an idempotency key is a str or None, not int"),
        ("", "an idempotency key is printable text of 1 to 200 characters, not ''"),
        ("  ", "an idempotency key is printable text of 1 to 200 characters, not '  '"),
        ("a\nb", "an idempotency key is printable text of 1 to 200 characters, not 'a\\nb'"),
        (
            "k" * 201,
            "an idempotency key is printable text of 1 to 200 characters, not " + repr("k" * 40),
        ),
    ],
)
def test_a_bad_key_is_refused_and_nothing_stored(
    db: store.Store, runner: MakeRunner, key: object, message: str
) -> None:
    with runner(db, Script()) as r:
        with pytest.raises(batch.InvalidJob) as raised:
            r.submit(ALICE, ["a"], idempotency_key=key)  # type: ignore[arg-type]
        assert str(raised.value) == message
        with pytest.raises(batch.InvalidJob):
            r.submit_many(ALICE, [["a"], ["b"]], idempotency_keys=["ok", key])  # type: ignore[list-item]
    assert db.list_jobs() == []


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["k"], "2 jobs and 1 idempotency keys: give one each"),
        ("kk", "idempotency keys are a list, one per job, not str"),
        (7, "idempotency keys are a list, one per job, not int"),
    ],
)
def test_keys_that_are_not_one_per_job_are_refused(
    db: store.Store, runner: MakeRunner, keys: object, message: str
) -> None:
    with runner(db, Script()) as r, pytest.raises(batch.InvalidJob) as raised:
        r.submit_many(ALICE, [["a"], ["b"]], idempotency_keys=keys)  # type: ignore[arg-type]
    assert str(raised.value) == message
    assert db.list_jobs() == []


def test_runners_racing_on_one_key_make_one_job(location: str) -> None:
    """Four runners on four handles submit the same 50 keys at once: 50
    jobs, and every runner is given the same id for each key."""
    handles = [store.open(location) for _ in range(4)]
    runners = [batch.Runner(h, Script(), batch.Config(workers=1)) for h in handles]
    keys = [f"k{i}" for i in range(50)]
    start = threading.Barrier(len(runners))
    got: list[list[str]] = [[] for _ in runners]

    def submit(k: int) -> None:
        start.wait(TIMEOUT)
        got[k] = [runners[k].submit(ALICE, [key], idempotency_key=key) for key in keys]

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(len(runners))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert got[0] and all(ids == got[0] for ids in got)
        assert len(set(got[0])) == 50
        for job_id in got[0]:
            assert runners[0].wait(ALICE, job_id, TIMEOUT).status == "done"
        assert len(handles[0].list_jobs()) == 50
    finally:
        for r in runners:
            r.close()
        for h in handles:
            h.close()


#: A process that submits the keys it is given, all at once when told "go"
#: on its stdin, and says the ids it got.
SUBMITTER = textwrap.dedent(
    """
    import json, sys
    import batch, store

    cfg = json.loads(sys.argv[1])
    with store.open(cfg["location"]) as db, batch.Runner(
        db, lambda ctx, caller, target: None, batch.Config(workers=1)
    ) as runner:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        caller = batch.Caller("alice")
        ids = runner.submit_many(caller, [[k] for k in cfg["keys"]], idempotency_keys=cfg["keys"])
        print(json.dumps({"ids": ids}), flush=True)
        for job_id in set(ids):
            runner.wait(caller, job_id, 60)
    """
)


def test_processes_racing_on_one_key_make_one_job(location: str, tmp_path: Path) -> None:
    """Four processes submit the same 200 keys at once, in orders of their
    own: 200 jobs, and each process is given the same id for a key."""
    keys = [f"k{i:03d}" for i in range(200)]
    orders = [keys, keys[::-1], keys[100:] + keys[:100], keys[::2] + keys[1::2]]
    children = [
        ChildProcess(
            f"submitter-{k}",
            [sys.executable, "-c", SUBMITTER, json.dumps({"location": location, "keys": order})],
            tmp_path / f"submitter-{k}.err",
        )
        for k, order in enumerate(orders)
    ]
    try:
        for child in children:
            child.read("ready")
        for child in children:
            child.send("go")
        answers = [
            dict(zip(order, child.read("ids")["ids"], strict=True))
            for child, order in zip(children, orders, strict=True)
        ]
        for child in children:
            assert child.proc.wait(TIMEOUT) == 0, child.stderr()
    finally:
        for child in children:
            child.reap()
    assert all(answer == answers[0] for answer in answers)
    assert len(set(answers[0].values())) == 200
    with store.open(location) as db:
        jobs = db.list_jobs()
    assert sorted(j.id for j in jobs) == sorted(answers[0].values())
    assert {j.key: j.id for j in jobs} == answers[0]
    assert {j.status for j in jobs} == {"done"}
