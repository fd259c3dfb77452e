"""Crash safety: a process SIGKILLed at any point leaves a store file that is
intact and holds everything it committed, and the next process to open the
file ends or finishes whatever was left live.

Each test runs a child process that works on a store file and prints one line
after each thing it committed. The test kills it after a random number of
those lines (or a random moment after it starts), checks the file with plain
``sqlite3``, then opens it with the library and checks what recovery made of
it. Every random choice, the children's included, comes from one seeded
``random.Random``: each run makes the same choices, and only the exact moment
of a kill varies with the machine's timing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import batch
import store
from store.runs.match import place
from store.runs.record import digest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"),
]

ROOT = Path(__file__).resolve().parents[1]
SEED = 20240917
TIMEOUT = 10.0
#: The share of kills that come a random moment after the child starts,
#: before it may have printed anything (so also while it creates the schema).
EARLY_KILLS = 0.15
#: What a child prints once it has nothing left to do.
IDLE = "idle"


# -- a child process, killed at a random point ---------------------------------


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Move the child's stdout lines to ``lines``; None once it is closed."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _died(log: Path, why: str) -> AssertionError:
    return AssertionError(f"the child {why}; its stderr:\n{log.read_text()}")


def _pause(proc: subprocess.Popen[str], seconds: float, log: Path) -> None:
    """Let the child run on for ``seconds``; it must not exit meanwhile."""
    try:
        code = proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return
    raise _died(log, f"exited by itself with status {code}")


def run_and_kill(
    script: str, args: Sequence[str], rng: random.Random, most_lines: int, log: Path
) -> list[str]:
    """Run ``script`` in a child process and SIGKILL it at a random point:
    mostly once it has printed a random number (1 to ``most_lines``) of
    progress lines, or said it is idle, and a random moment later; sometimes
    a random moment after it started. Returns every line it printed, and
    checks that it wrote nothing to stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
    lines: queue.Queue[str | None] = queue.Queue()
    read: list[str] = []
    reader = threading.Thread(target=_pump, args=(proc, lines), name="crash-child-stdout")
    reader.start()
    try:
        if rng.random() < EARLY_KILLS:
            _pause(proc, rng.uniform(0.0, 0.4), log)
        else:
            for _ in range(rng.randint(1, most_lines)):
                try:
                    line = lines.get(timeout=TIMEOUT)
                except queue.Empty:
                    raise _died(log, f"printed nothing for {TIMEOUT}s") from None
                if line is None:
                    raise _died(log, "closed its stdout")
                read.append(line)
                if line == IDLE:
                    break
            _pause(proc, rng.choice((0.0, rng.uniform(0.0, 0.02))), log)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(TIMEOUT) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
        reader.join(TIMEOUT)
        assert proc.stdout is not None
        proc.stdout.close()
    assert not reader.is_alive(), "the child's stdout never closed"
    while (rest := lines.get_nowait()) is not None:
        read.append(rest)
    assert not log.read_text(), f"the child wrote to stderr:\n{log.read_text()}"
    return read


