"""Runners in several processes share one store file: who holds which job.

Each child process runs one ``batch.Runner`` (``CHILD`` below) on the same
file, and the parent makes the faults: it holds the store's write lock past
the busy timeout and the lease, stops a child past its lease (SIGSTOP, then
SIGCONT), kills one (SIGKILL), and cancels and waits from a process that
does not own the job. Every fetch a child makes is logged, with its time, to
a file of its own, so the parent can tell which process fetched what, and
when; every stored result names the process that fetched it.

Test 6 makes, in one process, the moment a SIGSTOP can only hit by luck:
a runner frozen between storing a target and moving its job on. Test 7
opens a new store file while another process holds its write lock. Tests
4 and 5 (another process cancels, waits, sees running) are in
``test_ownership_elsewhere.py``; the children in ``ownership_children.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import (
    TIMEOUT,
    Recorder,
    Script,
    eventually,
    hold_write_lock,
    raw,
)
from tests.ownership_children import (
    ROOT,
    family,
    hold,
    live_jobs,
    read_store,
    stop_between_writes,
    taken_over,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]


# -- 1. a stall of the whole store --------------------------------------------


@pytest.mark.timeout(40)
def test_a_stall_of_the_store_takes_no_job(tmp_path: Path, location: str) -> None:
    """Another process holds the write lock past the busy timeout and past
    the lease (2.5 s against 0.3 s and 1 s): every runner fails to store and
    to renew meanwhile, and none of them loses a job for it. Every job ends
    done, every target was fetched exactly once, no fencing token moved, no
    target was stored ``interrupted``; and while the runners could not renew
    for a lease's length they started no target."""
    with family(tmp_path, location) as spawn:
        kids = [spawn(name, delay=0.02) for name in ("a", "b")]
        for kid in kids:
            kid.ready()
        for kid in kids:
            kid.send("submit 6 40")
        ids = {kid.name: kid.read("ids")["ids"] for kid in kids}
        assert eventually(lambda: all(len(kid.fetches()) >= 20 for kid in kids))

        began, ended = hold_write_lock(location, 2.5)

        after_stall = taken_over(location)
        # Every runner beats three times a lease: a second after the stall,
        # each has beaten (and would have taken the other's jobs) and goes on
        # with its own.
        assert eventually(
            lambda: all(sum(f.t > ended + 1.0 for f in kid.fetches()) >= 5 for kid in kids)
        )
        later = taken_over(location)
        live_later = live_jobs(location)
        ended_jobs = {kid.name: kid.ask("wait 20", "ended", 30) for kid in kids}
        for kid in kids:
            kid.finish()
        errors = {kid.name: kid.stderr() for kid in kids}
        fetched = [f for kid in kids for f in kid.fetches()]
    jobs, targets = read_store(location)

    # The stall happened: the runners could neither renew nor store. SQLite
    # refuses them past the busy timeout (logged); PostgreSQL keeps them
    # waiting for the lock (nothing to log).
    if not location.startswith("postgresql://"):
        for name, text in errors.items():
            assert "cannot renew the leases" in text, (name, text[-2000:])
    # Nothing of a job was stored while the lock was held: each job started
    # at most the one target that waited for the lock.
    during = [f for f in fetched if began < f.t < ended]
    assert max(Counter(f.job for f in during).values(), default=0) <= 1, during
    # A runner that could not renew for takeover_after starts no target
    # (its last renewal came before the lock was taken).
    assert [f for f in fetched if began + 1.0 + 0.1 < f.t < ended] == []

    # No job changed owner, right after the stall, a second later while the
    # jobs still ran, or in the end.
    assert (after_stall, later) == (0, 0)
    assert live_later > 0, "the jobs ended too soon to show the runners kept them"
    assert taken_over(location) == 0
    assert all(j.lease_token == 1 for j in jobs.values())

    # Every job done, every target fetched exactly once and stored by the
    # process that submitted it.
    assert ended_jobs == {name: dict.fromkeys(ids[name], "done") for name in ids}
    assert {j.status for j in jobs.values()} == {"done"}
    assert Counter(f.ref for f in fetched) == Counter(set(targets))
    assert all(t.status == "done" and t.by == t.ref.split(".")[0] for t in targets.values())
    assert [t for t in targets.values() if t.error == "interrupted"] == []
    print(
        f"stall {ended - began:.2f}s: {len(during)} fetches started during it, "
        + ", ".join(
            f"{n}: {t.count('cannot renew')} renewals and {t.count('cannot store')} stores failed"
            for n, t in errors.items()
        )
    )


# -- 2. a runner stopped past its lease, then continued -------------------------

NOT_STORED = re.compile(r"target \d+ of job (\w+) not stored")
LOST = re.compile(r"lost the lease of job (\w+) to another runner")


