"""Faults under load on PostgreSQL, with real processes.

Each test runs a throwaway PostgreSQL server (``tests/pgserver.py``): one of
its own when the fault restarts it, else a database of its own on a server
this module shares. Two child processes (``tests/chaos_child.py``) each run
one ``batch.Runner`` (8 workers, ``takeover_after=2``, ``resume`` for every
caller) on the store, with jobs of tens to hundreds of targets; the fetch
waits 20 ms and returns ``{"ref": <its target>, "by": <its process>}``.
Once the load has run a while, the test makes one fault:

1. ``pg_ctl restart -m fast``;
2. ``pg_ctl restart -m immediate`` (a crash: the start replays the WAL);
3. every session on the store's database ended (``pg_terminate_backend``)
   every 0.5 s for 5 s;
4. the same every 0.1 s for 10 s;
5. one runner stopped (SIGSTOP) *inside* a write transaction (a beat), for 4.5 s
   against a 2 s lease, then continued (SIGCONT);
6. the same, then killed (SIGKILL) instead.

and checks, whatever the fault:

- every job ends ``done``; every target is stored, once, with the result of
  its own fetch (the result names its ref, and each job's targets are the
  refs it was submitted with, in order); each runner reported stored
  (``Hooks.target``) as many targets as the store holds of its fetches;
- no thread of a runner died: the threads a child had at the start are all
  alive at the end, ``statistics().workers`` is 8, nothing reached
  ``threading.excepthook``, and no public call the child made during the
  fault (``Runner.status``, ``Store.get_job``, ``Runner.statistics`` five
  times a second; ``Runner.wait`` of every job at the end) raised or hung;
- the rate (targets stored per second, from the times the children's
  ``Hooks.target`` saw) in the ``POST`` seconds after the fault is at least
  half the rate in the ``PRE`` seconds before it.

and for the stopped runner (5, 6): the other runner kept storing while it
was stopped (at least half its own rate before), and took the stopped
runner's live jobs before it was continued or killed.

A test gathers every violation before it fails, and says each along with a
digest of both children's logs (their stderr: the ``batch`` and ``store``
loggers) and where the logs are, so one run shows all that went wrong.

The load is sized from the rate measured just before the fault (the
children submit more jobs then), so that it lasts through the fault and the
``POST`` window on any machine, and ends soon after.

``tests/chaos_loop.sh SCENARIO N`` runs one of these N times in a row.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import pgserver
from tests.helpers import eventually
from tests.pg_chaos_load import (
    HOLD,
    KEEPS,
    LEASE,
    PRE,
    TIMEOUT,
    check_rates,
    database,
    holds_write_lock,
    load,
    rows,
    sessions,
    the_end,
    top_up,
    warm_up,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals, pg_ctl"),
]


# -- the server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def bindir() -> Path:
    """PostgreSQL's programs; the tests are skipped without them (failed if CI is set)."""
    found = pgserver.find_bin()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set, and no PostgreSQL server can be found or installed")
        pytest.skip("no PostgreSQL server here")
    return found


@pytest.fixture(scope="module")
def shared(bindir: Path) -> Iterator[pgserver.Server]:
    """A server for the tests whose fault leaves it running (each test has a
    database of its own on it)."""
    with pgserver.running(bindir) as server:
        yield server


# -- 1, 2. the server restarts ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_server_restart_under_load(tmp_path: Path, bindir: Path, mode: str) -> None:
    """``pg_ctl restart -m fast`` or ``-m immediate`` while two runners
    store: every connection of theirs is dropped, the server is away for a
    moment; nothing is lost, nothing is stored twice, no thread dies, and
    the rate is back once the server is."""
    with (
        pgserver.running(bindir) as server,
        database(server) as (dbname, url),
        load(tmp_path, url, dbname) as ld,
    ):
        warm_up(ld)
        top_up(ld, 1.0)
        fault = time.time()
        server.restart(mode)
        back = time.time()
        ld.note(f"restart -m {mode} took {back - fault:.2f} s")
        check_rates(ld, fault, back)
        the_end(ld)


