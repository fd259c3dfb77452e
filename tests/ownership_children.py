"""Runners in processes of their own on one store, for the tests of who
holds which job: the child's program (``CHILD``), the handle the parent
drives it by (``Child``, spawned and reaped by ``family``), each child's log
of fetches, and the store's rows as the parent reads them."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import store
from tests.helpers import (
    TIMEOUT,
    ChildProcess,
    Raw,
    eventually,
    raw,
    write_locked,
)

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
    import batch, store, store.engines.sqlite

    cfg = json.loads(sys.argv[1])
    store.engines.sqlite.BUSY_TIMEOUT = cfg["busy_timeout"]  # read at connect time
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
