"""Test doubles: a clock the test moves, a recording Hooks, a scripted fetch,
and a server run for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import select
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import batch
import store
from tests import pgserver

#: This checkout: what child processes import.
ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 10.0

#: How many times the state machines' example counts to run: 1 keeps the
#: suite within its minutes; ``EXAMPLES=4 pytest tests/test_runner_model.py``
#: searches longer (as the repeated runs of the concurrency tests do).
EXAMPLES = float(os.environ.get("EXAMPLES", "1"))


def examples(n: int) -> int:
    """``n`` examples, times ``EXAMPLES``."""
    return max(1, round(n * EXAMPLES))


#: The database each test's PostgreSQL database is copied from (the store's
#: tables set up, empty); conftest makes it once per run.
TEMPLATE = "store_template"


_names = itertools.count(1)


@contextlib.contextmanager
def fresh(engine: str, root: Path, server: pgserver.Server | None) -> Iterator[str]:
    """Where a new store is, for as long as the block runs: a file path in
    ``root`` (no file yet), or a PostgreSQL URL naming a database of its
    own, the store's tables set up and empty, dropped afterwards."""
    n = next(_names)
    if engine == "sqlite":
        yield str(root / f"jobs{n}.sqlite3")
        return
    if server is None:
        pytest.skip("no PostgreSQL server here")
    with server.copy_of(TEMPLATE) as url:
        yield url


def within(seconds: float, pred: Callable[[], bool]) -> bool:
    """Whether ``pred()`` holds within ``seconds``: for promises made in
    seconds ("the store shows it within 0.1 s"), asked every millisecond."""
    return eventually(pred, seconds, every=0.001)


def eventually(pred: Callable[[], bool], timeout: float = TIMEOUT, every: float = 0.01) -> bool:
    """Whether ``pred()`` holds within ``timeout`` seconds, asked every
    ``every`` seconds: for what no one can notify the test of (a file
    another process writes, the database); gentler than :func:`within` on a
    small machine that also runs child processes."""
    deadline = time.monotonic() + timeout
    idle = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        idle.wait(every)
    return True


class Raw:
    """A connection of its own to the store at ``location``, as another
    process would hold, on either engine: statements with ``?``
    placeholders, each committed at once."""

    def __init__(self, location: str) -> None:
        self.pg = location.startswith("postgresql://")
        if self.pg:
            # No prepared statement: a transaction pooler hands each one
            # to a server session that may not have it.
            self._pg = psycopg.connect(location, autocommit=True, prepare_threshold=None)
        else:
            self._lite = sqlite3.connect(location, timeout=TIMEOUT, isolation_level=None)

    def rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """The statement's rows (none for a statement that returns none)."""
        if self.pg:
            if args:
                cur = self._pg.execute(sql.replace("%", "%%").replace("?", "%s"), args)  # type: ignore[arg-type]
            else:
                cur = self._pg.execute(sql)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []
        return self._lite.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Read the statements of the block from one snapshot."""
        self.rows("BEGIN ISOLATION LEVEL REPEATABLE READ" if self.pg else "BEGIN")
        try:
            yield
        finally:
            self.rows("COMMIT")

    def one(self, sql: str, args: tuple[object, ...] = ()) -> tuple[Any, ...]:
        """The statement's only row."""
        (row,) = self.rows(sql, args)
        return row

    def close(self) -> None:
        (self._pg if self.pg else self._lite).close()


