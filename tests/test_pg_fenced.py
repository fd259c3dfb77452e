"""Fenced writes on PostgreSQL: what the runners write for their jobs takes
no lock of the whole store, so writes of different jobs commit side by side
and a writer stopped inside its transaction holds only its own jobs' rows.
(The rules themselves are tested on both engines elsewhere; this is what
only an engine with writers side by side can show.)"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest

import store
from store.ledger import Ledger
from tests import pgserver
from tests.helpers import (
    TIMEOUT,
    ChildProcess,
    HeldOnServer,
    eventually,
    fresh,
    lock_waiters,
    raw,
)

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


@pytest.fixture
def url(pg_server: pgserver.Server | None, tmp_path: Path) -> Iterator[str]:
    if pg_server is None:
        pytest.skip("no PostgreSQL server here")
    with fresh("postgres", tmp_path, pg_server) as where:
        yield where


def _outcome(job_id: str, pos: int, owner: str) -> store.TargetOutcome:
    return store.TargetOutcome(
        job_id, pos, "done", result=f'"{job_id}.{pos}"', lease=store.Lease(owner, 1)
    )


def test_a_writer_stopped_inside_its_transaction_stops_no_other_runner(url: str) -> None:
    """Runner a's batch stops inside its transaction, holding its job's
    row. Meanwhile runner b, on another connection, stores its outcomes,
    beats, submits and cancels: none of it waits for a. The two
    transactions overlap (a is seen waiting on the server while b commits),
    and once a goes on its batch commits too, both stored once."""
    with store.open(url) as a_db, store.open(url) as b_db:
        for runner, db in (("a", a_db), ("b", b_db)):
            Ledger.of(db).register_runner(runner, 30.0)
            Ledger.of(db).create_jobs(
                "alice", [(f"{runner}-job", ["x", "y"])], runner, lease_for=30.0
            )
        held = HeldOnServer(url, "a-job")
        got: list[store.Stored] = []
        writer = threading.Thread(
            target=lambda: got.append(Ledger.of(a_db).store_targets([_outcome("a-job", 0, "a")])),
            name="paused-writer",
        )
        writer.start()
        try:
            assert eventually(held.waiting)

            stored = Ledger.of(b_db).store_targets([_outcome("b-job", 0, "b")])
            assert stored.refused == {}
            beat = Ledger.of(b_db).beat_runner("b", 30.0)
            assert set(beat.held) == {"b-job"}
            Ledger.of(b_db).create_jobs("bob", [("b-new", ["z"])], "b", lease_for=30.0)
            assert b_db.cancel_job("b-new", "bob")
            # a's transaction is open on the server all that time.
            assert held.waiting()
            b_job = b_db.get_job("b-job", "alice")
            assert b_job is not None
            assert [t.status for t in b_job.targets] == ["done", "pending"]
        finally:
            held.release()
            writer.join(TIMEOUT)
        assert got and got[0].refused == {}
        a_job = a_db.get_job("a-job", "alice")
        assert a_job is not None
        assert [t.status for t in a_job.targets] == ["done", "pending"]
        assert Ledger.of(a_db).total_bytes() == len('"a-job.0"') + len('"b-job.0"')


def test_a_take_over_passes_over_a_job_a_stopped_writer_holds(url: str) -> None:
    """Runner a's lease has lapsed while its batch is stopped inside its
    transaction: another runner's beat does not wait for a's row, nor take
    the job from under the write; once a's transaction ends the job is
    free to take."""
    with store.open(url) as a_db, store.open(url) as b_db:
        Ledger.of(a_db).register_runner("a", 30.0)
        Ledger.of(b_db).register_runner("b", 30.0)
        # Lapsed at once: any beat may take it, but for a's write holding it.
        Ledger.of(a_db).create_jobs(
            "alice", [("a-job", ["x", "y"]), ("a-two", ["x"])], "a", lease_for=-1.0
        )
        held = HeldOnServer(url, "a-job")
        writer = threading.Thread(
            target=lambda: Ledger.of(a_db).store_targets([_outcome("a-job", 0, "a")]),
            name="paused-writer",
        )
        writer.start()
        try:
            assert eventually(held.waiting)
            beat = Ledger.of(b_db).beat_runner("b", 30.0, foreign=True)
            assert [row.id for row, _ in beat.taken] == ["a-two"]
        finally:
            held.release()
            writer.join(TIMEOUT)
        beat = Ledger.of(b_db).beat_runner("b", 30.0, foreign=True)
        assert [(row.id, token) for row, token in beat.taken] == [("a-job", 2)]
        job = b_db.find_job("a-job")
        assert job is not None
        assert [t.status for t in job.targets] == ["done", "pending"]


#: A runner in a process of its own: submits one job of ``n`` targets
#: named ``<name>-<i>`` (saying its id), fetches each at once, but the
#: first only once told ``go`` on stdin; says ``done`` once the job ended.
RUNNER = """
import json, sys, threading
import batch, store
url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
go = threading.Event()
def fetch(ctx, caller, target):
    if target.ref.endswith("-0"):
        go.wait(60)
    return {"by": name}
