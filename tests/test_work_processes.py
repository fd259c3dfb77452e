"""``batch-runner work`` as a deployment runs it (SPEC §2g): real worker
processes on one store, fed by a client; one drained by SIGTERM, one
SIGKILLed and taken over; ``/healthz`` following the store away and back."""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import batch
import store
from store.engines.sqlite import BUSY_TIMEOUT
from tests import pgbouncer, pgserver
from tests.helpers import TIMEOUT, eventually, raw, write_lock
from tests.work_helpers import (  # noqa: F401 (the fixture ``workplace``)
    GRACE,
    workers,
    workplace_fixture,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ALICE = batch.Caller("alice")


def test_a_fleet_runs_a_clients_jobs_through_a_drain_and_a_kill(
    db: store.Store, location: str, workplace: Path
) -> None:
    """The issue's case: a client submits 1,000 jobs that three worker
    processes run; one is sent SIGTERM mid-run and exits 0 within its
    grace, another is SIGKILLed and its jobs are taken over: every job
    ends done, every target stored once."""
    with batch.Client(db) as client, workers(workplace, location, 3) as (drained, killed, _):
        ids = client.submit_many(ALICE, [[f"{j}.0", f"{j}.1"] for j in range(1000)])
        ended: list[batch.Job] = []
        for job in client.as_completed(ALICE, ids, 240):
            ended.append(job)
            if len(ended) == 100:
                drained.proc.send_signal(signal.SIGTERM)
                term_at = time.monotonic()
            elif len(ended) == 200:
                held = _held_by(location, killed.proc.pid)
                killed.proc.kill()
        assert drained.proc.wait(TIMEOUT) == 0, drained.log()
        assert drained.exited_at is not None and drained.exited_at - term_at < GRACE + 1
        assert "terminated (SIGTERM): taking nothing new" in drained.log()
        assert killed.proc.wait(TIMEOUT) == -signal.SIGKILL
    assert Counter(j.status for j in ended) == {"done": 1000}
    assert sorted(j.id for j in ended) == sorted(ids)
    for job in ended:
        assert [t.result["ref"] for t in job.targets] == [t.target.ref for t in job.targets]
    # Stored once: one event of each target stored, whoever fetched it.
    stored = dict(
        raw(location, "SELECT id, count(*) FROM events WHERE kind = 'target.stored' GROUP BY id")
    )
    assert set(stored) == set(ids) and set(stored.values()) == {2}
    # Taken over: the jobs the killed worker held ended all the same.
    assert held, "the killed worker held no job"
    assert {j.id for j in ended} >= held


def _held_by(location: str, pid: int) -> set[str]:
    """The live jobs the runner of process ``pid`` holds, once it holds some."""
    held: set[str] = set()

    def look() -> bool:
        held.update(
            job_id
            for (job_id,) in raw(
                location,
                "SELECT j.id FROM jobs j JOIN runners r ON j.lease_owner = r.id"
                " WHERE r.pid = ? AND j.status IN ('queued', 'running')",
                (pid,),
            )
        )
        return bool(held)

    assert eventually(look)
    return held


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_healthz_follows_the_store_away_and_back(
    location: str,
    workplace: Path,
    pg_server: pgserver.Server | None,
    pg_bouncer: pgbouncer.Bouncer | None,
) -> None:
    """``/healthz`` answers 200 while the worker works, 503 within one beat
    of its store going away (PostgreSQL stopped, or the PgBouncer in front
    of it; on SQLite, another process holding the write lock, which a beat
    waits ``BUSY_TIMEOUT`` for), 200 once it is back; ``/metrics`` has the
    runner's metrics and the store's."""
    beat = 1.0 / 3  # --takeover-after 1: three beats a second
    if pgbouncer.fronts(location):
        assert pg_bouncer is not None
        away = contextlib.ExitStack()
        away.callback(pg_bouncer.start)
        stop: Callable[[], None] = pg_bouncer.stop
        answer = 1.0
    elif location.startswith("postgresql://"):
        assert pg_server is not None
        away = contextlib.ExitStack()
        away.callback(pg_server.resume)
        stop = pg_server.stop
        answer = 1.0
    else:
        away = contextlib.ExitStack()
        stop = lambda: away.enter_context(write_lock(location, wait=True))  # noqa: E731
        answer = BUSY_TIMEOUT
    with workers(workplace, location, 1, "--metrics-port", "0") as (w,):
        found = w.said(r"serving /metrics and /healthz on http://127\.0\.0\.1:(\d+)")
        assert found is not None
        port = int(found.group(1))
        assert _health(port) == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT) as r:
            metrics = r.read().decode()
        assert "batch_live_jobs" in metrics and "batch_store_up 1.0" in metrics
        with away:
            stop()
            gone = time.monotonic()
            assert eventually(lambda: _health(port) == 503, timeout=TIMEOUT)
            # One beat, and the beat's own wait for an answer.
            assert time.monotonic() - gone < beat + answer + 1.0
        assert eventually(lambda: _health(port) == 200, timeout=TIMEOUT)
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(TIMEOUT) == 0, w.log()
