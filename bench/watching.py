"""Scenario 12, watching: how soon what happens on the store is seen, and
what watching and its counts cost.

(a) event seen: a job submitted through one handle of the store, its
    ``job.submitted`` seen by a watcher on another (its own connections,
    as another process has), counted from when the submit returned.
    Goal: p99 under 50 ms on PostgreSQL (woken by a notice), under 0.15 s
    on SQLite (a look every 50 ms).
(b) wait on a job another runner holds: ``Runner.wait`` through one
    handle, on a job leased to a runner elsewhere, returns after the job's
    end was committed through another handle; counted from that commit's
    return. Against what ``wait`` did before the store's events: a look at
    the store every 0.1 s. Goal: p99 under 50 ms on PostgreSQL.
(c) a scrape of the store's gauges (``Store.gauges``) with 1,000,000 jobs
    stored, against counting the jobs by status. Goal: under 10 ms.
(d) what 100 watchers cost the writers: scenario 1's work (20,000 no-op
    targets, 4 workers, 10 jobs) with 100 watches open on the store, in 4
    other processes, against none, in turns. Goal: at least 0.95x. On a
    machine of few cores the watchers' own CPU is taken from the writers:
    a second row runs them at the lowest priority, as if elsewhere, for
    what they cost through the store alone.
(e) what metrics cost: scenario 7's second I/O row (64 workers, fetches of
    10 ms) with ``batch.metrics.Metrics`` as its hooks, against none, in
    turns. Goal: at least 0.95x.

    python -m bench.watching [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import batch
import store
from bench import engine
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main
from bench.workload import CALLER, PATIENCE, Tally, drain_rate, echo, open_runner, refs
from store.ledger import Ledger

__all__ = ["SCENARIO"]


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each measure does per round."""

    events: int
    waits: int
    jobs: int
    targets: int
    watchers: int


FULL = Sizes(events=200, waits=50, jobs=1_000_000, targets=2_000, watchers=100)
QUICK = Sizes(events=20, waits=10, jobs=20_000, targets=200, watchers=8)

#: What ``wait`` did before the store's events: a look every so many seconds.
OLD_POLL = 0.1
#: Processes the watchers of (d) are spread over.
WATCHER_PROCESSES = 4


def ms(seconds: float) -> float:
    return seconds * 1e3


# -- (a) an event seen by another handle ------------------------------------------------


def event_latencies(samples: int) -> list[float]:
    """Milliseconds from a submit's return to its event seen elsewhere."""
    out: list[float] = []
    with (
        engine.scratch() as location,
        store.open(location) as writer,
        store.open(location) as reader,
        reader.watch() as events,
    ):
        for i in range(samples):
            Ledger.of(writer).create_job(f"e{i}", "bench", [])
            committed = time.perf_counter()
            while True:
                event = events.get(timeout=PATIENCE)
                if event is None:
                    raise RuntimeError("an event was never seen")
                if event.id == f"e{i}":
                    break
            out.append(ms(time.perf_counter() - committed))
            time.sleep(random.uniform(0.0, 0.1))  # allow-sleep: out of step with the poll
    return out


# -- (b) a wait on a job held elsewhere --------------------------------------------------


def _hold(db: store.Store, job_id: str) -> store.Lease:
    """A job leased to a runner elsewhere, as one that runs it holds it."""
    Ledger.of(db).create_job(job_id, CALLER.id, ["x"], "elsewhere", lease_for=PATIENCE)
    return store.Lease("elsewhere", 1)


def _end(db: store.Store, job_id: str, lease: store.Lease) -> float:
    """End the job through ``db``; when the commit returned."""
    Ledger.of(db).store_targets(
        [
            store.TargetOutcome(
                job_id, 0, store.TargetState.DONE, result="1", lease=lease,
                job_status=store.JobStatus.DONE,
            )
        ]
    )  # fmt: skip
    return time.perf_counter()


def wait_latencies(samples: int) -> tuple[list[float], list[float]]:
    """Milliseconds from a job's end, committed through one handle, to
    ``Runner.wait`` returning through another; and to a look every
    ``OLD_POLL`` seconds seeing it."""
    ours: list[float] = []
    polled: list[float] = []
    with (
        engine.scratch() as location,
        store.open(location) as there,
        store.open(location) as here,
        batch.Runner(here, echo, batch.Config(workers=1)) as runner,
    ):
        Ledger.of(there).register_runner("elsewhere", PATIENCE)
        for i in range(samples):
            ours.append(_one_wait(there, f"w{i}", lambda j: runner.wait(CALLER, j, PATIENCE)))
            polled.append(_one_wait(there, f"p{i}", lambda j: _poll(here, j)))
    return ours, polled


