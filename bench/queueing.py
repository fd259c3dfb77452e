"""Scenario 13, what queue users expect (SPEC §2f): what an idempotency
key, jobs that start later and pruning cost the rest.

- ``submit`` of one-target jobs, one call each, with a new idempotency
  key each against without: the key's unique index and the read back of
  the ids.
- 8 processes submitting the same 1,000 keys at once (each in an order
  of its own): how far the jobs made are from 1,000 (0: one job per key).
- 100,000 jobs with ``not_before`` spread over the next hour, beside
  30,000 jobs waiting for room, against 130,000 jobs waiting for room:
  a runner under ``max_live=1000`` (a process of its own); the most
  memory it held at once while it stored 5,000 targets (Python's
  allocations, traced: resident memory moves by a third between two
  identical runs, too much for a goal of a tenth), and in another run its
  rate over 20,000 targets.
- With 100,000 jobs waiting for times over the next hour (and no other):
  50 jobs due within the next second, each started how long after its
  time (a worker is free).
- 1,000,000 ended jobs (one target each) pruned by ``batch-runner
  prune`` (another process) while a runner works through 10 jobs of 2,000
  no-op targets: the runner's rate against the same without pruning.

Sizes are a tenth with ``--quick``.

    python -m bench.queueing [--rounds N] [--quick] [--engine postgres]
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import batch
import store
from bench.engine import Raw, copy_of, scratch
from bench.measure import REPO, Figure, Goal, Options, Row, Scenario, Series, Unit, alternate
from bench.suite import join, main
from bench.workload import (
    CALLER,
    PATIENCE,
    bounded,
    drain_rate,
    echo,
    open_runner,
    refs,
    together,
)

__all__ = ["SCENARIO"]

#: One of the processes submitting the same keys: its keys in an order of
#: its own, one submit each, from the common start on.
SUBMITTER = """
import json, sys, time
import batch, store
from bench.workload import CALLER, begin_at, echo
location, keys = sys.argv[1], json.loads(sys.argv[2])
with store.open(location) as db, batch.Runner(db, echo, batch.Config(workers=1)) as runner:
    begin_at(float(sys.argv[3]))
    for key in keys:
        runner.submit(CALLER, [key], idempotency_key=key)
    print(time.time())