def integrity(path: Path) -> None:
    """The file passes SQLite's own check, read with plain ``sqlite3``."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        rows = raw.execute("PRAGMA integrity_check").fetchall()
    assert rows == [("ok",)], f"{path.name}: {rows}"


# -- 1. the batch runner ----------------------------------------------------------

RUNNER_ROUNDS = 20
#: The first rounds all use one file, so recovery meets the leftovers of
#: earlier crashes and recoveries; the others start from a fresh file.
SHARED_ROUNDS = 12
JOBS = 30
HINT = "drop the !"
CALLERS = {name: batch.Caller(name) for name in ("alice", "bob", "carol")}

# A ref ending in "!" fails with TargetError; any other is done with
# {"ref": ref, "size": len(ref)}: the rule of ``fetch`` below, which
# ``expected`` checks every stored target against.
RUNNER_CHILD = textwrap.dedent(
    """
    import random, sys, threading
    import batch, store

    path, seed, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    out = threading.Lock()

    def say(line):
        with out:
            sys.stdout.write(line + "\\n")
            sys.stdout.flush()

    def fetch(ctx, caller, target):
        ref = target.ref
        ctx.wait(0.001 * (len(ref) % 3))
        if ref.endswith("!"):
            raise batch.TargetError("refused " + ref, hint="drop the !")
        return {"ref": ref, "size": len(ref)}

    class Progress(batch.Hooks):
        def target(self, err, seconds, nbytes):
            say("stored")

    callers = [batch.Caller(name) for name in ("alice", "bob", "carol")]
    db = store.open(path)
    runner = batch.Runner(db, fetch, batch.Config(workers=4), hooks=Progress())
    say("ready")
    submitted = []
    for i in range(jobs):
        caller = rng.choice(callers)
        refs = [
            f"{seed}.{i}.{k}" + ("!" if rng.random() < 0.3 else "")
            for k in range(rng.randint(1, 6))
        ]
        job_id = runner.submit(caller, refs)
        submitted.append((caller, job_id))
        say("submitted " + job_id)
        if rng.random() < 0.1 and runner.cancel(caller, job_id):
            say("cancelled " + job_id)
    for caller, job_id in submitted:
        runner.wait(caller, job_id, 30)
    say("idle")
    threading.Event().wait()
    """
)


def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
    """The child's fetch, for the runner that recovers its jobs."""
    if target.ref.endswith("!"):
        raise batch.TargetError(f"refused {target.ref}", hint=HINT)
    return {"ref": target.ref, "size": len(target.ref)}


@dataclass(frozen=True)
class StoredTarget:
    """A target row as stored; ``result`` is the stored JSON text."""

    ref: str
    status: str
    result: str | None
    error: str | None
    hint: str | None

    @property
    def nbytes(self) -> int:
        return sum(len(text.encode()) for text in (self.result, self.error, self.hint) if text)


@dataclass(frozen=True)
class StoredJob:
    owner: str
    status: str
    nbytes: int
    counts: tuple[int, int, int]  # targets, done, failed, as the job's row keeps them
    targets: tuple[StoredTarget, ...]

    @property
    def live(self) -> bool:
        return self.status in ("queued", "running")

    def stored(self) -> list[StoredTarget]:
        return [t for t in self.targets if t.status != "pending"]


def read_jobs(path: Path) -> dict[str, StoredJob]:
    """Every job in the file with its targets, read with plain ``sqlite3``;
    checks that the counts kept with each job (bytes, targets, done,
    failed) and the byte total match them."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        if raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'targets'").fetchone() is None:
            return {}  # killed before the schema was committed
        targets: dict[str, list[StoredTarget]] = {}
        for job_id, *row in raw.execute(
            "SELECT job_id, ref, status, result, error, hint FROM targets ORDER BY job_id, pos"
        ):
            targets.setdefault(job_id, []).append(StoredTarget(*row))
        jobs = {
            job_id: StoredJob(owner, status, nbytes, tuple(counts), tuple(targets.get(job_id, ())))
            for job_id, owner, status, nbytes, *counts in raw.execute(
                "SELECT id, owner, status, nbytes, ntargets, ndone, nfailed FROM jobs"
            )
        }
        (total,) = raw.execute("SELECT sum(total) FROM job_bytes").fetchone()
    for job_id, job in jobs.items():
        assert job.nbytes == sum(t.nbytes for t in job.targets), f"job {job_id}: {job}"
        statuses = Counter(t.status for t in job.targets)
        assert job.counts == (len(job.targets), statuses["done"], statuses["failed"]), job
    assert total == sum(job.nbytes for job in jobs.values()), "the byte total is off"
    return jobs


def by_targets(job: StoredJob) -> str:
    """The terminal status a job's stored targets give it (rule 3)."""
    counts = Counter(t.status for t in job.targets)
    assert not counts["pending"], f"{job} ended with a pending target"
    return "done" if not counts["failed"] else "failed" if not counts["done"] else "partial"