def raw(location: str, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one statement, run through a connection of its own."""
    conn = Raw(location)
    try:
        return conn.rows(sql, args)
    finally:
        conn.close()


def lock_waiters(
    url: str, running: str = "", blocked_by: int | None = None
) -> list[tuple[int, Any]]:
    """The store's sessions waiting on a lock now, on the PostgreSQL server
    at ``url`` (those whose statement holds ``running``, if given; those
    that the server process ``blocked_by`` holds up, if given): each one's
    server process and when its transaction began."""
    return [
        (int(pid), began)
        for pid, began in raw(
            url,
            "SELECT pid, xact_start FROM pg_stat_activity"
            " WHERE application_name = 'batch-store' AND wait_event_type = 'Lock'"
            " AND xact_start IS NOT NULL AND strpos(query, ?) > 0"
            " AND (?::int IS NULL OR ?::int = ANY (pg_blocking_pids(pid)))",
            (running, blocked_by, blocked_by),
        )
    ]


class HeldOnServer:
    """Holds the targets of one job from a connection of its own (on
    PostgreSQL), so that a batch storing one of them stops on the server
    inside its transaction, the job's row locked by it, as a batch does
    whose session is slow or stopped (a client cannot stop inside a batch:
    the batch is one round trip with its COMMIT)."""

    def __init__(self, url: str, job_id: str) -> None:
        self._url = url
        self._conn = psycopg.connect(url, autocommit=False)
        self._conn.execute("SELECT 1 FROM targets WHERE job_id = %s FOR UPDATE", (job_id,))

    def waiters(self) -> list[tuple[int, Any]]:
        """The batches waiting on the targets held (:func:`lock_waiters`);
        not the other writes of their runner, which may queue up behind a
        batch for the job's row (a beat renewing the job's lease, or the
        keeper storing the job ``running``, itself a call of the batch's
        function, late on a loaded host)."""
        return lock_waiters(self._url, "store_record(", self._conn.info.backend_pid)

    def waiting(self) -> bool:
        """Whether one batch waits there now."""
        return len(self.waiters()) == 1

    def release(self) -> None:
        self._conn.rollback()
        self._conn.close()


def hold_write_lock(location: str, seconds: float) -> tuple[float, float]:
    """Hold the store's write lock for ``seconds`` from another connection
    (what a stuck or slow process does to every runner): SQLite's file lock,
    or on PostgreSQL the jobs table locked against every writer (runners
    take no lock of the whole store there: only a table lock stalls them
    all). Returns when it was taken and when it was let go, by
    ``time.time()``."""
    with write_lock(location, wait=True) as taken:
        assert taken
        began = time.time()
        try:
            threading.Event().wait(max(0.0, seconds))  # allow-sleep: the fault's length
        finally:
            ended = time.time()
    return began, ended


def write_locked(location: str) -> bool:
    """Whether some process holds the store's write lock right now (on
    PostgreSQL: is writing jobs)."""
    with write_lock(location, wait=False) as taken:
        return not taken


@contextlib.contextmanager
def write_lock(location: str, *, wait: bool) -> Iterator[bool]:
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True, prepare_threshold=None) as pg:
            pg.execute("BEGIN")
            try:
                pg.execute("LOCK TABLE jobs IN EXCLUSIVE MODE" + ("" if wait else " NOWAIT"))
                taken = True
            except psycopg.errors.LockNotAvailable:
                pg.execute("ROLLBACK")
                taken = False
            try:
                yield taken
            finally:
                if taken:
                    pg.execute("COMMIT")
        return
    timeout = TIMEOUT if wait else 0.05
    with contextlib.closing(
        sqlite3.connect(location, timeout=timeout, isolation_level=None)
    ) as lite:
        try:
            lite.execute("BEGIN EXCLUSIVE" if wait else "BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            if wait:
                raise
            yield False
            return
        try:
            yield True
        finally:
            lite.execute("ROLLBACK" if not wait else "COMMIT")


def trace(db: store.Store, monkeypatch: Any) -> list[str]:
    """Note every statement the store ``db`` runs from now on (with its
    arguments) for the calling thread, on either engine, until the test
    ends (``Store.tracer``): not those of a runner's threads meanwhile."""
    seen: list[str] = []
    me = threading.get_ident()

    def note(sql: str, args: object) -> None:
        if threading.get_ident() == me:
            seen.append(f"{sql} {args!r}")

    monkeypatch.setattr(db, "tracer", note)
    return seen


class ChildProcess:
    """A child process of a test, running this checkout's code: it takes
    commands as lines on its stdin and answers in JSON lines on its stdout
    (:meth:`read` waits for the next message that carries a key; the others
    wait in an inbox for their own read), and logs to the file ``err``."""

    def __init__(self, name: str, argv: list[str], err: Path) -> None:
        self.name = name
        self.err = err
        self._err = err.open("wb")
        self._buf = b""
        self._inbox: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def stderr(self) -> str:
        """What it logged so far."""
        self._err.flush()
        return self.err.read_text(encoding="utf-8", errors="replace")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, key: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next message of the child that carries ``key``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            for i, msg in enumerate(self._inbox):
                if key in msg:
                    return self._inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name} never said {key!r}:\n{self.stderr()[-3000:]}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise AssertionError(
                    f"{self.name} exited before saying {key!r}:\n{self.stderr()[-3000:]}"
                )
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            self._inbox += [json.loads(line) for line in lines if line.strip()]

    def reap(self) -> None:
        """Kill the child if it still runs (stopped or not), reap it and
        close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._err.close()


class Clock:
    """The store's clock, moved by the test: ``store.open(where, clock=clock.time)``."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


def as_async(fetch: Callable[..., Any]) -> Callable[..., Any]:
    """``fetch`` as an ``async def`` fetch: the runner then runs it on its
    event loop, which hands it to a thread (a test's fetch blocks on its
    gates, and must not block the loop)."""

    async def fetch_async(ctx: batch.Context, caller: Any, target: batch.Target) -> Any:
        return await asyncio.to_thread(fetch, ctx, caller, target)

    return fetch_async