"""


def submit_rate(jobs: int, keyed: bool) -> float:
    """Submits a second: ``jobs`` one-target jobs, a call each, on a new
    store (the runner fetches them meanwhile, as it would)."""
    with scratch() as path, open_runner(path, echo) as (runner, _):
        start = time.perf_counter()
        for k in range(jobs):
            runner.submit(CALLER, [f"t{k}"], idempotency_key=f"key-{k}" if keyed else None)
        return jobs / (time.perf_counter() - start)


def keys_raced(processes: int, keys: int) -> float:
    """How far from ``keys`` the jobs made by ``processes`` processes
    submitting the same keys at once are."""
    names = [f"order-{k}" for k in range(keys)]
    with scratch() as path:
        store.open(path).close()
        orders = []
        for p in range(processes):
            order = names[:]
            random.Random(p).shuffle(order)
            orders.append([path, json.dumps(order)])
        together(SUBMITTER, orders)
        with store.open(path) as db:
            return abs(len(db.list_jobs()) - keys)


def waiting(path: str, plain: int, later: int) -> None:
    """A store where ``plain`` jobs of one target wait for any runner with
    room and ``later`` more wait for times spread over the hour after the
    next (none comes due while the scenario runs),
    written with raw SQL (the deferred ones as ``submit(not_before=...)``
    stores them)."""
    store.open(path).close()
    now = time.time()
    rng = random.Random(13)
    raw = Raw(path)
    try:
        raw.begin()
        raw.executemany(
            "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, ntargets,"
            " deferred, not_before) VALUES (?, ?, 'queued', 1, 1, 1, 1, ?, ?)",
            (
                (f"{i:032x}", CALLER.id, int(i >= plain), now + 3600 + rng.random() * 3600)
                for i in range(plain + later)
            ),
        )
        raw.executemany(
            "INSERT INTO targets (job_id, pos, ref) VALUES (?, 0, ?)",
            ((f"{i:032x}", f"job{i}-0") for i in range(plain + later)),
        )
        raw.commit()
    finally:
        raw.close()


def lateness(base: str, jobs: int) -> list[float]:
    """On a copy of ``base``: ``jobs`` jobs due within the next second (plus
    0.2 s), each started how many seconds after its time."""
    started: dict[str, float] = {}
    every = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        started[target.ref] = time.time()
        if len(started) == jobs:
            every.set()

    with copy_of(base) as path, open_runner(path, fetch) as (runner, _):
        rng = random.Random(7)
        due = {f"due-{k}": time.time() + 0.2 + rng.random() for k in range(jobs)}
        for ref, at in due.items():
            runner.submit(CALLER, [ref], not_before=at)
        if not every.wait(PATIENCE):
            raise TimeoutError(f"{jobs - len(started)} of {jobs} jobs due never started")
    return [started[ref] - at for ref, at in due.items()]


def ended(path: str, jobs: int) -> None:
    """A store holding ``jobs`` jobs that ended ``done``, one target each,
    written with raw SQL in batches."""
    store.open(path).close()
    raw = Raw(path)
    try:
        for first in range(0, jobs, 50_000):
            ids = range(first, min(jobs, first + 50_000))
            raw.begin()
            raw.executemany(
                "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at,"
                " ntargets, ndone) VALUES (?, ?, 'done', 1, 1, 1, 1, 1)",
                ((f"e{i:031x}", CALLER.id) for i in ids),
            )
            raw.executemany(
                "INSERT INTO targets (job_id, pos, ref, status, result)"
                " VALUES (?, 0, ?, 'done', '{}')",
                ((f"e{i:031x}", f"old{i}") for i in ids),
            )
            raw.commit()
    finally:
        raw.close()


def rate_beside(base: str, pruning: bool) -> float:
    """The runner's rate over 10 jobs of 2,000 no-op targets on a copy of
    ``base``, while ``batch-runner prune`` deletes every ended job from
    another process (or not)."""
    work = [refs(j, 2_000) for j in range(10)]
    with copy_of(base) as path, open_runner(path, echo) as (runner, tally):
        pruner = (
            subprocess.Popen(
                [sys.executable, "-m", "batch", "prune", "--older-than", "0", "--db", path],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # "terminated", when stopped
            )
            if pruning
            else None
        )
        rate = drain_rate(runner, tally, work)
        if pruner is not None:
            pruner.terminate()  # it goes on pruning after the runner is done
            pruner.wait(PATIENCE)
    return rate


def run(opts: Options) -> list[Row]:
    """Each row's two sides in the same rounds, taking turns."""
    scale = 10 if opts.quick else 1
    submits, keys, later = 2_000 // scale, 1_000, 100_000 // scale
    plain, max_live, stored = 30_000 // scale, 1_000 // scale, 20_000 // scale
    traced = stored // 4
    old = 1_000_000 // scale
    with (
        scratch("later.sqlite3") as deferred,
        scratch("plain.sqlite3") as flat,
        scratch("only-later.sqlite3") as only_later,
        scratch("ended.sqlite3") as done,
    ):
        waiting(deferred, plain, later)
        waiting(flat, plain + later, 0)
        waiting(only_later, 0, later)
        ended(done, old)
        measures: dict[str, Callable[[], Any]] = {
            "keyed": lambda: submit_rate(submits, keyed=True),
            "plain": lambda: submit_rate(submits, keyed=False),
            "raced": lambda: keys_raced(8, keys),
            "later": lambda: bounded(deferred, max_live, stored)[1],
            "flat": lambda: bounded(flat, max_live, stored)[1],
            "later held": lambda: bounded(deferred, max_live, traced, traced=True)[0],
            "flat held": lambda: bounded(flat, max_live, traced, traced=True)[0],
            "late": lambda: lateness(only_later, 50),
            "pruning": lambda: rate_beside(done, pruning=True),
            "alone": lambda: rate_beside(done, pruning=False),
        }
        got = alternate(opts.rounds, measures)

    def series(key: str, name: str) -> Series:
        return Series(name, got[key])

    def waiting_later(what: str, unit: Unit, key: str, goal: Goal) -> Figure:
        """A figure of the bounded runner's (``key``: its measure's suffix),
        later jobs waiting against jobs waiting for room."""
        return Figure(
            "13",
            what,
            unit,
            series(f"later{key}", f"{later:,} later + {plain:,} waiting"),
            series(f"flat{key}", f"{later + plain:,} waiting for room"),
            goal,
        )

    return [
        Figure(
            "13",
            f"submit with an idempotency key, {submits:,} jobs",
            "/s",
            series("keyed", "submit(idempotency_key=...)"),
            series("plain", "submit without a key"),
            Goal("ratio", ">=", 0.8),
        ),
        Figure(
            "13",
            f"  8 processes x the same {keys:,} keys: jobs off {keys:,}",
            "n",
            series("raced", "abs(jobs made - keys)"),
            goal=Goal("max", "<=", 0),
        ),
        waiting_later(
            f"{later:,} not_before jobs + {plain:,} waiting: most memory held",
            "B",
            " held",
            Goal("ratio", "<=", 1.1),
        ),
        waiting_later(f"  rate under max_live={max_live:,}", "/s", "", Goal("ratio", ">=", 0.9)),
        Figure(
            "13",
            "  a job due started after its time",
            "ms",
            Series("start - not_before", [1000 * s for v in got["late"] for s in v]),
            goal=Goal("p99", "<", 50),
            spread="p99",
        ),
        Figure(
            "13",
            f"pruning {old:,} ended jobs: runner rate",
            "/s",
            series("pruning", "while Store.prune runs"),
            series("alone", "no pruning"),
            Goal("ratio", ">=", 0.8),
        ),
    ]


SCENARIO: Scenario = join(Scenario("13", "what queue users expect", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