@pytest.mark.timeout(40)
def test_a_runner_stopped_past_its_lease_loses_its_jobs_and_nothing_else(
    tmp_path: Path,
    location: str,
) -> None:
    """B is stopped (SIGSTOP) with fetches in flight, for 2.5 s against a
    1 s lease, while A lives. A takes B's jobs once their lease lapsed
    (their token moves to 2) and goes on with them from the first pending
    target. When B continues (SIGCONT), the outcomes it had in flight are
    refused and logged, it starts no further target of them, and its
    workers are all alive. Every job ends done, every target stored once."""
    with family(tmp_path, location) as spawn:
        a = spawn("a", delay=0.05)
        b = spawn("b", delay=0.4)
        a.ready()
        b.ready()
        a_ids = a.ask("submit 2 10", "ids")
        b_ids = b.ask("submit 3 30", "ids")
        assert eventually(lambda: len(b.fetches()) >= 3)

        stopped = stop_between_writes(b, location)
        try:
            ((b_beat,),) = raw(
                location, "SELECT heartbeat_at FROM runners WHERE id = ?", (b.runner_id,)
            )

            def taken() -> bool:
                jobs, _ = read_store(location)
                return all(
                    (jobs[i].lease_owner, jobs[i].lease_token) == (a.runner_id, 2) for i in b_ids
                )

            assert eventually(taken), "A never took B's jobs"
            taken_at = time.time()
            hold(stopped + 2.5 - time.time())
            live_at_cont = sum(
                read_store(location)[0][i].status in ("queued", "running") for i in b_ids
            )
        finally:
            b.send_signal(signal.SIGCONT)
        continued = time.time()

        def b_jobs_done() -> bool:
            jobs, _ = read_store(location)
            return all(jobs[i].status == "done" for i in b_ids)

        assert eventually(b_jobs_done), "A never finished B's jobs"
        a_ended = a.ask("wait 10", "ended")
        b_ended = b.ask("wait 10", "ended")
        b_stats = b.ask("stats", "stats")
        a.finish()
        b.finish()
        b_err = b.stderr()
        a_fetched, b_fetched = a.fetches(), b.fetches()
    jobs, targets = read_store(location)

    # A took B's jobs only once their lease lapsed, and while B was stopped.
    assert taken_at >= b_beat + 1.0
    assert taken_at < continued
    assert live_at_cont > 0, "A finished B's jobs before B continued: nothing left to show"

    # Every job done, every target done and stored once: by B before it was
    # stopped, or by A (which never fetched a target twice).
    assert a_ended == dict.fromkeys(a_ids, "done")
    assert b_ended == dict.fromkeys(b_ids, "done")
    assert {j.status for j in jobs.values()} == {"done"}
    assert {t.status for t in targets.values()} == {"done"}
    assert {j.id: j.lease_token for j in jobs.values()} == {
        **dict.fromkeys(a_ids, 1),
        **dict.fromkeys(b_ids, 2),
    }
    assert set(Counter(f.ref for f in a_fetched).values()) == {1}
    assert set(Counter(f.ref for f in b_fetched).values()) == {1}
    for ref, t in targets.items():
        fetchers = {f.who for f in (*a_fetched, *b_fetched) if f.ref == ref}
        assert t.by in fetchers, (ref, t, fetchers)
        assert t.by == "a" or fetchers == {"b"}, (ref, t, fetchers)

    # B fetched nothing once stopped: no target of a taken job after
    # SIGCONT, not even the next one of those it had in flight.
    assert [f for f in b_fetched if f.t >= stopped] == []
    in_flight = {f.ref for f in b_fetched} - {r for r, t in targets.items() if t.by == "b"}
    assert 1 <= len(in_flight) <= 2, in_flight
    assert all(targets[r].by == "a" for r in in_flight)
    in_flight_jobs = {targets[r].job_id for r in in_flight}

    # B logged each refused outcome and each job it found lost, once each.
    assert sorted(NOT_STORED.findall(b_err)) == sorted(in_flight_jobs), b_err[-3000:]
    assert sorted(LOST.findall(b_err)) == sorted(set(b_ids) - in_flight_jobs), b_err[-3000:]
    gauges = {k: b_stats[k] for k in ("workers", "live", "inflight", "waiting_retry", "closed")}
    assert gauges == {"workers": 2, "live": 0, "inflight": 0, "waiting_retry": 0, "closed": False}
    print(
        f"B stopped {continued - stopped:.2f}s with {len(in_flight)} target(s) in flight;"
        f" A took its jobs {taken_at - stopped:.2f}s after the stop;"
        f" {live_at_cont} of B's jobs live at SIGCONT;"
        f" B fetched {sum(f.t >= continued for f in b_fetched)} target(s) after SIGCONT"
    )


# -- 3. a runner killed mid-work, three processes ----------------------------------