# -- 3, 4. every session of the store ended, again and again ------------------------------


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("every", "lasting"), [(0.5, 5.0), (0.1, 10.0)], ids=["every-0.5s-for-5s", "every-0.1s-for-10s"]
)
def test_sessions_terminated_under_load(
    tmp_path: Path, shared: pgserver.Server, every: float, lasting: float
) -> None:
    """Every session on the store's database (the pool's, ``batch-store``,
    and the listener's, whatever their application_name) is ended with
    ``pg_terminate_backend`` every ``every`` seconds for ``lasting``
    seconds, while two runners store."""
    with database(shared) as (dbname, url), load(tmp_path, url, dbname) as ld:
        warm_up(ld)
        top_up(ld, lasting)
        with psycopg.connect(
            shared.url(), autocommit=True, application_name="chaos-killer"
        ) as admin:
            fault = time.time()
            ended = []
            idle = threading.Event()
            for k in range(round(lasting / every) + 1):
                due = max(0.0, fault + k * every - time.time())
                idle.wait(due)  # allow-sleep: the fault's schedule
                ended.append(pgserver.terminate(admin, dbname))
            back = time.time()
        ld.note(f"{sum(ended)} sessions ended in {len(ended)} rounds over {back - fault:.1f} s")
        if not sum(ended):
            ld.problem("no session was ever ended: the fault did not happen")
        check_rates(ld, fault, back)
        the_end(ld)


# -- 5, 6. a runner stopped inside a write transaction, past its lease --------------------


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("then", ["SIGCONT", "SIGKILL"])
def test_a_runner_stopped_inside_a_write(
    tmp_path: Path, shared: pgserver.Server, then: str
) -> None:
    """Runner B stops itself (SIGSTOP, every thread) inside a beat, right
    after the statement that locks its jobs' rows (see ``arm`` in
    ``chaos_child.py``): its session stays open in that transaction,
    holding those rows (at commit 96e204d it held the advisory lock every
    writer took). It stays stopped HOLD seconds, past its lease (LEASE), then is
    continued or killed. Meanwhile A must go on storing (at least KEEPS of
    its rate before), and take every live job of B that B's open
    transaction does not hold before B is continued or killed; afterwards
    every job ends done (those B held too) and A's rate is back."""
    with database(shared) as (dbname, url), load(tmp_path, url, dbname) as ld:
        a, b = ld.kids["a"], ld.kids["b"]
        warm_up(ld)
        # A alone goes on: it gets enough for the stop and after; B's jobs,
        # once A takes them, are more for A.
        top_up(ld, HOLD, names="a")
        b.send("arm")
        stopping = b.read("stopping")
        fault = stopping["stopping"]
        assert eventually(b.stopped, TIMEOUT, every=0.005), f"b never stopped:\n{b.tail()}"
        try:
            lock = holds_write_lock(url)
            ld.note(
                f"b stopped inside a beat, its jobs' rows locked (the advisory write lock"
                f" held: {lock}); {sessions(url, dbname)}"
            )

            # b's live jobs, and those of them a has not taken though it could:
            # a job whose row b's stopped transaction holds stays b's until
            # that session ends (b continued, killed, or ended by the server
            # as idle in a transaction): nobody can write it meanwhile, so b's
            # outcomes of it stay valid (docs/durability.md).
            untaken = [0, 0]

            def taken() -> bool:
                ((live,),) = rows(
                    url,
                    "SELECT count(*) FROM jobs WHERE owner = 'b'"
                    " AND status IN ('queued', 'running')",
                )
                ((left,),) = rows(
                    url,
                    "SELECT count(*) FROM (SELECT id FROM jobs WHERE owner = 'b'"
                    " AND status IN ('queued', 'running') AND lease_owner IS DISTINCT FROM %s"
                    " FOR KEY SHARE SKIP LOCKED) free",
                    (a.runner_id,),
                )
                untaken[:] = [live, left]
                return bool(left == 0)

            took = eventually(taken, fault + HOLD - time.time(), every=0.05)
            taken_at = time.time()
            mid = sessions(url, dbname)
            idle = threading.Event()
            idle.wait(max(0.0, fault + HOLD - time.time()))  # allow-sleep: the fault's length
        finally:
            b.proc.send_signal(signal.SIGCONT if then == "SIGCONT" else signal.SIGKILL)
        back = time.time()
        if then == "SIGKILL":
            b.proc.wait(TIMEOUT)
        ld.note(f"b {then} after {back - fault:.2f} s stopped")
        if took:
            ld.note(f"a took b's jobs {taken_at - fault:.2f} s after the stop")
        else:
            ld.problem(
                f"a had not taken {untaken[1]} of b's {untaken[0]} live jobs when b was"
                f" {then}ed, {HOLD} s after b stopped with a {LEASE} s lease; then: {mid}"
            )
        during = a.rate(fault, fault + HOLD)
        before = a.rate(fault - PRE, fault)
        ld.note(f"a stored {during:.0f}/s while b was stopped, {before:.0f}/s before")
        if during < KEEPS * before:
            ld.problem(
                f"a stored {during:.0f}/s while b was stopped ({HOLD} s), under {KEEPS:.0%} of"
                f" its {before:.0f}/s before: b's stop stalled a; {mid}"
            )
        check_rates(ld, fault, back, names="a")
        the_end(ld)