#: Makes a runner: ``make(db, fetch, hooks=None, **config)``.
MakeRunner = Callable[..., "batch.Runner[Any]"]


class StepClock:
    """A ``batch.clock.Clock`` the test steps: ``monotonic()`` moves only by
    :meth:`tick`. Its waits return within a few milliseconds of real time
    (the runner loops on its predicates), so nothing waits on this clock
    for longer than the test takes to step it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wait(self, cond: threading.Condition, timeout: float | None) -> None:
        if timeout is None or timeout > 0:
            cond.wait(0.002)

    def tick(self, seconds: float) -> None:
        self.now += seconds


def raising(exc: BaseException) -> Callable[[batch.Context, int], Any]:
    """An answer for ``Script.on`` that raises ``exc`` every time."""

    def answer(ctx: batch.Context, n: int) -> Any:
        raise exc

    return answer


class Recorder(batch.Hooks):
    """Records every hook call, in order; tests wait on it instead of sleeping."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.depths: list[int] = []
        self.inflights: list[int] = []
        self.targets: list[tuple[BaseException | None, float, int]] = []
        self.jobs: list[str] = []
        self.seconds: list[float] = []
        self.retries: list[tuple[BaseException, float]] = []

    def depth(self, live: int) -> None:
        with self._cond:
            self.depths.append(live)
            self._cond.notify_all()

    def inflight(self, n: int) -> None:
        with self._cond:
            self.inflights.append(n)
            self._cond.notify_all()

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        with self._cond:
            self.targets.append((err, seconds, nbytes))
            self._cond.notify_all()

    def job(self, status: str) -> None:
        with self._cond:
            self.jobs.append(status)
            self._cond.notify_all()

    def job_seconds(self, seconds: float) -> None:
        with self._cond:
            self.seconds.append(seconds)
            self._cond.notify_all()

    def retry(self, err: BaseException, wait: float) -> None:
        with self._cond:
            self.retries.append((err, wait))
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[Recorder], bool], timeout: float = TIMEOUT) -> None:
        """Block until ``pred(self)`` holds; fail the test after ``timeout``."""
        with self._cond:
            assert self._cond.wait_for(lambda: pred(self), timeout), "hooks never got there"


class Script:
    """A fetch whose behaviour per ref is set by the test.

    Every call is logged (``calls``, in start order). ``hold(ref)`` makes the
    fetch of ``ref`` signal ``started(ref)`` and block until ``release(ref)``.
    ``on(ref, fn)`` replaces the default answer (``{"ref": ref}``) with ``fn(ctx, n)``
    where ``n`` counts the calls for that ref from 1.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[str] = []
        self._count: dict[str, int] = {}
        self._started: dict[str, threading.Event] = {}
        self._gates: dict[str, threading.Event] = {}
        self._answers: dict[str, Callable[[batch.Context, int], Any]] = {}

    def _event(self, table: dict[str, threading.Event], ref: str) -> threading.Event:
        with self._lock:
            return table.setdefault(ref, threading.Event())

    def hold(self, *refs: str) -> None:
        for ref in refs:
            self._event(self._gates, ref).clear()

    def release(self, ref: str) -> None:
        self._event(self._gates, ref).set()

    def started(self, ref: str, timeout: float = TIMEOUT) -> None:
        assert self._event(self._started, ref).wait(timeout), f"{ref} never started"

    def on(self, ref: str, fn: Callable[[batch.Context, int], Any]) -> None:
        self._answers[ref] = fn

    def __call__(self, ctx: batch.Context, caller: batch.CallerLike, target: batch.Target) -> Any:
        ref = target.ref
        with self._lock:
            self.calls.append(ref)
            n = self._count[ref] = self._count.get(ref, 0) + 1
            gate = self._gates.get(ref)
            started = self._started.setdefault(ref, threading.Event())
        started.set()
        if gate is not None:
            assert gate.wait(TIMEOUT), f"{ref} was never released"
        answer = self._answers.get(ref)
        return {"ref": ref} if answer is None else answer(ctx, n)


@contextlib.contextmanager
def frozen(*paths: Path) -> Iterator[None]:
    """Nobody may write ``paths`` (files or directories) while the block runs:
    their mode bits, or for root, which those do not stop, the immutable
    attribute. Skips the test where neither can be had."""
    if os.geteuid() != 0:
        modes = [p.stat().st_mode for p in paths]
        for p in paths:
            p.chmod(0o500 if p.is_dir() else 0o400)
        try:
            yield
        finally:
            for p, mode in zip(paths, modes, strict=True):
                p.chmod(mode)
        return
    done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, check=False)
    try:
        if done.returncode != 0:
            pytest.skip("no way to make a file read-only for root here")
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], capture_output=True, check=False)