@pytest.mark.timeout(40)
def test_the_jobs_of_a_killed_runner_are_finished_by_the_others(
    tmp_path: Path, location: str
) -> None:
    """Three runners; one is killed (SIGKILL) mid-work. Its process is gone
    on this host, so another takes its jobs at its next beat, long before
    their lease lapses, and finishes them. Nothing stored before the kill is
    lost, no target is stored twice, only the targets the killed process
    had in flight are fetched again, and every job ends done."""
    lapse = 3.0
    with family(tmp_path, location) as spawn:
        kids = [spawn(name, delay=0.05, takeover_after=lapse) for name in ("a", "b", "c")]
        for kid in kids:
            kid.ready()
        for kid in kids:
            kid.send("submit 3 20")
        ids = {kid.name: kid.read("ids")["ids"] for kid in kids}
        a, b, c = kids
        assert eventually(lambda: all(len(kid.fetches()) >= 6 for kid in kids))

        before_jobs, before = read_store(location)
        b.send_signal(signal.SIGKILL)
        killed = time.time()
        b.proc.wait(TIMEOUT)
        orphans = [i for i in ids["b"] if before_jobs[i].status in ("queued", "running")]

        def taken() -> bool:
            jobs, _ = read_store(location)
            return all(jobs[i].lease_token == 2 or jobs[i].status == "done" for i in orphans)

        assert eventually(taken)
        taken_at = time.time()
        assert eventually(lambda: live_jobs(location) == 0), "the jobs never ended"
        ended = {kid.name: kid.ask("wait 10", "ended") for kid in (a, c)}
        for kid in (a, c):
            kid.finish()
        fetched = {kid.name: kid.fetches() for kid in kids}
    jobs, targets = read_store(location)

    assert orphans, "B's jobs had all ended before it was killed"
    assert taken_at - killed < lapse * 2 / 3, "taken only once the lease lapsed"
    assert ended == {n: dict.fromkeys(ids[n], "done") for n in ("a", "c")}
    assert {j.status for j in jobs.values()} == {"done"}
    assert {t.status for t in targets.values()} == {"done"}
    # Only B's unfinished jobs changed owner, each once.
    assert {i for i, j in jobs.items() if j.lease_token != 1} == set(orphans)
    assert {jobs[i].lease_token for i in orphans} == {2}
    # What was stored before the kill is there as it was.
    done_before = {r: t for r, t in before.items() if t.status == "done"}
    assert {r: targets[r] for r in done_before} == done_before
    # Each stored result is the fetch of the process that stored it; the
    # survivors fetched each target at most once between them, and only
    # what B had in flight when killed was fetched twice.
    survivors = Counter(f.ref for n in ("a", "c") for f in fetched[n])
    assert set(survivors.values()) == {1}
    b_refs = {f.ref for f in fetched["b"]}
    assert len(b_refs) == len(fetched["b"])
    twice = b_refs & set(survivors)
    assert len(twice) <= 2, twice  # B's workers
    assert {r for r, t in targets.items() if t.by == "b"} == b_refs - twice
    assert all(targets[r].by in ("a", "c") for r in twice)
    print(
        f"killed b with {len(orphans)} live job(s), {len(done_before)} targets done before;"
        f" taken {taken_at - killed:.2f}s after the kill (lease {lapse}s);"
        f" {len(twice)} target(s) in flight fetched again"
    )


# -- 6. the worst moment to stop: between a commit and moving the job on --------------


def tokens(location: str) -> dict[str, int]:
    """Every job's fencing token, by id."""
    return dict(raw(location, "SELECT id, lease_token FROM jobs"))