def expected(t: StoredTarget) -> None:
    """A target holds what ``fetch`` gives for its ref, or ``interrupted``."""
    if t.status == "pending":
        assert (t.result, t.error, t.hint) == (None, None, None), t
    elif t.error == "interrupted":
        assert t.status == "failed" and t.result is None, t
        assert t.hint is not None and "resume" in t.hint, t
    elif t.ref.endswith("!"):
        assert (t.status, t.result, t.error, t.hint) == ("failed", None, f"refused {t.ref}", HINT)
    else:
        assert t.status == "done" and t.result is not None, t
        assert json.loads(t.result) == {"ref": t.ref, "size": len(t.ref)}, t
        assert (t.error, t.hint) == (None, None), t


def check_left(before: dict[str, StoredJob], left: dict[str, StoredJob], lines: list[str]) -> None:
    """What a killed runner left: everything it said it committed, nothing
    half-written, and the jobs it found terminal untouched."""
    for job_id, job in before.items():
        assert left.get(job_id) == job, f"job {job_id} changed under a runner that did not own it"
    for job_id, job in left.items():
        assert job.targets, f"job {job_id} was stored without its targets"
        for t in job.targets:
            expected(t)
        statuses = [t.status for t in job.targets]
        # Serial: target i+1 starts only once target i is stored.
        assert statuses == sorted(statuses, key=lambda s: s == "pending"), (job_id, statuses)
        if job.status == "queued":
            assert not job.stored(), f"queued job {job_id} has stored targets"
        if job.live:
            assert "pending" in statuses, f"live job {job_id} has every target stored"
        elif job.status != "cancelled":
            assert job.status == by_targets(job), (job_id, job)
    words = [line.split() for line in lines]
    for word, *rest in words:
        if word == "submitted":
            assert rest[0] in left, f"submitted job {rest[0]} is not in the file"
        elif word == "cancelled":
            assert left[rest[0]].status == "cancelled", f"cancelled job {rest[0]}"
    # Each "stored" line came after its target's commit.
    new = sum(len(job.stored()) for job_id, job in left.items() if job_id not in before)
    assert [w for w, *_ in words].count("stored") <= new


def recover(path: Path, left: dict[str, StoredJob], resume: bool) -> None:
    """Open the file with a new runner, which takes over the killed one's live
    jobs, and wait for every job to end."""
    config = batch.Config(workers=4, resume=CALLERS.get if resume else None)
    with store.open(path) as db, batch.Runner(db, fetch, config) as runner:
        for job_id, job in left.items():
            assert runner.wait(CALLERS[job.owner], job_id, TIMEOUT).terminal
        stats = runner.statistics()
        assert (stats.live, stats.inflight) == (0, 0), stats


def check_recovered(left: dict[str, StoredJob], after: dict[str, StoredJob], resume: bool) -> None:
    """Recovery keeps every stored target and terminal job as it was, and ends
    each live job: by its targets with ``resume``, else ``interrupted``."""
    assert after.keys() == left.keys()
    for job_id, was in left.items():
        now = after[job_id]
        if not was.live:
            assert now == was, f"terminal job {job_id} changed in recovery"
            continue
        assert now.status in ("done", "failed", "partial"), (job_id, now.status)
        assert now.status == by_targets(now), (job_id, now)
        for old, new in zip(was.targets, now.targets, strict=True):
            expected(new)
            if old.status != "pending":
                assert new == old, f"job {job_id}: stored target {old} became {new}"
            elif resume:
                assert new.error != "interrupted", f"job {job_id} was not resumed: {new}"
            else:
                assert (new.status, new.error) == ("failed", "interrupted"), (job_id, new)


