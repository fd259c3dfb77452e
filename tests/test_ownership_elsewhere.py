"""Runners in several processes on one store: a job cancelled and waited for
through a runner of another process than the one holding it, and
``running`` seen from another process (tests 4 and 5 of
``test_ownership_processes.py``'s numbering)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

import batch
import store
from tests.helpers import (
    TIMEOUT,
    eventually,
    within,
)
from tests.ownership_children import (
    family,
    read_store,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


# -- 4. cancel and wait from a process that does not own the job -------------------


@pytest.mark.timeout(30)
def test_cancel_and_wait_through_a_runner_of_another_process(
    tmp_path: Path,
    location: str,
) -> None:
    """A child runs a job of 20 slow targets (0.2 s each); the parent's own
    runner on the file cancels it (True, ``cancelled`` in the store at once)
    and waits for it (returns the cancelled job). The child starts no
    target after the cancel, stores the one it had in flight, and the job
    stays cancelled.

    The child's lease is 0.45 s, so it beats every 0.15 s: one of its beats
    surely comes while the target is in flight, as one does at random with
    any lease whenever a fetch outlasts a third of it."""
    caller = batch.Caller("c")
    with family(tmp_path, location) as spawn:
        child = spawn("c", delay=0.2, takeover_after=0.45)
        child.ready()
        (job_id,) = child.ask("submit 1 20", "ids")
        assert eventually(lambda: len(child.fetches()) >= 2)
        with store.open(location) as db, batch.Runner(db, lambda *_: None) as here:
            # Cancel right after a fetch started: its predecessor is stored,
            # so that fetch is the one in flight.
            seen = len(child.fetches())
            assert eventually(lambda: len(child.fetches()) > seen, every=0.001)
            in_flight = child.fetches()[-1].ref
            t0 = time.time()
            assert here.cancel(caller, job_id) is True
            t1 = time.time()
            assert here.status(caller, job_id).status == "cancelled"
            waited = here.wait(caller, job_id, timeout=5)
            t2 = time.time()
            assert waited.status == "cancelled"
            assert here.statistics().live == 0  # it never took the job
            assert here.cancel(caller, job_id) is False  # terminal now
        # The child lets go of the job once the outcome in flight is recorded.
        assert eventually(lambda: child.ask("stats", "stats")["live"] == 0, every=0.02)
        t3 = time.time()
        assert child.ask("status", "status") == {job_id: "cancelled"}
        child.finish()
        fetched = child.fetches()
        errors = child.stderr()
    jobs, targets = read_store(location)

    started_after = [f for f in fetched if f.t > t1]
    print(
        f"cancel took {1000 * (t1 - t0):.1f} ms, wait returned {1000 * (t2 - t1):.1f} ms"
        f" later; the child let go of the job {1000 * (t3 - t1):.0f} ms after the cancel;"
        f" {len(fetched)} fetched, {len(started_after)} started after the cancel;"
        f" the one in flight ({in_flight}) is {targets[in_flight].status}"
    )
    assert started_after == [], "a target started after the cancel returned"
    assert fetched[-1].ref == in_flight
    assert jobs[job_id].status == "cancelled"
    statuses = [t.status for t in sorted(targets.values(), key=lambda t: t.pos)]
    assert statuses[: len(fetched) - 1] == ["done"] * (len(fetched) - 1)
    assert statuses[len(fetched) :] == ["pending"] * (20 - len(fetched))
    # The outcome in flight is stored, not refused for a lease the owner's
    # own beat released.
    refused = [line for line in errors.splitlines() if "not stored" in line]
    assert targets[in_flight].status == "done", refused
    assert targets[in_flight].result == {"ref": in_flight, "by": "c"}


@pytest.mark.timeout(30)
def test_a_cancel_elsewhere_reaches_a_job_waiting_on_a_retry_within_the_poll(
    tmp_path: Path,
    location: str,
) -> None:
    """A job with no target in flight (it waits out ``retry_wait`` after a
    busy answer) learns of a cancel made in another process only by polling
    the store: it leaves its runner's rotation within about 0.1 s (so the
    busy target is never tried again), and the cancel stays."""
    caller = batch.Caller("c")
    with family(tmp_path, location) as spawn:
        child = spawn("c", delay=0.0, retry_wait=3.0, busy_once=("c.0.1",))
        child.ready()
        (job_id,) = child.ask("submit 1 3", "ids")
        assert eventually(lambda: child.ask("stats", "stats")["waiting_retry"] == 1)
        with store.open(location) as db, batch.Runner(db, lambda *_: None) as here:
            assert here.cancel(caller, job_id) is True
            cancelled = time.time()
            left = eventually(lambda: child.ask("stats", "stats")["live"] == 0, every=0.001)
            learnt = time.time()
        assert left, "the job never left the child's rotation"
        child.finish()
        fetched = child.fetches()
    assert [f.ref for f in fetched] == ["c.0.0", "c.0.1"]
    assert learnt - cancelled < 0.1 + 0.1, "the owner polls every 0.1 s"
    jobs, targets = read_store(location)
    assert jobs[job_id].status == "cancelled"
    assert [targets[r].status for r in ("c.0.0", "c.0.1", "c.0.2")] == [
        "done",
        "pending",
        "pending",
    ]
    print(f"the owner let go of the cancelled job {1000 * (learnt - cancelled):.0f} ms later")


# -- 5. running, seen from another process -----------------------------------------


@pytest.mark.timeout(30)
def test_running_is_seen_from_another_process_within_a_tenth_of_a_second(
    tmp_path: Path,
    location: str,
) -> None:
    """While the first target of a job is still in flight in the child, the
    store read by the parent says ``running`` within 0.1 s of its start."""
    with family(tmp_path, location) as spawn:
        child = spawn("c", delay=TIMEOUT, announce=True)
        child.ready()
        with store.open(location) as db:
            child.send("submit 1 2")
            (job_id,) = child.read("ids")["ids"]
            start = child.read("started")
            assert start["started"] == "c.0.0"

            def running() -> bool:
                row = db.get_job(job_id, "c")
                return row is not None and row.status == "running"

            seen = within(start["t"] + 0.1 - time.time(), running)
            seen_at = time.time()
        child.finish()  # the fetch in flight sees the close and returns
    assert seen, "the store did not say running within 0.1 s of the first target's start"
    print(f"running seen in the store {1000 * (seen_at - start['t']):.0f} ms after the start")
