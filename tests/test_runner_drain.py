"""A close that drains (``Runner.close(grace=)``, what a worker process does
on SIGTERM): nothing new starts, the fetches in flight go on uncancelled
for the grace and what they return is stored; one that outlasts the
timeout is given up and its job released to another runner at once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import batch
import store
from tests.helpers import TIMEOUT, MakeRunner, eventually

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


class Gated:
    """A fetch that signals ``started`` and blocks until ``gate`` is set,
    recording whether its context was cancelled when it returned."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()
        self.calls: list[str] = []
        self.reasons: list[str | None] = []

    def __call__(self, ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        self.calls.append(target.ref)
        self.started.set()
        assert self.gate.wait(TIMEOUT)
        self.reasons.append(ctx.reason)
        return target.ref


def _closing(r: batch.Runner[Any], **kw: Any) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def close() -> None:
        try:
            r.close(**kw)
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    t = threading.Thread(target=close)
    t.start()
    return t, raised


@contextlib.contextmanager
def _another(location: str, says: str) -> Iterator[batch.Runner[batch.Caller]]:
    """A runner on a handle of its own that resumes any caller's jobs, with
    leases of a minute (it takes only what is let go), its fetch returning
    ``"<says> <ref>"``."""
    with (
        store.open(location) as other_db,
        batch.Runner(
            other_db,
            lambda ctx, caller, t: f"{says} {t.ref}",
            batch.Config(resume=batch.Caller, takeover_after=60),
        ) as other,
    ):
        yield other


def test_a_drain_lets_the_fetch_in_flight_finish_uncancelled(
    db: store.Store, runner: MakeRunner
) -> None:
    fetch = Gated()
    r = runner(db, fetch, workers=1)
    first = r.submit(ALICE, ["a", "b"])
    waiting = r.submit(ALICE, ["c"])
    assert fetch.started.wait(TIMEOUT)
    closer, raised = _closing(r, grace=TIMEOUT)
    assert eventually(lambda: r.statistics().closed)
    fetch.gate.set()
    closer.join(TIMEOUT)
    assert not closer.is_alive() and raised == []
    assert fetch.calls == ["a"]  # nothing started once the close began
    assert fetch.reasons == [None]  # the grace was not cut short
    job = r.status(ALICE, first)
    assert [t.status for t in job.targets] == ["done", "pending"]
    assert job.targets[0].result == "a"
    assert not job.terminal and not r.status(ALICE, waiting).terminal  # left for the next


def test_a_drain_cancels_the_fetch_once_the_grace_is_over(
    db: store.Store, runner: MakeRunner
) -> None:
    started, cancelled = threading.Event(), threading.Event()

    def fetch(ctx: batch.Context, caller: Any, target: batch.Target) -> object:
        started.set()
        assert ctx.wait(TIMEOUT)
        cancelled.set()
        return ctx.reason

    r = runner(db, fetch, workers=1)
    job_id = r.submit(ALICE, ["a"])
    assert started.wait(TIMEOUT)
    r.close(grace=0.2, timeout=TIMEOUT)
    assert cancelled.is_set()
    job = r.status(ALICE, job_id)
    assert (job.status, job.targets[0].result) == ("done", "closed")


def test_a_fetch_past_the_drains_timeout_is_given_up_and_its_job_released(
    db: store.Store, location: str, runner: MakeRunner
) -> None:
    """The job of a fetch that ignores its context is released when the
    timeout passes: another runner takes it at once (its leases would last
    a minute), fetches the target again and ends it."""
    fetch = Gated()
    stuck = runner(db, fetch, workers=1, takeover_after=60)
    job_id = stuck.submit(ALICE, ["a", "b"])
    assert fetch.started.wait(TIMEOUT)
    with pytest.raises(TimeoutError, match="released"):
        stuck.close(grace=0.1, timeout=0.3)
    with _another(location, "again") as other:
        job = other.wait(ALICE, job_id, TIMEOUT)
    assert [t.result for t in job.targets] == ["again a", "again b"]
    fetch.gate.set()
    stuck.close(timeout=TIMEOUT)  # what the stuck fetch returns is refused
    assert stuck.status(ALICE, job_id).targets[0].result == "again a"


def test_a_drain_lets_the_jobs_with_nothing_in_flight_go_at_once(
    db: store.Store, location: str, runner: MakeRunner
) -> None:
    """While the fetch in flight has its grace, the draining runner's other
    jobs run elsewhere (its leases would keep them a minute), and it takes
    none of those submitted meanwhile."""
    fetch = Gated()
    draining = runner(db, fetch, workers=1, takeover_after=60, resume=batch.Caller)
    busy = draining.submit(ALICE, ["a"])
    idle = draining.submit(ALICE, ["b"])
    assert fetch.started.wait(TIMEOUT)
    closer, raised = _closing(draining, grace=TIMEOUT)
    assert eventually(lambda: draining.statistics().closed)
    with _another(location, "other") as other:
        assert other.wait(ALICE, idle, TIMEOUT).targets[0].result == "other b"
        later = other.submit(ALICE, ["c"])
        assert other.wait(ALICE, later, TIMEOUT).status == "done"
        fetch.gate.set()
        closer.join(TIMEOUT)
        assert raised == []
        assert other.wait(ALICE, busy, TIMEOUT).targets[0].result == "a"  # stored by the drain
    assert fetch.calls == ["a"]


@pytest.mark.parametrize(("grace", "error"), [(-1, ValueError), ("1", TypeError)])
def test_a_grace_must_be_seconds(
    db: store.Store, runner: MakeRunner, grace: object, error: type[Exception]
) -> None:
    with runner(db, Gated(), workers=1) as r, pytest.raises(error, match="grace"):
        r.close(grace=grace)