@pytest.mark.timeout(180)
def test_runner_killed_at_random_points(tmp_path: Path) -> None:
    """A runner process SIGKILLed at random points, over and over: the file is
    intact, keeps every stored target and every job it announced, and the
    next runner ends every live job it left, by its targets with ``resume``
    and ``interrupted`` without it."""
    rng = random.Random(SEED)
    kills = checked = resumed = 0
    for round_no in range(RUNNER_ROUNDS):
        shared = round_no < SHARED_ROUNDS
        path = tmp_path / ("shared.sqlite3" if shared else f"fresh-{round_no}.sqlite3")
        before = read_jobs(path) if path.exists() else {}
        assert not any(job.live for job in before.values())
        args = [str(path), str(rng.randrange(10**9)), str(JOBS)]
        lines = run_and_kill(RUNNER_CHILD, args, rng, 5 * JOBS, tmp_path / f"runner-{round_no}.err")
        kills += 1

        integrity(path)
        left = read_jobs(path)
        check_left(before, left, lines)

        resume = round_no % 2 == 0
        recover(path, left, resume)
        integrity(path)
        after = read_jobs(path)
        check_recovered(left, after, resume)
        checked += sum(len(job.stored()) for job in left.values())
        resumed += sum(job.live for job in left.values())
    print(
        f"\nrunner: {kills} kills, {checked} stored targets checked after recovery,"
        f" {resumed} live jobs recovered"
    )
    assert kills == RUNNER_ROUNDS


# -- 2. runs, steps, nodes and leases ----------------------------------------------

RUNS_ROUNDS = 25
TTL = 30.0
MAX_LEASES = 2
TERMINAL = ("SUCCEEDED", "FAILED")
UNFINISHED = ("PENDING", "RUNNING")

# One agent for every node, restarted after each kill: it takes over the steps
# its nodes held RUNNING (reading them back from the store) and goes on.
# Every need is met by some node, so no run is ever Unsatisfiable.
RUNS_CHILD = textwrap.dedent(
    """
    import random, sys, time
    import store

    path, seed, ttl, most = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    NODES = {
        "n0": ("linux",),
        "n1": ("linux", "gpu"),
        "n2": ("linux", "arm"),
        "n3": ("linux", "gpu", "arm"),
        "n4": ("linux",),
        "n5": ("linux", "gpu"),
    }
    NEEDS = ((), ("linux",), ("gpu",), ("arm",), ("gpu", "arm"))
    OPS = {
        "submit": 14, "claim": 30, "report": 30, "wake": 4, "cancel": 5,
        "advertise": 4, "drain": 1, "undrain": 3, "heartbeat": 3, "reap": 1,
    }

    def say(*words):
        sys.stdout.write(" ".join(map(str, words)) + "\\n")
        sys.stdout.flush()

    def advertise(node_id):
        name = f"{node_id}-{rng.randrange(100)}"
        db.advertise(store.Advert(node_id, name, NODES[node_id]))
        say("advertise", node_id)

    db = store.open(path, lease_ttl=ttl, max_leases_per_run=most)
    say("open")
    for node_id in NODES:
        advertise(node_id)
    held = {node_id: [] for node_id in NODES}
    live = []
    for state in ("RUNNING", "QUEUED"):
        for run in db.list_runs(state):
            live.append(run.run_id)
            for step in run.steps:
                if step.state == "RUNNING":
                    held[step.node].append((run.run_id, step.seq))
    say("recovered")
    while True:
        op = rng.choices(list(OPS), list(OPS.values()))[0]
        node_id = rng.choice(list(NODES))
        if op == "submit":
            steps = [
                store.Step(f"s{i}", rng.choice(("build", "test", "ship")), rng.choice(NEEDS))
                for i in range(rng.randint(1, 3))
            ]
            run = db.submit_run(steps)
            live.append(run.run_id)
            say("submit", run.run_id, run.state)
        elif op == "claim":
            node_id = rng.choice(sorted(db.unavailable_nodes()) or list(NODES))
            claim = db.claim_step(node_id)
            if claim is None:
                say("claim", node_id, "-")
            else:
                held[node_id].append((claim.run_id, claim.seq))
                say("claim", node_id, claim.run_id, claim.seq)
        elif op == "report":
            busy = [n for n in NODES if held[n]]
            if not busy:
                say("report", "-")
                continue
            node_id = rng.choice(busy)
            run_id, seq = held[node_id].pop(0)
            ok = rng.random() < 0.85
            try:
                db.report_step(node_id, run_id, seq, ok=ok, output={"by": node_id})
            except store.Conflict:
                say("conflict", node_id, run_id, seq)
            else:
                say("report", node_id, run_id, seq, int(ok))
        elif op == "wake":
            say("wake", len(db.wake_queued("agent")))
        elif op == "cancel":
            run_id = rng.choice(live[-50:]) if live else "none"
            say("cancel", run_id, int(db.cancel_run(run_id)))
        elif op == "advertise":
            advertise(node_id)
        elif op == "drain":
            db.drain(node_id)
            say("drain", node_id)
        elif op == "undrain":
            db.undrain(node_id)
            say("undrain", node_id)
        elif op == "heartbeat":
            say("heartbeat", node_id, db.heartbeat(node_id))
        else:
            say("reap", len(db.reap(now=time.time() + 2 * ttl)))
    """
)


