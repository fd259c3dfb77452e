"""One root for a runner's caller: what the store raises through a runner's
method comes out as ``batch.StoreFailed``, a ``BatchError`` (and still a
``store.StoreError``), with the store's error as its cause."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import MakeRunner

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")

#: The store's methods a runner's caller reaches, each made to fail in turn.
READS_AND_WRITES = ("get_job", "touch_job", "cancel_job", "list_jobs", "job_status")


def no_fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    raise AssertionError("no target is fetched here")


def calls(runner: batch.Runner[Any], job_id: str) -> dict[str, Callable[[], object]]:
    """Each public method that asks the store, called on a job the runner
    does not hold (so that waiting reads the store)."""
    made: dict[str, Callable[[], object]] = {
        "submit": lambda: runner.submit(ALICE, ["a"]),
        "submit_many": lambda: runner.submit_many(ALICE, [["a"], ["b"]]),
        "status": lambda: runner.status(ALICE, job_id),
        "touch": lambda: runner.touch(ALICE, job_id),
        "cancel": lambda: runner.cancel(ALICE, job_id),
        "wait": lambda: runner.wait(ALICE, job_id, timeout=5),
        "as_completed": lambda: list(runner.as_completed(ALICE, [job_id], timeout=5)),
        "wait_async": lambda: asyncio.run(runner.wait_async(ALICE, job_id, timeout=5)),
        "requeue_failed": lambda: runner.requeue_failed(ALICE, job_id),
    }
    assert made.keys() == set(METHODS)
    return made


#: The runner's methods that read or write the store.
METHODS = (
    "submit",
    "submit_many",
    "status",
    "touch",
    "cancel",
    "wait",
    "as_completed",
    "wait_async",
    "requeue_failed",
)


@pytest.mark.parametrize("method", METHODS)
def test_what_the_store_raises_reaches_the_caller_as_one_batch_error(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    Ledger.of(db).create_job("elsewhere", ALICE.id, ["x"])  # live, held by no runner of this test
    with runner(db, no_fetch, workers=1) as r:
        down = store.StoreError("the store cannot be reached")

        def fail(*args: object, **kwargs: object) -> object:
            raise down

        for name in READS_AND_WRITES:
            monkeypatch.setattr(db, name, fail)
        monkeypatch.setattr(Ledger.of(db), "create_jobs", fail)
        with pytest.raises(batch.StoreFailed, match="cannot be reached") as caught:
            calls(r, "elsewhere")[method]()
        monkeypatch.undo()
    assert isinstance(caught.value, batch.BatchError)
    assert isinstance(caught.value, store.StoreError)
    assert caught.value.__cause__ is down
