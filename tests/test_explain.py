"""Explain: why a job is not fetching. ``batch-runner explain`` and
``Runner.explain`` of a job the runner does not run read the store alike
(``batch.explain.from_store``); the runner that runs a job says more."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import batch
import batch.cli
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, Script, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


def explained(location: str, job: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """What ``batch-runner explain JOB --json`` prints, checked to exit 0."""
    capsys.readouterr()
    assert batch.cli.main(["explain", job, "--db", location, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def sentence(location: str, job: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``batch-runner explain JOB`` prints."""
    capsys.readouterr()
    assert batch.cli.main(["explain", job, "--db", location]) == 0
    return capsys.readouterr().out.strip()


@pytest.fixture
def other(location: str) -> Iterator[batch.Runner[Any]]:
    """A second runner on the store that runs none of the test's jobs."""
    with store.open(location) as db, batch.Runner(db, Script()) as runner:
        yield runner


def test_a_paused_job_is_explained_alike_by_the_runners_and_the_command(
    db: store.Store,
    location: str,
    runner: MakeRunner,
    other: batch.Runner[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The runner holding it, another runner and the command all say it is
    paused, for its caller (the command once said "runner ... runs it")."""
    script = Script()
    with runner(db, script) as r:
        script.hold("a1")
        job = r.submit(ALICE, ["a1", "a2"])
        script.started("a1")
        r.pause(ALICE)
        script.release("a1")
        paused = {"id": job, "status": "running", "state": "paused", "caller": "alice"}
        assert eventually(lambda: r.explain(ALICE, job) == paused)
        assert other.explain(ALICE, job) == paused
        assert explained(location, job, capsys) == paused
        assert sentence(location, job, capsys) == (
            f"job {job[:12]} is running: its caller alice is paused"
        )
        r.unpause(ALICE)
        assert r.wait(ALICE, job, TIMEOUT).status == "done"


def test_a_job_held_by_a_live_runner_is_explained_as_its(
    db: store.Store,
    location: str,
    runner: MakeRunner,
    other: batch.Runner[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = Script()
    with runner(db, script) as r:
        script.hold("a1")
        job = r.submit(ALICE, ["a1"])
        script.started("a1")
        assert r.explain(ALICE, job)["state"] == "fetching"
        assert eventually(lambda: db.find_job(job).status == "running")  # type: ignore[union-attr]
        holder = db.whereabouts(job)
        assert holder is not None and holder.holder is not None and holder.alive
        elsewhere = {"id": job, "status": "running", "state": "elsewhere", "runner": holder.holder}
        assert other.explain(ALICE, job) == elsewhere
        assert explained(location, job, capsys) == elsewhere
        assert sentence(location, job, capsys) == (
            f"job {job[:12]} is running: runner {holder.holder} runs it"
        )
        script.release("a1")
        assert r.wait(ALICE, job, TIMEOUT).status == "done"


def test_a_job_whose_runner_is_gone_waits_for_a_runner_to_open_the_store(
    location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its runner's lease lapsed and no runner is open: the job waits for
    one to open the store, and the runner gone is named as such (the
    command once named it as running the job)."""
    an_hour_ago = lambda: time.time() - 3600  # noqa: E731 - the store's clock, then
    with store.open(location, clock=an_hour_ago) as then:
        Ledger.of(then).create_jobs("alice", [("j1", ["a1"])], "gone-runner", lease_for=60)
    said = explained(location, "j1", capsys)
    assert said == {
        "id": "j1",
        "status": "queued",
        "state": "waiting",
        "runners": 0,
        "runner": "gone-runner",
    }
    assert sentence(location, "j1", capsys) == (
        "job j1 is queued: it waits for a runner to open the store"
        " (runner gone-runner, which held it, is gone)"
    )


def test_an_ended_job_is_said_to_have_ended(
    db: store.Store, location: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Ledger.of(db).create_job("j1", "alice", ["a1"])
    assert db.cancel_job("j1", "alice")
    assert explained(location, "j1", capsys) == {
        "id": "j1",
        "status": "cancelled",
        "state": "ended",
    }
    assert sentence(location, "j1", capsys) == "job j1 ended cancelled"