def read_sealed(path: Path) -> dict[str, tuple[Any, ...]]:
    """Every sealed Record row, as stored."""
    with contextlib.closing(sqlite3.connect(path)) as raw:
        if raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'").fetchone() is None:
            return {}
        return {
            run_id: tuple(row)
            for run_id, *row in raw.execute(
                "SELECT run_id, state, reason, opened_at, sealed_at, steps, digest"
                " FROM records WHERE sealed_at IS NOT NULL"
            )
        }


def check_lines(raw: sqlite3.Connection, lines: list[str]) -> None:
    """Whatever the agent said it committed is in the file."""
    runs = {
        r: (state, reason) for r, state, reason in raw.execute("SELECT id, state, reason FROM runs")
    }
    steps = {
        (r, seq): state for r, seq, state in raw.execute("SELECT run_id, seq, state FROM steps")
    }
    for line in lines:
        word, *rest = line.split()
        if word == "submit":
            assert rest[0] in runs, f"submitted run {rest[0]} is not in the file"
        elif word == "claim" and len(rest) == 3:
            assert steps[rest[1], int(rest[2])] != "PENDING", f"claimed step lost: {line}"
        elif word == "report" and len(rest) == 4:
            state = "SUCCEEDED" if rest[3] == "1" else "FAILED"
            assert steps[rest[1], int(rest[2])] == state, f"report lost: {line}"
        elif word == "cancel" and rest[1] == "1":
            assert runs[rest[0]] == ("FAILED", "cancelled"), f"cancel lost: {line}"


