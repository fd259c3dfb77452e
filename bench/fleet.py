"""Processes on one PostgreSQL database, each running its share of one
workload from a common start: runners, or the naive baseline (scenarios
10 and 14).

- :data:`RUNNER`: a ``batch.Runner`` with its jobs, each fetch a wait;
- :data:`NAIVE`: a ``ThreadPoolExecutor`` doing the same wait per target,
  then one INSERT and its commit per result on a connection of the
  thread's own. What one writes without a runner: no fairness, no serial
  rule, no lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from bench.delay import delayed
from bench.engine import scratch
from bench.measure import Figure, Goal, Series
from bench.workload import Shape, together

__all__ = ["NAIVE", "RUNNER", "four_against_one", "open_store", "processes_rate", "results_table"]

#: One runner process: its jobs, from the common start; prints the time its
#: last target was stored.
RUNNER = """
import sys, time
from bench.workload import CALLER, begin_at, open_runner
url, name = sys.argv[1], sys.argv[2]
workers, jobs, per_job = map(int, sys.argv[3:6])
latency, start_at = float(sys.argv[6]), float(sys.argv[7])

def fetch(ctx, caller, target):
    time.sleep(latency)  # allow-sleep: the network call each target waits on
    return {"ref": target.ref}

work = [[f"{name}-{j}-{i}" for i in range(per_job)] for j in range(jobs)]
with open_runner(url, fetch, workers=workers, max_targets=per_job) as (runner, tally):
    begin_at(start_at)
    for job in work:
        runner.submit(CALLER, job)
    tally.wait_stored(jobs * per_job)
    print(time.time())
"""

#: One naive process: a thread pool, a connection per thread, a commit per
#: result; prints the time its last result was committed.
NAIVE = """
import json, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import psycopg
from bench.workload import begin_at
url, name = sys.argv[1], sys.argv[2]
workers, jobs, per_job = map(int, sys.argv[3:6])
latency, start_at = float(sys.argv[6]), float(sys.argv[7])
local = threading.local()
opened = []
lock = threading.Lock()

def task(ref):
    time.sleep(latency)  # allow-sleep: the network call each target waits on
    conn = getattr(local, "conn", None)
    if conn is None:
        conn = local.conn = psycopg.connect(url, autocommit=True)
        with lock:
            opened.append(conn)
    conn.execute(
        "INSERT INTO results (ref, result) VALUES (%s, %s)",
        (ref, json.dumps({"ref": ref}, separators=(",", ":"))),
    )

refs = [f"{name}-{j}-{i}" for j in range(jobs) for i in range(per_job)]
with ThreadPoolExecutor(workers) as pool:
    begin_at(start_at)
    for ref in refs:
        pool.submit(task, ref)
print(time.time())
for conn in opened:
    conn.close()
"""


def processes_rate(
    child: str,
    processes: int,
    shape: Shape,
    setup: Callable[[str], None],
    *,
    far: bool = False,
) -> float:
    """Targets per second of ``processes`` copies of ``child`` on one new
    database (set up by ``setup``), from their common start to the last
    target stored; ``far``: every connection through a proxy a round trip
    away (``bench.delay``)."""
    with scratch() as url:
        setup(url)
        work = [str(shape.workers), str(shape.jobs), str(shape.per_job), str(shape.latency)]
        with delayed(url) if far else contextlib.nullcontext(url) as reached:
            took = together(child, [[reached, f"p{k}", *work] for k in range(processes)])
        return processes * shape.jobs * shape.per_job / took


def open_store(url: str) -> None:
    """Set the store up before the processes open it."""
    import store  # noqa: PLC0415

    store.open(url).close()


def results_table(url: str) -> None:
    """The naive baseline's table."""
    import psycopg  # noqa: PLC0415 (only the PostgreSQL suite needs it)

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE results (ref TEXT PRIMARY KEY, result TEXT NOT NULL)")


def four_against_one(
    scenario: str, what: str, rates: Mapping[str, list[float]], goal: float
) -> Figure:
    """The row of four runner processes against one (``rates`` by
    ``runner4`` and ``runner1``): how the work grows with processes."""
    return Figure(
        scenario,
        what,
        "/s",
        Series("4 runner processes", rates["runner4"]),
        Series("1 runner process", rates["runner1"]),
        Goal("ratio", ">=", goal),
    )
