"""Scenario 1, throughput: 20,000 targets with a no-op fetch on 4 workers, as
10 jobs of 2,000, against three baselines measured in the same rounds.

- raw SQLite: the same rows updated one per transaction (WAL,
  synchronous=NORMAL, 4 threads sharing one connection under a lock). No
  fetch, no scheduling: the ceiling the store's settings allow.
- the naive baseline: ``ThreadPoolExecutor(4)``, one task per target, each
  building the no-op fetch's small dict, encoding it and committing it the
  same way. What one writes without a runner.
- huey (only where it is installed; it is no dependency): ``SqliteHuey`` on
  synchronous=NORMAL like ours, 4 worker threads, otherwise its defaults, one
  task per target. Measured on fewer targets: its rate does not depend on
  the count, and it is slow enough to dominate the suite otherwise.

Every rate runs from the first submit (or enqueue) to the last stored result.
At least five rounds, whatever ``--rounds`` says: the goal is held on the
median of five.

    python -m bench.throughput [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import itertools
import math
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.engine import engine, server_cpu
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main
from bench.workload import (
    PATIENCE,
    WORKERS,
    TargetRow,
    check_done,
    commit_result,
    refs,
    result_json,
    runner_rate,
    scratch,
    targets_table,
    together,
)

__all__ = ["SCENARIO"]


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work one measurement does."""

    jobs: int
    per_job: int
    huey_tasks: int


FULL = Sizes(jobs=10, per_job=2_000, huey_tasks=5_000)

#: Rounds this scenario takes at least, whatever the suite's: its goal is
#: held on the median of five.
ROUNDS = 5
QUICK = Sizes(jobs=10, per_job=200, huey_tasks=500)


# -- raw SQLite and the naive baseline ---------------------------------------------