with store.open(url) as db, batch.Runner(db, fetch, batch.Config(workers=2)) as runner:
    job = runner.submit(batch.Caller("alice"), [f"{name}-{i}" for i in range(n)])
    print(json.dumps({"submitted": job}), flush=True)
    sys.stdin.readline()
    go.set()
    runner.wait(batch.Caller("alice"), job, timeout=60)
    print(json.dumps({"done": job}), flush=True)
    sys.stdin.readline()
"""


def test_two_runner_processes_commit_outcomes_of_their_jobs_side_by_side(
    url: str, tmp_path: Path
) -> None:
    """Runner processes a and b on one database. a's batch is held inside
    its transaction on the server (its job's targets locked by the test,
    its job's row by the batch); meanwhile b commits the outcomes of its
    own job, batch after batch: the two transactions overlap, as seen on
    the server. Once a's batch goes on, every target of each job is stored
    once, by the runner that held it."""
    store.open(url).close()
    a = ChildProcess("a", [sys.executable, "-c", RUNNER, url, "a", "4"], tmp_path / "a.err")
    b = ChildProcess("b", [sys.executable, "-c", RUNNER, url, "b", "200"], tmp_path / "b.err")
    try:
        a_job, b_job = a.read("submitted")["submitted"], b.read("submitted")["submitted"]
        held = HeldOnServer(url, a_job)
        try:
            a.send("go")
            assert eventually(held.waiting), "a's batch never waited on the server"
            [(_, began)] = held.waiters()
            b.send("go")
            assert b.read("done")["done"] == b_job
            # b stored its every target while a's transaction stayed open.
            assert [start for _, start in held.waiters()] == [began]
            assert raw(url, "SELECT count(*) FROM targets WHERE job_id = ?", (b_job,)) == [(200,)]
            assert _stored(url, b_job) == 200
            assert _stored(url, a_job) <= 1  # the first batch of a, maybe, not its held one
        finally:
            held.release()
        assert a.read("done")["done"] == a_job
        for name, job in (("a", a_job), ("b", b_job)):
            by = raw(
                url, "SELECT result, count(*) FROM targets WHERE job_id = ? GROUP BY 1", (job,)
            )
            assert by == [
                (json.dumps({"by": name}, separators=(",", ":")), 4 if name == "a" else 200)
            ]
    finally:
        for child in (a, b):
            with contextlib.suppress(OSError):
                child.send("bye")
            child.reap()


def _stored(url: str, job_id: str) -> int:
    (count,) = raw(
        url, "SELECT count(*) FROM targets WHERE job_id = ? AND status = 'done'", (job_id,)
    )[0]
    return int(count)


def _behind(url: str, change: str, call: Callable[[], T]) -> T:
    """What ``call`` returns when it waits for rows another session is
    changing (``change``, not yet committed), and then goes on once the
    change commits."""
    other = psycopg.connect(url, autocommit=False)
    try:
        other.execute(change)
        got: list[T] = []
        caller = threading.Thread(target=lambda: got.append(call()), name="behind")
        caller.start()
        try:
            assert eventually(lambda: len(lock_waiters(url)) == 1), "it never waited"
        finally:
            other.commit()
            caller.join(TIMEOUT)
    finally:
        other.close()
    assert len(got) == 1, "it never returned"
    return got[0]


def test_a_write_that_waited_for_a_take_over_is_refused(url: str) -> None:
    """Runner a writes under its lease to a job whose row another session
    holds, in the middle of taking it over (its new owner and token set,
    not yet committed). Once the take-over commits, a's write, which waited
    for the row, judges the row as the take-over left it: refused."""
    with store.open(url) as db:
        Ledger.of(db).register_runner("a", 30.0)
        Ledger.of(db).create_jobs("alice", [("j", ["x", "y"])], "a", lease_for=30.0)
        ended = _behind(
            url,
            "UPDATE jobs SET lease_owner = 'b', lease_token = 2 WHERE id = 'j'",
            lambda: Ledger.of(db).interrupt_job("j", "late", store.Lease("a", 1)),
        )
        assert ended is None
        assert raw(url, "SELECT status, lease_owner, lease_token FROM jobs WHERE id = 'j'") == [
            ("queued", "b", 2)
        ]


def test_a_renewal_that_waited_for_a_give_back_keeps_it(url: str) -> None:
    """A beat reads its time as its transaction begins; meanwhile another
    session, holding the runner's job, moves its lease on (as the beat that
    gives a stall back does) and commits. The renewal, which waited for the
    row, leaves the lease where it was moved: a renewal never brings a lease
    nearer."""
    with store.open(url) as db:
        Ledger.of(db).register_runner("a", 30.0)
        Ledger.of(db).create_jobs("alice", [("j", ["x"])], "a", lease_for=30.0)
        ((until,),) = raw(url, "SELECT lease_until FROM jobs WHERE id = 'j'")
        beat = _behind(
            url,
            "UPDATE jobs SET lease_until = lease_until + 1000 WHERE id = 'j'",
            lambda: Ledger.of(db).beat_runner("a", 30.0),
        )
        assert beat.held == {"j": 1}
        assert raw(url, "SELECT lease_until FROM jobs WHERE id = 'j'") == [(until + 1000,)]
