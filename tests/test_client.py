"""Submitting without running (SPEC §2g, ``batch.Client``): a client stores
jobs that worker runners on the same store run, with every submit form;
it waits for, reads and cancels them; it runs none itself, and a runner
that does not resume other callers' jobs leaves them alone."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import batch
import store
from tests.helpers import TIMEOUT, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")

#: A worker's lease: short, so that a worker on SQLite (which no notice
#: wakes) takes a client's job at its next beat soon.
LEASE = 0.6


def fetched(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    return {"ref": target.ref, "by": caller.id}


@contextlib.contextmanager
def worker(
    location: str, fetch: Any = fetched, **config: Any
) -> Iterator[batch.Runner[batch.Caller]]:
    """A worker process's runner, on a handle of its own."""
    config.setdefault("resume", batch.Caller)
    config.setdefault("takeover_after", LEASE)
    with store.open(location) as db, batch.Runner(db, fetch, batch.Config(**config)) as r:
        yield r


def test_a_clients_jobs_are_run_by_a_worker_in_submit_order(db: store.Store, location: str) -> None:
    order: list[str] = []

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        order.append(target.ref)
        return fetched(ctx, caller, target)

    with batch.Client(db) as client:
        one = client.submit(ALICE, ["a1", "a2"], name="first")
        many = client.submit_many(BOB, [["b1"], ["b2"]], names=["x", "y"])
        assert client.status(ALICE, one).status == "queued"
        with worker(location, fetch, workers=1, max_live=1):
            job = client.wait(ALICE, one, TIMEOUT)
            assert (job.status, job.name) == ("done", "first")
            assert [t.result for t in job.targets] == [
                {"ref": "a1", "by": "alice"},
                {"ref": "a2", "by": "alice"},
            ]
            assert [j.status for j in client.as_completed(BOB, many, TIMEOUT)] == ["done", "done"]
        assert order == ["a1", "a2", "b1", "b2"]
        stats = client.statistics()
        assert (stats.workers, stats.live, stats.stored) == (0, 0, 0)


def test_every_submit_form_works_through_a_client(db: store.Store, location: str) -> None:
    with batch.Client(db) as client:
        keyed = client.submit(ALICE, ["k"], idempotency_key="order-7")
        assert client.submit(ALICE, ["other"], idempotency_key="order-7") == keyed
        assert client.submit_many(ALICE, [["k"]], idempotency_keys=["order-7"]) == [keyed]
        first = client.submit(ALICE, ["first"])
        then = client.submit(ALICE, ["then"], after=[first], after_ok=True)
        later = client.submit(ALICE, ["later"], not_before=time.time() + 0.5)
        with worker(location):
            assert client.wait(ALICE, then, TIMEOUT).status == "done"
            job = client.wait(ALICE, later, TIMEOUT)
            assert job.status == "done"
            assert client.wait(ALICE, keyed, TIMEOUT).targets[0].result["ref"] == "k"
        assert client.status(ALICE, first).status == "done"
        with pytest.raises(batch.InvalidJob):
            client.submit(ALICE, [])
        with pytest.raises(batch.InvalidJob):
            client.submit(ALICE, ["x"], after=["no-such-job"])


def test_a_client_cancels_a_job_a_worker_runs(db: store.Store, location: str) -> None:
    started, release = threading.Event(), threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        started.set()
        ctx.wait(TIMEOUT)
        release.set()
        return target.ref

    with batch.Client(db) as client, worker(location, fetch, workers=1) as w:
        job_id = client.submit(ALICE, ["one", "two", "three"])
        assert started.wait(TIMEOUT)
        assert client.cancel(ALICE, job_id)
        assert release.wait(TIMEOUT)  # the worker's fetch saw its context cancelled
        job = client.wait(ALICE, job_id, TIMEOUT)
        assert job.status == "cancelled"
        assert eventually(lambda: w.statistics().live == 0)
        assert [t.status for t in w.status(ALICE, job_id).targets][1:] == ["pending", "pending"]


def test_a_client_waits_from_an_event_loop(db: store.Store, location: str) -> None:
    with batch.Client(db) as client, worker(location):
        job_id = client.submit(ALICE, ["a"])

        async def main() -> batch.Job:
            return await client.wait_async(ALICE, job_id, TIMEOUT)

        assert asyncio.run(main()).status == "done"


def test_a_runner_that_does_not_resume_leaves_a_clients_jobs_alone(
    db: store.Store, location: str
) -> None:
    """A runner without ``resume`` neither runs nor ends the jobs an open
    client submitted; a worker that resumes runs them."""
    with batch.Client(db) as client:
        job_id = client.submit(ALICE, ["a"])
        # Its first beat, as it opens, finds the client's job waiting.
        with worker(location, resume=None) as plain:
            plain_id = plain.submit(BOB, ["own"])
            assert plain.wait(BOB, plain_id, TIMEOUT).status == "done"
            assert client.status(ALICE, job_id).status == "queued"
        with worker(location):
            assert client.wait(ALICE, job_id, TIMEOUT).status == "done"


def test_a_client_refuses_what_a_runner_refuses(db: store.Store) -> None:
    with pytest.raises(TypeError, match=r"batch\.Config"):
        batch.Client(db, {"workers": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"store\.Store"):
        batch.Client("jobs.sqlite3")  # type: ignore[arg-type]
    client: batch.Client[batch.Caller] = batch.Client(db, batch.Config(max_targets=2))
    with client:
        with pytest.raises(batch.InvalidJob):
            client.submit(ALICE, ["a", "b", "c"])
        with pytest.raises(batch.JobNotFound):
            client.status(ALICE, "0" * 32)
    with pytest.raises(batch.RunnerClosed):
        client.submit(ALICE, ["a"])