def check_runs(db: store.Store, raw: sqlite3.Connection) -> int:
    """The rules that hold of a run store at rest, after a wake. Returns the
    number of runs checked."""
    runs = {
        run_id: (state, started_at, ended_at)
        for run_id, state, started_at, ended_at in raw.execute(
            "SELECT id, state, started_at, ended_at FROM runs"
        )
    }
    steps: dict[str, list[tuple[int, str, str, frozenset[str]]]] = {}
    for run_id, seq, state, node_id, needs in raw.execute(
        "SELECT run_id, seq, state, node_id, needs FROM steps ORDER BY run_id, seq"
    ):
        steps.setdefault(run_id, []).append((seq, state, node_id, frozenset(json.loads(needs))))
    leases = raw.execute("SELECT node_id, run_id FROM leases").fetchall()
    lease_of = dict(leases)
    assert len(lease_of) == len(leases), f"a node holds two leases: {leases}"
    caps = {n: frozenset(json.loads(c)) for n, c in raw.execute("SELECT id, caps FROM nodes")}
    unavailable = db.unavailable_nodes()
    for node_id, run_id in leases:
        state = runs.get(run_id, ("missing",))[0]
        assert state == "RUNNING", f"{state} run {run_id} holds a lease on {node_id}"
    for run_id, (state, started_at, ended_at) in runs.items():
        run_steps = steps.get(run_id, [])
        assert run_steps, f"run {run_id} was stored without its steps"
        held = sorted(n for n, r in leases if r == run_id)
        assert len(held) <= MAX_LEASES, f"run {run_id} holds {held}"
        unfinished = [s for s in run_steps if s[1] in UNFINISHED]
        if state == "QUEUED":
            assert not held, f"QUEUED run {run_id} holds leases on {held}"
            assert all(node == "" for _, _, node, _ in run_steps), f"QUEUED {run_id} has a node"
            assert all(s[1] == "PENDING" for s in run_steps) and started_at is None, run_id
            needs = [(seq, n) for seq, _, _, n in run_steps]
            fit = place(needs, caps, unavailable, MAX_LEASES)
            assert fit is None, f"QUEUED run {run_id} fits {fit} after the wake at open"
        elif state == "RUNNING":
            assert unfinished, f"RUNNING run {run_id} has no step left"
            for seq, step_state, node, _ in unfinished:
                # A RUNNING step (and any step still to come) sits on a node
                # whose lease belongs to its own run.
                assert lease_of.get(node) == run_id, (
                    f"step {seq} of {run_id} is {step_state} on {node!r},"
                    f" leased to {lease_of.get(node)!r}"
                )
        else:
            assert not unfinished and not held and ended_at is not None, run_id
            want = {"SUCCEEDED"} if state == "SUCCEEDED" else {"SUCCEEDED", "FAILED"}
            assert {s[1] for s in run_steps} <= want, (run_id, state, run_steps)
        rec = db.record(run_id)
        assert rec["run_id"] == run_id
        if state in TERMINAL:
            assert rec["sealed_at"] is not None and "digest" in rec, f"open Record: {rec}"
            assert rec["state"] == state
            assert [s["state"] for s in rec["steps"]] == [s[1] for s in run_steps]
            body = {k: v for k, v in rec.items() if k != "digest"}
            assert digest(body) == rec["digest"], (
                f"the Record of {run_id} does not match its digest"
            )
        else:
            assert rec["sealed_at"] is None and "digest" not in rec, f"sealed while {state}: {rec}"
        assert [s["node_id"] for s in rec["steps"]] == [s[2] for s in run_steps], rec
    return len(runs)


@pytest.mark.timeout(180)
def test_run_store_killed_at_random_points(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An agent hammering one run store, SIGKILLed at random points over and
    over on the same file: the file is intact, keeps what the agent said it
    committed, never changes a sealed Record, and opening it (which wakes the
    queue) finds every rule of leases, queue and Records holding."""
    rng = random.Random(SEED + 1)
    path = tmp_path / "runs.sqlite3"
    sealed: dict[str, tuple[Any, ...]] = {}
    kills = runs_checked = 0
    for round_no in range(RUNS_ROUNDS):
        args = [str(path), str(rng.randrange(10**9)), str(TTL), str(MAX_LEASES)]
        lines = run_and_kill(RUNS_CHILD, args, rng, 400, tmp_path / f"runs-{round_no}.err")
        kills += 1

        integrity(path)
        now_sealed = read_sealed(path)
        for run_id, row in sealed.items():
            assert now_sealed.get(run_id) == row, f"the sealed Record of {run_id} changed"
        caplog.clear()
        with (
            store.open(path, lease_ttl=TTL, max_leases_per_run=MAX_LEASES) as db,
            contextlib.closing(sqlite3.connect(path)) as raw,
        ):
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert not errors, f"opening the file logged {errors}"
            check_lines(raw, lines)
            runs_checked += check_runs(db, raw)
        integrity(path)
        sealed = read_sealed(path)
    print(
        f"\nrun store: {kills} kills, {runs_checked} runs checked, {len(sealed)} sealed at the end"
    )
    assert kills == RUNS_ROUNDS
