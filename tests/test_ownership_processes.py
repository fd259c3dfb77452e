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
opens a new store file while another process holds its write lock.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import batch
import store
from tests.helpers import (
    TIMEOUT,
    ChildProcess,
    Raw,
    Recorder,
    Script,
    eventually,
    hold_write_lock,
    raw,
    within,
    write_locked,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

ROOT = Path(__file__).resolve().parents[1]

#: One runner in a process of its own, driven by lines on its stdin and
#: answering with one JSON object a line on its stdout. Its fetch logs
#: ``<name> <ref> <time.time()>`` to its log file, waits ``delay`` seconds
#: (on the context, so close cuts it short) and returns ``{"ref", "by"}``.
#: Refs are ``<name>.<job>.<target>``: the submitting process, the job's
#: place among its jobs, the target's place in the job.
CHILD = textwrap.dedent(
    r"""
    import dataclasses, json, logging, os, sys, threading, time
    import batch, store, store.sqlite

    cfg = json.loads(sys.argv[1])
    store.sqlite.BUSY_TIMEOUT = cfg["busy_timeout"]  # read at connect time
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="%(created).6f %(levelname)s %(message)s"
    )
    name = cfg["name"]
    lock = threading.Lock()
    log = open(cfg["log"], "a", encoding="utf-8")
    tried = set()

    def say(**fields):
        with lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    def fetch(ctx, caller, target):
        ref = target.ref
        with lock:
            log.write(f"{name} {ref} {time.time():.6f}\n")
            log.flush()
            first = ref not in tried
            tried.add(ref)
        if cfg["announce"]:
            say(started=ref, t=time.time())
        if first and ref in cfg["busy_once"]:
            raise batch.RetryLater("busy the first time")
        ctx.wait(cfg["delay"])
        return {"ref": ref, "by": name}

    db = store.open(cfg["path"])
    config = batch.Config(
        workers=cfg["workers"],
        takeover_after=cfg["takeover_after"],
        retry_wait=cfg["retry_wait"],
        resume=lambda cid: batch.Caller(cid),
    )
    runner = batch.Runner(db, fetch, config)
    caller = batch.Caller(name)
    ids = []
    say(runner=runner.id, pid=os.getpid())
    try:
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "submit":
                for _ in range(int(args[0])):
                    k = len(ids)
                    refs = [f"{name}.{k}.{i}" for i in range(int(args[1]))]
                    ids.append(runner.submit(caller, refs))
                say(ids=ids)
            elif cmd == "wait":
                say(ended={i: runner.wait(caller, i, float(args[0])).status for i in ids})
            elif cmd == "status":
                say(status={i: runner.status(caller, i).status for i in ids})
            elif cmd == "stats":
                say(stats=dataclasses.asdict(runner.statistics()), t=time.time())
            elif cmd == "close":
                break
    finally:
        runner.close(10)
        db.close()
        say(closed=True)
    """
)


@dataclass(frozen=True)
class Fetched:
    """One line of a child's fetch log."""

    who: str
    ref: str
    t: float

    @property
    def job(self) -> str:
        """The job's ref prefix: ``<submitter>.<k>``."""
        return self.ref.rsplit(".", 1)[0]


class Child(ChildProcess):
    """One child process running one runner on the shared store file."""

    def __init__(
        self,
        tmp_path: Path,
        location: str,
        name: str,
        *,
        delay: float,
        workers: int = 2,
        takeover_after: float = 1.0,
        busy_timeout: float = 0.3,
        retry_wait: float = 1.0,
        busy_once: tuple[str, ...] = (),
        announce: bool = False,
    ) -> None:
        self.log = tmp_path / f"{name}.log"
        self.log.touch()
        cfg = {
            "path": location,
            "name": name,
            "log": str(self.log),
            "delay": delay,
            "workers": workers,
            "takeover_after": takeover_after,
            "busy_timeout": busy_timeout,
            "retry_wait": retry_wait,
            "busy_once": list(busy_once),
            "announce": announce,
        }
        self.runner_id = ""
        self.pid = 0
        super().__init__(
            name, [sys.executable, "-c", CHILD, json.dumps(cfg)], tmp_path / f"{name}.err"
        )

    def ready(self) -> None:
        """Wait for the child's runner to be up."""
        hello = self.read("runner")
        self.runner_id, self.pid = hello["runner"], hello["pid"]

    def ask(self, line: str, key: str, timeout: float = TIMEOUT) -> Any:
        """Send a command and return the ``key`` of its answer."""
        self.send(line)
        return self.read(key, timeout)[key]

    def fetches(self) -> list[Fetched]:
        """Every fetch the child started so far, in order (a line cut short
        by SIGKILL is left out)."""
        text = self.log.read_text(encoding="utf-8")
        out = []
        for line in text.split("\n")[:-1]:
            who, ref, t = line.split()
            out.append(Fetched(who, ref, float(t)))
        return out

    def send_signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def finish(self) -> None:
        """Close the child's runner and let the child exit."""
        self.send("close")
        self.read("closed")
        assert self.proc.wait(TIMEOUT) == 0, self.stderr()[-3000:]


@contextlib.contextmanager
def family(tmp_path: Path, location: str) -> Iterator[Callable[..., Child]]:
    """Spawn children for the block, on a store file made beforehand; every
    one is killed (if still running) and reaped when the block ends,
    however it ends.

    The file is made here, not by the children: several processes opening a
    new file at once fail now and then (the last test of this file)."""
    store.open(location).close()
    kids: list[Child] = []

    def spawn(name: str, **kwargs: Any) -> Child:
        kid = Child(tmp_path, location, name, **kwargs)
        kids.append(kid)
        return kid

    try:
        yield spawn
    finally:
        for kid in kids:
            kid.reap()


def hold(seconds: float) -> None:
    """Let a fault last ``seconds``: the length of the fault is what is under
    test, so this is the one wait on time alone."""
    threading.Event().wait(max(0.0, seconds))  # allow-sleep: the fault's length


@dataclass(frozen=True)
class StoredJob:
    id: str
    owner: str
    status: str
    lease_owner: str | None
    lease_token: int


@dataclass(frozen=True)
class StoredTarget:
    job_id: str
    pos: int
    ref: str
    status: str
    result: Any
    error: str | None

    @property
    def by(self) -> str | None:
        """The process whose fetch was stored."""
        return None if self.result is None else self.result["by"]


def read_store(location: str) -> tuple[dict[str, StoredJob], dict[str, StoredTarget]]:
    """Jobs by id and targets by ref, read in one transaction."""
    conn = Raw(location)
    try:
        with conn.snapshot():
            jobs = {
                row[0]: StoredJob(*row)
                for row in conn.rows("SELECT id, owner, status, lease_owner, lease_token FROM jobs")
            }
            targets = {
                row[2]: StoredTarget(
                    *row[:4], None if row[4] is None else json.loads(row[4]), row[5]
                )
                for row in conn.rows("SELECT job_id, pos, ref, status, result, error FROM targets")
            }
    finally:
        conn.close()
    return jobs, targets


def taken_over(location: str) -> int:
    """How many jobs ever changed owner (their fencing token moved past 1)."""
    ((n,),) = raw(location, "SELECT count(*) FROM jobs WHERE lease_token > 1")
    return int(n)


def live_jobs(location: str) -> int:
    ((n,),) = raw(location, "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
    return int(n)


def is_stopped(pid: int) -> bool:
    """Whether every thread of the process is stopped (a SIGSTOP is not
    instant: a thread running on another CPU goes on until it is told)."""
    tasks = Path(f"/proc/{pid}/task")
    if tasks.exists():
        states = [
            (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()
        ]
        return all(state in "Tt" for state in states)
    ps = subprocess.run(
        ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=True
    )
    return ps.stdout.strip().startswith("T")


def stop_between_writes(kid: Child, location: str) -> float:
    """SIGSTOP ``kid`` just after one of its fetches started (so it has a
    fetch in flight) at a moment it holds no write lock on the store (else
    the stop would stall every runner: the fault of another test). Returns
    a time by which it was stopped, every thread of it."""
    for _ in range(20):
        seen = len(kid.fetches())
        assert eventually(lambda n=seen: len(kid.fetches()) > n), f"{kid.name} fetches nothing"
        kid.send_signal(signal.SIGSTOP)
        assert eventually(lambda: is_stopped(kid.pid), every=0.001)
        stopped = time.time()  # no thread of it runs from here on
        if not write_locked(location):
            return stopped
        kid.send_signal(signal.SIGCONT)
    raise AssertionError(f"{kid.name} always held the write lock")


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
        real_targets, real_beat = b_db.store_targets, b_db.beat_runner

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

        monkeypatch.setattr(b_db, "store_targets", store_targets)
        monkeypatch.setattr(b_db, "beat_runner", beat_runner)
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
