"""The load and the checks of the PostgreSQL fault tests
(``test_pg_chaos.py``): a database per test, two runner processes
(``chaos_child.py``) driven by their pipes, the load they are given, and
what every scenario checks once its fault is over: every job ended,
nothing stored twice or lost, every child's threads alive, the rate back."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import store
import store.engines.postgres
from tests import pgserver
from tests.helpers import ChildProcess, eventually

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("chaos_child.py")

#: Each runner's workers, and the seconds each fetch takes: a runner stores
#: at most WORKERS / DELAY targets a second.
WORKERS = 8
DELAY = 0.02
#: ``Config.takeover_after``: the lease's length.
LEASE = 2.0
#: Seconds of storing before the window that measures the rate before the fault.
WARM = 0.5
#: The windows (seconds) whose rates are compared: before the fault, after it.
PRE = 2.0
POST = 2.5
#: The rate after the fault must be at least this share of the rate before.
KEEPS = 0.5
#: Seconds of load left, at the measured rate, once the POST window ends:
#: enough that the rate can rise by half after the fault (a runner that
#: lost little to it, on a machine busy with other work before) and the
#: load still lasts past the window.
TAIL = 4.0
#: Each runner's jobs: a few small ones (tens of targets), and BIG ones of a
#: size set by the rate, enough of them to keep every worker busy.
SMALL = 4
BIG = 12
#: How long the stopped runner stays stopped (5, 6): past its lease.
HOLD = 4.5
#: How long the jobs may go without a target stored before the test gives
#: up waiting for them to end.
STUCK = 3 * LEASE + 5.0
#: Seconds between two rounds of the children's public calls (the prober).
PROBE_EVERY = 0.2
#: Waits for a child's answers and for the server.
TIMEOUT = 15.0


# -- the server -----------------------------------------------------------------


_databases = iter(range(1, 1 << 30))


@contextlib.contextmanager
def database(server: pgserver.Server) -> Iterator[tuple[str, str]]:
    """A new database on ``server``, the store set up in it: its name and URL."""
    name = f"chaos{next(_databases)}"
    with server.database(name) as url:
        store.open(url).close()
        yield name, url


def rows(url: str, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one statement, on a connection of its own (the test's
    reads never wait for a writer)."""
    with psycopg.connect(url, autocommit=True, application_name="chaos-test") as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description is not None else []


def holds_write_lock(url: str) -> bool | None:
    """Whether some session holds the advisory lock today's writers take
    (None if this version of the store has no such lock)."""
    key = getattr(store.engines.postgres, "LOCK_KEY", None)
    if key is None:
        return None
    with psycopg.connect(url, autocommit=True, application_name="chaos-test") as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        taken = bool(row and row[0])
        if taken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    return not taken


def sessions(url: str, dbname: str) -> str:
    """The store's sessions now, for the report: how many in each state,
    how many wait on a lock, and the locks held by sessions idle in a
    transaction."""
    states = rows(
        url,
        "SELECT coalesce(state, '?'), coalesce(wait_event_type, '-'), count(*)"
        " FROM pg_stat_activity WHERE datname = %s AND application_name <> 'chaos-test'"
        " GROUP BY 1, 2 ORDER BY 1, 2",
        (dbname,),
    )
    held = rows(
        url,
        "SELECT l.locktype, l.mode, count(*) FROM pg_locks l"
        " JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE a.datname = %s AND a.state = 'idle in transaction' AND l.granted"
        " GROUP BY 1, 2 ORDER BY 1, 2",
        (dbname,),
    )
    return (
        "sessions "
        + ", ".join(f"{n} {state}/{wait}" for state, wait, n in states)
        + "; locks held by sessions idle in a transaction: "
        + (", ".join(f"{n} {kind} {mode}" for kind, mode, n in held) or "none")
    )


# -- the children -----------------------------------------------------------------