@pytest.mark.timeout(30)
def test_a_runner_frozen_after_a_commit_starts_nothing_of_a_job_it_lost(
    tmp_path: Path, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moment test 2 can only hit by luck, made on purpose (in one
    process, so the moment can be chosen): runner B stores target 0 of job
    J, then freezes, as SIGSTOP would freeze it, before it moves J on; its
    beats are frozen too. Its leases lapse and A takes J and K. B thaws: its
    beat learns that both leases are lost (it halts K, which it was not
    running), then its commit returns. B must start no further target of
    J: the store gave J to A, and B's beat has told it so."""
    frozen, thaw_beat, thaw_commit = threading.Event(), threading.Event(), threading.Event()
    alice = batch.Caller("alice")
    lapse = 0.5
    with store.open(location) as a_db, store.open(location) as b_db:
        real_targets, real_beat = Ledger.of(b_db).store_targets, Ledger.of(b_db).beat_runner

        def store_targets(outcomes: Any, **kwargs: Any) -> store.Stored:
            stored = real_targets(outcomes, **kwargs)
            if outcomes and not frozen.is_set():
                frozen.set()  # committed; frozen before the runner moves on
                thaw_commit.wait(TIMEOUT)
            return stored

        def beat_runner(*args: Any, **kwargs: Any) -> store.Beat:
            if frozen.is_set():
                thaw_beat.wait(TIMEOUT)
            return real_beat(*args, **kwargs)

        monkeypatch.setattr(Ledger.of(b_db), "store_targets", store_targets)
        monkeypatch.setattr(Ledger.of(b_db), "beat_runner", beat_runner)
        b_fetch, a_fetch = Script(), Script()
        b_fetch.hold("j0")
        a_fetch.hold("j1", "k0")
        hooks = Recorder()
        b = batch.Runner(b_db, b_fetch, batch.Config(workers=1, takeover_after=lapse), hooks)
        a: batch.Runner[batch.Caller] | None = None
        try:
            j = b.submit(alice, ["j0", "j1", "j2"])
            k = b.submit(alice, ["k0", "k1"])
            b_fetch.release("j0")
            assert frozen.wait(TIMEOUT), "B never stored j0"
            config = batch.Config(workers=1, takeover_after=lapse, resume=lambda cid: alice)
            a = batch.Runner(a_db, a_fetch, config)
            assert eventually(lambda: tokens(location) == {j: 2, k: 2}), "A never took J and K"
            thaw_beat.set()
            # B's beat halted K (it leaves B's rotation); J, in flight, is
            # left to its commit.
            hooks.wait_for(lambda h: h.depths[-2:] == [2, 1])
            thaw_commit.set()
            assert eventually(lambda: b.statistics().live == 0), "B kept J"
            b_calls = list(b_fetch.calls)
            a_fetch.release("j1")
            a_fetch.release("k0")
            assert [a.wait(alice, i, TIMEOUT).status for i in (j, k)] == ["done", "done"]
            job = a.status(alice, j)
        finally:
            thaw_beat.set()
            thaw_commit.set()
            a_fetch.release("j1")
            a_fetch.release("k0")
            b.close(TIMEOUT)
            if a is not None:
                a.close(TIMEOUT)
    # A stored every target of J after j0; B's refused fetch stored nothing.
    assert [t.result for t in job.targets] == [{"ref": "j0"}, {"ref": "j1"}, {"ref": "j2"}]
    assert b_calls == ["j0"], f"B fetched {b_calls[1:]} of job J after its beat found J lost"


# -- 7. a new store file, opened while another process is writing it ------------------

#: Says ``opening``, opens the store file (default BUSY_TIMEOUT) and says how
#: that went.
OPENER = textwrap.dedent(
    r"""
    import json, sys, time
    import store
    print(json.dumps({"opening": True}), flush=True)
    t = time.monotonic()
    try:
        store.open(sys.argv[1]).close()
    except store.StoreError as e:
        print(json.dumps({"error": str(e), "after": time.monotonic() - t}), flush=True)
    else:
        print(json.dumps({"error": None, "after": time.monotonic() - t}), flush=True)
    """
)


@pytest.mark.timeout(30)
def test_a_new_store_file_opened_while_another_process_writes_it_waits(tmp_path: Path) -> None:
    """Two processes that open one new store file at once: the first holds
    the file's write lock while it makes it a WAL file and writes the
    schema. The second must wait for that lock, as every statement of the
    store waits for another process's lock (``BUSY_TIMEOUT``), not fail at
    once with "database is locked". Here the parent holds the write lock of
    the new, still empty file while the child opens it, and lets go 0.3 s
    later."""
    path = tmp_path / "new.sqlite3"
    with contextlib.closing(sqlite3.connect(path, timeout=TIMEOUT, isolation_level=None)) as raw:
        raw.execute("BEGIN IMMEDIATE")
        child = subprocess.Popen(
            [sys.executable, "-c", OPENER, str(path)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert child.stdout is not None
            said = b""
            deadline = time.monotonic() + TIMEOUT
            while b"\n" not in said and time.monotonic() < deadline:
                ready, _, _ = select.select([child.stdout], [], [], TIMEOUT)
                chunk = os.read(child.stdout.fileno(), 1 << 16) if ready else b""
                if ready and not chunk:
                    break  # the child is gone
                said += chunk
            assert json.loads(said.split(b"\n")[0]) == {"opening": True}
            try:
                hold(0.3)  # the first process writing the new file
            finally:
                raw.execute("COMMIT")
            out, _ = child.communicate(timeout=TIMEOUT)
            got = json.loads((said + out).split(b"\n")[1])
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(TIMEOUT)
            if child.stdout is not None:
                child.stdout.close()
    print(f"store.open of the new file: {got}")
    assert got["error"] is None, f"store.open failed after {got['after']:.3f}s: {got['error']}"
    with store.open(path) as db:  # and the file is a store
        assert db.list_jobs() == []