def _poll(db: store.Store, job_id: str) -> None:
    """What ``wait`` did before: look at the job every ``OLD_POLL`` seconds."""
    while db.job_status(job_id, CALLER.id) != store.JobStatus.DONE:
        time.sleep(OLD_POLL)  # allow-sleep: the old way, measured


def _one_wait(there: store.Store, job_id: str, wait: Callable[[str], object]) -> float:
    """Milliseconds from the end of ``job_id`` (held elsewhere, ended
    through ``there``) to ``wait(job_id)`` returning on another thread."""
    lease = _hold(there, job_id)
    returned: list[float] = []
    ready = threading.Event()

    def waiting() -> None:
        ready.set()
        wait(job_id)
        returned.append(time.perf_counter())

    waiter = threading.Thread(target=waiting)
    waiter.start()
    ready.wait(PATIENCE)
    time.sleep(random.uniform(0.05, 0.15))  # allow-sleep: the waiter waits by now
    ended = _end(there, job_id, lease)
    waiter.join(PATIENCE)
    return ms(returned[0] - ended)


# -- (c) a scrape at size ------------------------------------------------------------------


@contextlib.contextmanager
def stored_jobs(n: int) -> Iterator[store.Store]:
    """A store holding ``n`` jobs without targets, some ended."""
    with engine.scratch() as location, store.open(location) as db:
        batch_size = 10_000
        for start in range(0, n, batch_size):
            Ledger.of(db).create_jobs(
                "bench", [(f"g{k}", []) for k in range(start, min(n, start + batch_size))]
            )
        for k in range(0, n, 100):
            db.cancel_job(f"g{k}", "bench")
        yield db


def scrapes(n: int, samples: int = 20) -> tuple[list[float], list[float]]:
    """Milliseconds of ``Store.gauges`` with ``n`` jobs, and of counting
    them by status."""
    ours: list[float] = []
    counted: list[float] = []
    with stored_jobs(n) as db:
        raw = engine.Raw(db.path)
        try:
            for _ in range(samples):
                start = time.perf_counter()
                db.gauges()
                ours.append(ms(time.perf_counter() - start))
                start = time.perf_counter()
                raw.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
                counted.append(ms(time.perf_counter() - start))
        finally:
            raw.close()
    return ours, counted


# -- (d) watchers beside the writers --------------------------------------------------------

WATCHERS = """
import sys, threading
import store
location, n = sys.argv[1], int(sys.argv[2])
with store.open(location) as db:
    watches = [db.watch() for _ in range(n)]
    def drain(w):
        for _ in w:
            pass
    threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in watches]
    for t in threads:
        t.start()
    print("watching", flush=True)
    sys.stdin.readline()
    for w in watches:
        w.close()
"""