def raw_sqlite_rate(sizes: Sizes) -> float:
    """Rows per second: :data:`WORKERS` threads each committing its share of
    the rows, results computed beforehand."""
    with targets_table(sizes.jobs, sizes.per_job) as (conn, rows):
        lock = threading.Lock()
        work = [(row, result_json(row[2])) for row in rows]

        def commit_share(k: int) -> None:
            for row, result in work[k::WORKERS]:
                commit_result(conn, lock, row, result)

        threads = [threading.Thread(target=commit_share, args=(k,)) for k in range(WORKERS)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = len(rows) / (time.perf_counter() - start)
        check_done(conn, rows)
        return rate


def executor_rate(sizes: Sizes) -> float:
    """Targets per second of the naive baseline: one task per target, each
    encoding the no-op fetch's small dict and committing it."""
    with targets_table(sizes.jobs, sizes.per_job) as (conn, rows):
        lock = threading.Lock()

        def task(row: TargetRow) -> None:
            commit_result(conn, lock, row, result_json(row[2]))

        start = time.perf_counter()
        with ThreadPoolExecutor(WORKERS) as pool:
            for row in rows:
                pool.submit(task, row)
        rate = len(rows) / (time.perf_counter() - start)
        check_done(conn, rows)
        return rate


# -- huey ---------------------------------------------------------------------------


def huey_installed() -> bool:
    """Whether huey can be imported here: it is a baseline, never a dependency."""
    return importlib.util.find_spec("huey") is not None


def huey_rate(n: int) -> float:
    """Tasks per second of huey: ``n`` no-op tasks enqueued to a running
    consumer of :data:`WORKERS` threads, until the last result is stored."""
    huey: Any = importlib.import_module("huey")
    storage: Any = importlib.import_module("huey.storage")
    signals: Any = importlib.import_module("huey.signals")

    class NormalSqliteStorage(storage.SqliteStorage):  # type: ignore[misc]
        """huey's SQLite storage on synchronous=NORMAL, as the store runs."""

        def _create_connection(self) -> sqlite3.Connection:
            conn: sqlite3.Connection = super()._create_connection()
            conn.execute("PRAGMA synchronous = NORMAL")
            return conn

    with scratch() as path:
        queue = huey.Huey("bench", storage_class=NormalSqliteStorage, filename=str(path))
        done = threading.Event()
        count = itertools.count(1)

        @queue.task()  # type: ignore[untyped-decorator]
        def fetch(ref: str) -> dict[str, str]:
            return {"ref": ref}

        @queue.signal(signals.SIGNAL_COMPLETE)  # type: ignore[untyped-decorator]
        def completed(signal_name: str, task: object) -> None:
            if next(count) == n:
                done.set()

        consumer = queue.create_consumer(workers=WORKERS, worker_type="thread")
        with kept_signal_handlers():
            consumer.start()
            try:
                start = time.perf_counter()
                for i in range(n):
                    fetch(f"job0-{i}")
                if not done.wait(PATIENCE):
                    raise TimeoutError(f"huey ran fewer than {n} tasks in {PATIENCE:g} s")
                return n / (time.perf_counter() - start)
            finally:
                consumer.stop(graceful=True)


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """Put back the signal handlers a huey consumer installs when it starts."""
    signums = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    saved = {signum: signal.getsignal(signum) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


# -- on PostgreSQL ---------------------------------------------------------------------


def executor_pg_rate(sizes: Sizes) -> float:
    """Targets per second of the naive baseline on PostgreSQL: one task per
    target in ``ThreadPoolExecutor(4)``, each thread with a psycopg
    connection of its own, each result committed as its own transaction."""
    import psycopg  # noqa: PLC0415 (only the PostgreSQL suite needs it)

    rows = [
        (f"{j:032x}", i, ref)
        for j in range(sizes.jobs)
        for i, ref in enumerate(refs(j, sizes.per_job))
    ]
    with scratch() as url, psycopg.connect(url, autocommit=True) as setup:
        setup.execute(
            "CREATE TABLE targets (job_id TEXT, pos INTEGER, ref TEXT,"
            " status TEXT NOT NULL DEFAULT 'pending', result TEXT, PRIMARY KEY (job_id, pos))"
        )
        with setup.cursor() as cur:
            cur.executemany("INSERT INTO targets (job_id, pos, ref) VALUES (%s, %s, %s)", rows)
        local = threading.local()
        opened: list[psycopg.Connection[Any]] = []
        lock = threading.Lock()

        def task(row: TargetRow) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = psycopg.connect(url, autocommit=True)
                with lock:
                    opened.append(conn)
            job_id, pos, ref = row
            conn.execute(
                "UPDATE targets SET status = 'done', result = %s WHERE job_id = %s AND pos = %s",
                (result_json(ref), job_id, pos),
            )

        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(WORKERS) as pool:
                for row in rows:
                    pool.submit(task, row)
            rate = len(rows) / (time.perf_counter() - start)
        finally:
            for conn in opened:
                conn.close()
        counted = setup.execute("SELECT count(*) FROM targets WHERE status = 'done'").fetchone()
        done = counted[0] if counted else 0
        if done != len(rows):
            raise RuntimeError(f"the baseline stored {done} of {len(rows)} rows")
        return rate


#: One runner process of :func:`processes_rate`: its share of the jobs, from
#: a start time given, and the time its last target was stored.
PROCESS = """
import sys, time
from bench.workload import CALLER, begin_at, echo, open_runner, refs
url, first, jobs, per_job, start_at = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
work = [refs(j, per_job) for j in range(first, first + jobs)]
with open_runner(url, echo, max_targets=per_job) as (runner, tally):
    begin_at(start_at)
    for job in work:
        runner.submit(CALLER, job)
    tally.wait_stored(jobs * per_job)
    print(time.time())
"""


def processes_rate(processes: int, sizes: Sizes) -> float:
    """Targets per second of ``processes`` runner processes on one database,
    the jobs shared out among them: from their common start to the last
    target stored."""
    share = sizes.jobs // processes
    with scratch() as url:
        store_open(url)
        took = together(
            PROCESS,
            [[url, str(k * share), str(share), str(sizes.per_job)] for k in range(processes)],
        )
        return share * processes * sizes.per_job / took


def store_open(location: str) -> None:
    """Set the store up before several processes open it."""
    import store  # noqa: PLC0415

    store.open(location).close()


def costed(measure: Callable[[], float], targets: int) -> Callable[[], dict[str, float]]:
    """``measure`` as ``rate``, with the CPU this process (``client``) and
    the server (``server``; NaN where it cannot be read) spent per target
    meanwhile, in microseconds."""

    def run() -> dict[str, float]:
        client, server = time.process_time(), server_cpu()
        rate = measure()
        client, after = time.process_time() - client, server_cpu()
        spent = math.nan if server is None or after is None else after - server
        return {"rate": rate, "client": client / targets * 1e6, "server": spent / targets * 1e6}

    return run


def rated(measure: Callable[[], float]) -> dict[str, float]:
    """``measure``'s rate, as :func:`costed` gives it."""
    return {"rate": measure()}


def picked(
    got: dict[str, list[dict[str, float]]], name: str, key: str, what: str = "rate"
) -> Series:
    """The series ``name``: ``what`` of each of ``key``'s measures in ``got``."""
    return Series(name, [r[what] for r in got[key]])


def cpu_per_target(
    got: dict[str, list[dict[str, float]]], what: str, runner: str, where: str
) -> Figure:
    """The CPU the runner and the naive baseline each spent per target,
    ``where`` (``client``: this process; ``server``: PostgreSQL's)."""
    return Figure(
        "1",
        what,
        "us",
        picked(got, runner, "runner", where),
        picked(got, NAIVE, "executor", where),
    )


#: The naive baseline, as its rows name it.
NAIVE = "ThreadPoolExecutor(4), a commit per task"


def ours(sizes: Sizes) -> str:
    """The runner, as its rows name it."""
    return f"batch.Runner, {sizes.jobs} jobs of {sizes.per_job:,}"


def run_postgres(opts: Options) -> list[Row]:
    """On PostgreSQL: the runner against the naive psycopg baseline, with
    the CPU each spends per target on the client and on the server; and the
    rate of 1, 2 and 4 runner processes sharing one database."""
    sizes = QUICK if opts.quick else FULL
    targets = sizes.jobs * sizes.per_job
    measures: dict[str, Callable[[], dict[str, float]]] = {
        "runner": costed(lambda: runner_rate(sizes.jobs, sizes.per_job), targets),
        "executor": costed(lambda: executor_pg_rate(sizes), targets),
    }
    for n in (1, 2, 4):
        measures[f"p{n}"] = functools.partial(rated, functools.partial(processes_rate, n, sizes))
    got = alternate(opts.rounds, measures)

    series = functools.partial(picked, got)
    runner = ours(sizes)
    one = series("1 runner process", "p1")
    return [
        Figure(
            "1",
            "runner vs naive TPE+psycopg commits",
            "/s",
            series(runner, "runner"),
            series(NAIVE, "executor"),
            Goal("ratio", ">=", 1.0),
        ),
        cpu_per_target(got, "client CPU/target, runner vs naive", runner, "client"),
        cpu_per_target(got, "server CPU/target, runner vs naive", runner, "server"),
        Figure(
            "1",
            "2 runner processes, one database",
            "/s",
            series("2", "p2"),
            one,
            Goal("ratio", ">=", 1.4),
        ),
        Figure("1", "4 runner processes, one database", "/s", series("4", "p4"), one),
    ]


# -- the scenario ---------------------------------------------------------------------


def run(opts: Options) -> list[Row]:
    """The runner's rate against each baseline's; huey's row says if it is skipped."""
    if engine() == "postgres":
        return run_postgres(opts)
    sizes = QUICK if opts.quick else FULL
    targets = sizes.jobs * sizes.per_job
    measures: dict[str, Callable[[], dict[str, float]]] = {
        "runner": costed(lambda: runner_rate(sizes.jobs, sizes.per_job), targets),
        "raw": functools.partial(rated, lambda: raw_sqlite_rate(sizes)),
        "executor": costed(lambda: executor_rate(sizes), targets),
    }
    if huey_installed():
        measures["huey"] = functools.partial(rated, lambda: huey_rate(sizes.huey_tasks))
    got = alternate(max(opts.rounds, ROUNDS), measures)
    series = functools.partial(picked, got)
    runner = ours(sizes)

    def against(what: str, key: str, name: str, goal: Goal | None) -> Figure:
        return Figure("1", what, "/s", series(runner, "runner"), series(name, key), goal)

    rows: list[Row] = [
        against("runner vs raw SQLite, 1 row/commit", "raw", "raw SQLite, 4 threads", None),
        against("runner vs naive TPE+SQLite commits", "executor", NAIVE, Goal("ratio", ">=", 1.0)),
        # Where the naive pool's lead comes from: the CPU (the interpreter's
        # lock, mostly) each spends per target stored.
        cpu_per_target(got, "  CPU/target, runner vs naive", runner, "client"),
    ]
    if "huey" in got:
        rows.append(
            against(
                "runner vs huey (SqliteHuey)",
                "huey",
                f"huey SqliteHuey, 4 threads, {sizes.huey_tasks:,} tasks",
                Goal("ratio", ">=", 5.0),
            )
        )
    else:
        rows.append(Skipped("1", "runner vs huey", "huey is not installed"))
    return rows


SCENARIO: Scenario = join(Scenario("1", "throughput", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