class Kid(ChildProcess):
    """One child process running one runner on the store (``chaos_child.py``)."""

    def __init__(self, root: Path, url: str, name: str, sizes: list[int]) -> None:
        self.root = root
        self.stored_path = root / f"{name}.stored"
        self.stored_path.touch()
        cfg = {
            "url": url,
            "name": name,
            "dir": str(root),
            "workers": WORKERS,
            "takeover_after": LEASE,
            "delay": DELAY,
            "probe_every": PROBE_EVERY,
            "sizes": sizes,
        }
        self._offset = 0
        self._partial = b""
        self.times: list[float] = []  # of the targets it stored, in order
        self.errors: list[str] = []  # Hooks.target called with an error
        self.jobs: dict[str, int] = {}  # job id -> size, in submit order
        self.runner_id = ""
        self.pid = 0
        self.report: dict[str, Any] | None = None
        super().__init__(name, [sys.executable, str(CHILD), json.dumps(cfg)], root / f"{name}.err")
        self._sizes = list(sizes)

    def ready(self) -> None:
        hello = self.read("ready", TIMEOUT * 2)
        self.runner_id, self.pid = hello["ready"], hello["pid"]
        self.jobs.update(zip(hello["ids"], self._sizes, strict=True))

    def submit(self, sizes: list[int]) -> None:
        self.send("submit " + " ".join(map(str, sizes)))
        ids = self.read("submitted")["submitted"]
        self.jobs.update(zip(ids, sizes, strict=False))

    def stored(self) -> list[float]:
        """The times of the targets it stored so far (read on from the last call)."""
        with self.stored_path.open("rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            t, how = line.decode().split()
            if how == "ok":
                self.times.append(float(t))
            else:
                self.errors.append(how)
        return self.times

    def rate(self, t0: float, t1: float) -> float:
        """Targets it stored a second between ``t0`` and ``t1``."""
        times = self.stored()
        return sum(t0 <= t < t1 for t in times) / (t1 - t0)

    def finish(self, wait: float = 5.0) -> None:
        """Wait for its jobs, close its runner and let it exit; its report."""
        self.send(f"finish {wait}")
        self.report = self.read("finished", wait + 45)["finished"]
        self.proc.wait(TIMEOUT)

    def stopped(self) -> bool:
        """Whether every thread of it is stopped."""
        try:
            return all(
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"
                for task in Path(f"/proc/{self.pid}/task").iterdir()
            )
        except OSError:
            return False

    def tail(self, chars: int = 3000) -> str:
        return self.stderr()[-chars:]

    def digest(self) -> str:
        """Its log, in short: each kind of line (numbers and ids blotted out)
        with its count, most frequent first; then its last lines."""
        text = self.stderr()
        kinds: Counter[str] = Counter()
        for line in text.splitlines():
            m = re.match(r"\d+\.\d+ (\S+) (\w+) (\S+): (.*)", line)
            if m is None:
                continue
            thread, level, logger, message = m.groups()
            thread = re.sub(r"\d+", "N", thread)
            message = re.sub(r"[0-9a-f]{32}", "<id>", message)
            message = re.sub(r"\d+(\.\d+)?", "N", message)[:160]
            kinds[f"{level} {thread} {logger}: {message}"] += 1
        lines = [f"  {n:5d}x {kind}" for kind, n in kinds.most_common(12)]
        return (
            f"--- {self.name} ({self.err}): {len(text.splitlines())} log lines\n"
            + ("\n".join(lines) or "  (nothing logged)")
            + f"\n--- its last lines:\n{text[-2500:]}"
        )


@dataclass
class Load:
    """The two runners of a test, and what the test found wrong so far."""

    url: str
    dbname: str
    root: Path
    kids: dict[str, Kid]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def rate(self, t0: float, t1: float, names: str = "ab") -> float:
        return sum(self.kids[n].rate(t0, t1) for n in names)


def small_and_big(rng: random.Random, big: int) -> list[int]:
    sizes = [rng.randint(20, 60) for _ in range(SMALL)] + [
        rng.randint(big * 4 // 5, big * 6 // 5) for _ in range(BIG)
    ]
    rng.shuffle(sizes)
    return sizes


@contextlib.contextmanager
def load(tmp_path: Path, url: str, dbname: str) -> Iterator[Load]:
    """Two runners in processes of their own, storing, for the block; each
    is killed (if still running) and reaped when the block ends."""
    rng = random.Random(f"{tmp_path.name}")
    # Enough for WARM + PRE at the most a runner can store, and more.
    big = math.ceil(WORKERS / DELAY * (WARM + PRE) * 1.5 / BIG)
    kids: dict[str, Kid] = {}
    try:
        for name in ("a", "b"):
            kids[name] = Kid(tmp_path, url, name, small_and_big(rng, big))
        for kid in kids.values():
            kid.ready()
        yield Load(url, dbname, tmp_path, kids)
    finally:
        for kid in kids.values():
            kid.reap()
        keep = os.environ.get("CHAOS_LOGS")
        if keep:
            # pytest keeps the last three runs' tmp_path only: the loop of
            # tests/chaos_loop.sh keeps each run's logs here.
            shutil.copytree(tmp_path, Path(keep) / tmp_path.name, dirs_exist_ok=True)


def stored_past(ld: Load, t: float, names: str = "ab", timeout: float = TIMEOUT) -> bool:
    """Wait until each runner named has stored a target after time ``t``
    (so a window ending at ``t`` is complete); whether they did in time."""
    return eventually(
        lambda: all(ld.kids[n].stored()[-1:] >= [t] for n in names),
        timeout + max(0.0, t - time.time()),
        every=0.05,
    )


def warm_up(ld: Load) -> None:
    """Wait until both runners have stored for WARM + PRE seconds."""
    assert eventually(lambda: all(k.stored() for k in ld.kids.values()), TIMEOUT, every=0.05), (
        "a runner stored nothing:\n" + "\n".join(k.digest() for k in ld.kids.values())
    )
    first = min(k.stored()[0] for k in ld.kids.values())
    assert stored_past(ld, first + WARM + PRE), (
        "the runners stopped storing before the fault:\n"
        + "\n".join(k.digest() for k in ld.kids.values())
    )


def top_up(ld: Load, seconds: float, names: str = "ab") -> None:
    """Give the runners named enough jobs for ``seconds`` more (then POST,
    then TAIL) at the rate each stored in the last PRE seconds."""
    now = time.time()
    for n in names:
        kid = ld.kids[n]
        rate = kid.rate(now - PRE, now)
        left = sum(kid.jobs.values()) - len(kid.stored())
        more = rate * (seconds + POST + TAIL) - left
        if more > 0:
            kid.submit([max(10, math.ceil(more / BIG))] * BIG)


def wait_for_the_end(ld: Load) -> bool:
    """Wait until no job is live, as long as targets keep being stored;
    whether they all ended."""
    last = [-1, time.monotonic()]

    def ended() -> bool:
        ((live, done),) = rows(
            ld.url,
            "SELECT (SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')),"
            " (SELECT count(*) FROM targets WHERE status <> 'pending')",
        )
        if done != last[0]:
            last[:] = [done, time.monotonic()]
        return live == 0 or time.monotonic() - last[1] > STUCK

    assert eventually(ended, 120, every=0.1)  # ends sooner, once nothing moves
    ((live,),) = rows(ld.url, "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
    if live:
        stuck = rows(
            ld.url,
            "SELECT j.owner, j.status, j.lease_owner IS NOT NULL, j.lease_token,"
            " count(*) FILTER (WHERE t.status = 'pending'), count(*)"
            " FROM jobs j JOIN targets t ON t.job_id = j.id"
            " WHERE j.status IN ('queued', 'running')"
            " GROUP BY j.seq ORDER BY 1, 2",
        )
        ld.problem(
            f"{live} job(s) never ended (no target stored for {STUCK:.0f} s): "
            + "; ".join(
                f"{owner}'s {status} (leased: {leased}, token {token}, {p}/{n} pending)"
                for owner, status, leased, token, p, n in stuck[:10]
            )
        )
    return not live


def finish(ld: Load) -> None:
    """Let every child still running finish (wait, close, report)."""
    for kid in ld.kids.values():
        if kid.proc.poll() is not None:
            continue
        try:
            kid.finish()
        except AssertionError as e:
            ld.problem(f"{kid.name} did not finish: {str(e)[:400]}")


# -- what every scenario checks -----------------------------------------------------


def check_store(ld: Load) -> None:
    """Every job done, every target stored once with the result of its own
    fetch, each reported stored exactly once (but by a runner killed
    between a commit and its hooks)."""
    submitted = {
        i: (kid.name, k, size)
        for kid in ld.kids.values()
        for k, (i, size) in enumerate(kid.jobs.items())
    }
    check_jobs(ld, submitted)
    by = check_targets(ld, submitted)
    total = sum(size for _, _, size in submitted.values())
    reported = {kid.name: len(kid.stored()) for kid in ld.kids.values()}
    # A runner SIGKILLed may have been killed between a commit and its
    # hooks: the outcomes of that one batch (one a worker at most) are
    # stored and never reported. Any other runner reports exactly what it
    # stored.
    killed = {kid.name for kid in ld.kids.values() if kid.proc.returncode == -signal.SIGKILL}
    unreported = {n: by.get(n, 0) - reported[n] for n in reported}
    if any(not 0 <= unreported[n] <= (WORKERS if n in killed else 0) for n in reported):
        ld.problem(
            f"the runners reported {reported} targets stored (by Hooks.target), and the"
            f" store holds {dict(by)} of their fetches: an outcome stored but reported"
            " lost, or reported twice"
        )
    elif any(unreported.values()):
        ld.note(f"killed between a commit and its hooks: {unreported} outcome(s) unreported")
    errors = {kid.name: Counter(kid.errors) for kid in ld.kids.values() if kid.errors}
    if errors:
        ld.problem(f"targets stored with an error (Hooks.target): {errors}")
    ld.note(f"{len(submitted)} jobs, {total} targets")


def check_jobs(ld: Load, submitted: dict[str, tuple[str, int, int]]) -> None:
    """The jobs submitted are in the store, done; and a note of how many
    changed runner."""
    jobs = {
        i: (status, token)
        for i, status, token in rows(ld.url, "SELECT id, status, lease_token FROM jobs")
    }
    missing = sorted(set(submitted) - set(jobs))
    if missing:
        ld.problem(f"{len(missing)} submitted job(s) missing from the store: {missing[:5]}")
    foreign = sorted(set(jobs) - set(submitted))
    if foreign:
        ld.problem(f"{len(foreign)} job(s) in the store that no child submitted: {foreign[:5]}")
    statuses = Counter(status for status, _ in jobs.values())
    if set(statuses) - {"done"}:
        ld.problem(f"jobs not done: {dict(statuses)}")
    ld.note(f"jobs that changed runner: {sum(token > 1 for _, token in jobs.values())}")


def check_targets(ld: Load, submitted: dict[str, tuple[str, int, int]]) -> Counter[str]:
    """Each job's targets are its refs, in order, each done with the result
    of a fetch of its own ref; how many each runner fetched, of those stored."""
    targets: dict[str, list[tuple[int, str, str, str | None, str | None]]] = {}
    for job_id, pos, ref, status, result, error in rows(
        ld.url, "SELECT job_id, pos, ref, status, result, error FROM targets ORDER BY job_id, pos"
    ):
        targets.setdefault(job_id, []).append((pos, ref, status, result, error))
    wrong: list[str] = []
    not_done: Counter[str] = Counter()
    by: Counter[str] = Counter()
    for job_id, (name, k, size) in submitted.items():
        got = targets.get(job_id, [])
        refs = [ref for _, ref, *_ in got]
        expected = [f"{name}.{k}.{i}" for i in range(size)]
        if refs != expected or [pos for pos, *_ in got] != list(range(size)):
            wrong.append(f"job {job_id} ({name}.{k}): {len(refs)} targets, not its {size} refs")
            continue
        for _, ref, status, result, error in got:
            value = None if result is None else json.loads(result)
            if status != "done":
                not_done[f"{status} ({error})"] += 1
            elif not (
                isinstance(value, dict) and value.get("ref") == ref and value.get("by") in ld.kids
            ):
                wrong.append(f"target {ref} stored with the result {result!r}")
            else:
                by[value["by"]] += 1
    if not_done:
        ld.problem(f"targets not done: {dict(not_done)}")
    if wrong:
        ld.problem(f"{len(wrong)} wrong target(s): " + "; ".join(wrong[:5]))
    return by


def check_children(ld: Load) -> None:
    """No thread of a runner died, no public call raised or hung, every
    job waited for ended done."""
    for kid in ld.kids.values():
        report = kid.report
        if report is None:
            continue
        name = kid.name
        lost = sorted(set(report["threads_at_start"]) - set(report["threads_at_end"]))
        if lost:
            ld.problem(f"{name}: threads gone by the end: {lost}")
        if report["died"]:
            ld.problem(
                f"{name}: {len(report['died'])} thread(s) ended by an exception: "
                + "; ".join(f"{d['thread']}: {d['error']}" for d in report["died"][:3])
                + "\n"
                + report["died"][0]["traceback"][-1500:]
            )
        if report["statistics"]["workers"] != WORKERS:
            ld.problem(f"{name}: statistics().workers is {report['statistics']['workers']}")
        if report["api_errors"]:
            calls = Counter(f"{e['call']}: {e['error'][:200]}" for e in report["api_errors"])
            ld.problem(f"{name}: public calls raised: {dict(calls.most_common(5))}")
        if report["prober_alive"]:
            ld.problem(f"{name}: a public call (status/get_job/statistics) hung 15 s at the end")
        if report["close_error"]:
            ld.problem(f"{name}: close raised {report['close_error']}")
        # An exception (a TimeoutError: the job did not end) by its type.
        ended = Counter(status.split("(")[0] for status in report["ended"].values())
        if set(ended) - {"done"}:
            ld.problem(f"{name}: Runner.wait of its jobs: {dict(ended)}")
        ld.note(
            f"{name}: {report['fetches']} fetches of {report['distinct_fetched']} targets,"
            f" {report['probes']} probes"
        )


def check_rates(ld: Load, fault: float, back: float, names: str = "ab") -> None:
    """The rate in the POST seconds from ``back`` is at least KEEPS of the
    rate in the PRE seconds before ``fault``."""
    who = "+".join(names)
    if not stored_past(ld, back + POST, names):
        idle = [n for n in names if ld.kids[n].stored()[-1:] < [back + POST]]
        # A runner whose renewals failed for a lease while the other's went
        # through may have lost every job to it (the contract allows it: the
        # store could be written); with none left it has nothing to store.
        held = [n for n in idle if holds_jobs(ld, n)]
        if held:
            ld.problem(
                f"{' and '.join(held)} stored nothing from the end of the {POST} s after the"
                f" fault to {TIMEOUT:.0f} s later, holding live jobs"
            )
        for n in idle:
            if n not in held:
                ld.note(f"{n} holds no live job after the fault (all taken over)")
    resumed = {}
    for n in names:
        first = next((t for t in ld.kids[n].stored() if t > back), None)
        resumed[n] = "never" if first is None else f"{first - back:.2f} s"
    ld.note(f"first target stored once the fault ended, after: {resumed}")
    before = ld.rate(fault - PRE, fault, names)
    after = ld.rate(back, back + POST, names)
    during = ld.rate(fault, back, names) if back > fault else float("nan")
    ld.note(
        f"rate of {who}: {before:.0f}/s before, {during:.0f}/s during ({back - fault:.2f} s),"
        f" {after:.0f}/s after"
    )
    if after < KEEPS * before:
        ld.problem(
            f"the rate of {who} in the {POST} s after the fault is {after:.0f}/s, under"
            f" {KEEPS:.0%} of the {before:.0f}/s before it"
        )


def holds_jobs(ld: Load, name: str) -> bool:
    """Whether the runner ``name`` holds a live job now."""
    ((live,),) = rows(
        ld.url,
        "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running') AND lease_owner = %s",
        (ld.kids[name].runner_id,),
    )
    return bool(live)


def verdict(ld: Load) -> None:
    ld.note(f"logs in {ld.root}")
    summary = " | ".join(ld.notes)
    # Each line its own (pytest -q writes its dots on the line before).
    print(f"\nchaos: {'FAIL' if ld.problems else 'ok'}: {summary}")
    for p in ld.problems:
        print(f"chaos: problem: {p.splitlines()[0][:300]}")
    assert not ld.problems, (
        f"{len(ld.problems)} problem(s):\n"
        + "\n".join(f"- {p}" for p in ld.problems)
        + f"\n{summary}\n"
        + "\n".join(kid.digest() for kid in ld.kids.values())
    )


def the_end(ld: Load) -> None:
    wait_for_the_end(ld)
    finish(ld)
    check_store(ld)
    check_children(ld)
    verdict(ld)