def rate(targets: int, watchers: int, *, niced: bool = False) -> float:
    """Targets per second of scenario 1's work, ``watchers`` watches open on
    the store meanwhile in other processes (``niced``: at the lowest CPU
    priority, as if on other machines: what they cost through the store)."""
    work = [refs(j, targets) for j in range(10)]
    with engine.scratch() as location:
        store.open(location).close()
        procs = [
            subprocess.Popen(
                [
                    *(["nice", "-n", "19"] if niced else []),
                    sys.executable,
                    "-c",
                    WATCHERS,
                    location,
                    str(watchers // WATCHER_PROCESSES),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(WATCHER_PROCESSES if watchers else 0)
        ]
        try:
            for p in procs:
                assert p.stdout is not None
                if p.stdout.readline().strip() != "watching":
                    raise RuntimeError("a watcher process did not start")
            with open_runner(location, echo, max_targets=targets) as (runner, tally):
                return drain_rate(runner, tally, work)
        finally:
            for p in procs:
                with contextlib.suppress(OSError):
                    assert p.stdin is not None
                    p.stdin.write("\n")
                    p.stdin.close()
                p.wait(PATIENCE)


# -- (e) metrics on an I/O row -----------------------------------------------------------

#: Scenario 7's second I/O row: workers, the fetch's latency, jobs, targets a job.
IO = (64, 0.01, 500, 20)
IO_QUICK = (64, 0.01, 100, 10)


def io_rate(shape: tuple[int, float, int, int], metered: bool) -> float:
    """Targets per second of the I/O row, with metrics hooks or without."""
    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from batch.metrics import Metrics  # noqa: PLC0415 - the row is skipped without it

    workers, latency, jobs, per_job = shape

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        time.sleep(latency)  # allow-sleep: the upstream's latency is the workload
        return None

    class Metered(Tally):
        """The tally, and the runner's metrics beside it."""

        def __init__(self) -> None:
            super().__init__()
            self.metrics = Metrics(CollectorRegistry())

        def depth(self, live: int) -> None:
            super().depth(live)
            self.metrics.depth(live)

        def inflight(self, n: int) -> None:
            super().inflight(n)
            self.metrics.inflight(n)

        def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
            super().target(err, seconds, nbytes)
            self.metrics.target(err, seconds, nbytes)

        def job(self, status: store.JobStatus) -> None:
            self.metrics.job(status)

        def job_seconds(self, seconds: float) -> None:
            self.metrics.job_seconds(seconds)

    tally = Metered() if metered else Tally()
    work = [refs(j, per_job) for j in range(jobs)]
    config = batch.Config(workers=workers, max_targets=per_job)
    with (
        engine.scratch() as location,
        store.open(location) as db,
        batch.Runner(db, fetch, config, hooks=tally) as runner,
    ):
        return drain_rate(runner, tally, work, many=True)


# -- the scenario -------------------------------------------------------------------------


def run(opts: Options) -> list[Row]:
    sizes = QUICK if opts.quick else FULL
    pg = engine.engine() == "postgres"
    latencies = alternate(
        opts.rounds,
        {
            "events": lambda: (event_latencies(sizes.events), []),
            "waits": lambda: wait_latencies(sizes.waits),
        },
    )
    rates = alternate(
        opts.rounds,
        {
            "watched": lambda: rate(sizes.targets, sizes.watchers),
            "niced": lambda: rate(sizes.targets, sizes.watchers, niced=True),
            "unwatched": lambda: rate(sizes.targets, 0),
        },
    )
    scrape, count = scrapes(sizes.jobs)
    io = IO_QUICK if opts.quick else IO
    try:
        import prometheus_client  # noqa: F401, PLC0415
    except ImportError:
        metered: Row = Skipped("12", "metrics hooks vs none", "prometheus-client is not installed")
    else:
        io_rates = alternate(
            opts.rounds,
            {"metered": lambda: io_rate(io, True), "bare": lambda: io_rate(io, False)},
        )
        metered = Figure(
            "12",
            f"metrics hooks vs none, {io[0]} workers x {io[1] * 1e3:g} ms",
            "/s",
            Series("runner, batch.metrics.Metrics hooks", io_rates["metered"]),
            Series("runner, no hooks but the tally", io_rates["bare"]),
            Goal("ratio", ">=", 0.95),
        )
    events = [x for sample, _ in latencies["events"] for x in sample]
    ours = [x for sample, _ in latencies["waits"] for x in sample]
    polled = [x for _, sample in latencies["waits"] for x in sample]
    return [
        Figure(
            "12",
            "event seen by another handle",
            "ms",
            Series("submit returned -> job.submitted seen elsewhere", events),
            goal=Goal("p99", "<", 50.0 if pg else 150.0),
            spread="p99",
        ),
        Figure(
            "12",
            "wait on a job held elsewhere",
            "ms",
            Series("end committed -> Runner.wait returns", ours),
            Series(f"end committed -> a look every {OLD_POLL:g} s sees it", polled),
            Goal("p99", "<", 50.0) if pg else None,
            spread="p99",
        ),
        Figure(
            "12",
            f"gauges, {sizes.jobs:,} jobs",
            "ms",
            Series("Store.gauges()", scrape),
            Series("SELECT status, count(*) FROM jobs GROUP BY status", count),
            Goal("median", "<", 10.0),
        ),
        *(
            Figure(
                "12",
                f"{sizes.watchers} watchers{how} vs none",
                "/s",
                Series(f"runner, {sizes.watchers} watches open{their}", rates[key]),
                Series("runner, no watch", rates["unwatched"]),
                goal,
            )
            for key, how, their, goal in (
                ("watched", "", "", Goal("ratio", ">=", 0.95)),
                ("niced", " at nice 19", ", their CPU last", None),
            )
        ),
        metered,
    ]


SCENARIO: Scenario = join(Scenario("12", "watching", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
