"""Scenario 5, the run queue at size: whether waking the queue costs what
was freed rather than what waits, and how fast runs go in.

Two store files alike but for the queue's length: 100,000 finished runs,
1,000 nodes each busy with a one-step run, then 10,000 QUEUED runs, or 1,000
(the baseline: if a cost grew with the queue, the ratio would show it).
Measured, on a fresh copy of each file per round:

(a) ``wake_queued`` with nothing free;
(b) ``wake_queued`` after one node frees (it promotes one run);
(c) ``wake_queued`` after 100 nodes free (it promotes 100), also per run
    promoted against (b): a wake costs in proportion to what it promotes;
(d) ``submit_run`` into the queue (every node busy), runs per second: at
    least 2,000, and the same with either queue;
(e) ``submit_run`` placed at once on idle nodes, runs per second;
(f) (a) and (b) on a copy of the long queue's file without the index on
    QUEUED runs: what the index buys;
(g) ``submit_run`` placed at once on idle nodes beside a backlog of 10,000
    runs that wait for another node, all of them reserving
    (``reserve_after=0``), against the same with ``reserve_after=None``:
    a backlog that waited long costs a submit little once read; and the
    first submit, which reads it (as the first after a run left the queue
    does).

Nodes are freed behind the store's back (raw SQL ends their runs), so that
the only wake is the one measured.

    python -m bench.runs [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import store
from bench.engine import Raw, copy_of, scratch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, Unit, alternate
from bench.suite import join, main
from bench.workload import advertise, open_store, placed_rate, submit

__all__ = ["SCENARIO"]


@dataclass(frozen=True, slots=True)
class Sizes:
    """The files' contents, and the calls timed per round."""

    history: int
    nodes: int
    queued: int
    short: int
    wakes: int
    freed: int
    many_wakes: int
    submits: int


FULL = Sizes(
    history=100_000,
    nodes=1_000,
    queued=10_000,
    short=1_000,
    wakes=20,
    freed=100,
    many_wakes=3,
    submits=300,
)
QUICK = Sizes(
    history=1_000, nodes=100, queued=1_000, short=100, wakes=5, freed=10, many_wakes=2, submits=50
)


def build(path: str, queued: int, sizes: Sizes) -> None:
    """A file with the history, every node busy with a run, ``queued`` runs
    waiting behind.

    Built through the public API, and quickly: the runs are submitted while
    a single node is advertised (a submit costs in proportion to the nodes),
    then the other nodes are advertised, each one's wake promoting the oldest
    queued run onto it. The finished runs, older than all, are written with
    raw SQL first: only their rows in ``runs`` matter to the queue.
    """
    open_store(path).close()
    with contextlib.closing(Raw(path)) as conn:
        conn.begin()
        conn.executemany(
            "INSERT INTO runs (id, state, created_at, started_at, ended_at)"
            " VALUES (?, 'SUCCEEDED', ?, ?, ?)",
            ((f"old-{i:07d}", 1.0 + i, 1.0 + i, 2.0 + i) for i in range(sizes.history)),
        )
        conn.commit()
    with open_store(path) as db:
        advertise(db, 0, 1)
        submit(db, 1, "RUNNING")
        submit(db, queued + sizes.nodes - 1, "QUEUED")
        advertise(db, 1, sizes.nodes)
        if len(db.unavailable_nodes()) != sizes.nodes:
            raise RuntimeError("a node advertised took no queued run: the file is not as built")


def free(path: str, n: int) -> None:
    """End ``n`` running runs behind the store's back (no wake follows):
    their leases gone, their step and the run SUCCEEDED."""
    with contextlib.closing(Raw(path)) as conn:
        conn.begin()
        for (run_id,) in conn.execute("SELECT run_id FROM leases LIMIT ?", (n,)).fetchall():
            conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))
            conn.execute("UPDATE steps SET state = 'SUCCEEDED' WHERE run_id = ?", (run_id,))
            conn.execute(
                "UPDATE runs SET state = 'SUCCEEDED', ended_at = 0 WHERE id = ?", (run_id,)
            )
        conn.commit()


def wake_after(path: str, db: store.Store, freed: int) -> float:
    """Milliseconds of one wake after ``freed`` nodes free; it must promote as many."""
    free(path, freed)
    start = time.perf_counter()
    promoted = db.wake_queued("bench")
    elapsed = time.perf_counter() - start
    if len(promoted) != freed:
        raise RuntimeError(f"{freed} nodes freed, {len(promoted)} runs promoted")
    return elapsed * 1e3


def median_of(calls: int, measure: Callable[[], float]) -> float:
    """The median of ``calls`` results of ``measure``."""
    return statistics.median(measure() for _ in range(calls))


def wakes(path: str, db: store.Store, sizes: Sizes) -> dict[str, float]:
    """(a) and (b): milliseconds of a wake with nothing free, and of one after
    a node frees, on the store ``db`` opened at ``path``."""
    return {
        "idle": median_of(sizes.wakes, lambda: wake_after(path, db, 0)),
        "one": median_of(sizes.wakes, lambda: wake_after(path, db, 1)),
    }


def queue_costs(base: str, sizes: Sizes) -> dict[str, float]:
    """(a) to (c) in milliseconds, and (d) in runs per second, on a fresh copy
    of ``base``."""
    with copy_of(base) as path, open_store(path) as db:
        costs = wakes(path, db, sizes)
        costs["many"] = median_of(sizes.many_wakes, lambda: wake_after(path, db, sizes.freed))
        start = time.perf_counter()
        submit(db, sizes.submits, "QUEUED")
        costs["submit"] = sizes.submits / (time.perf_counter() - start)
        return costs


def unindexed_costs(base: str, sizes: Sizes) -> dict[str, float]:
    """(f): (a) and (b) on a fresh copy of ``base`` without the index on
    QUEUED runs."""
    with copy_of(base) as path:
        with contextlib.closing(Raw(path)) as conn:
            conn.execute("DROP INDEX runs_queued")
        with open_store(path) as db:
            return wakes(path, db, sizes)


def build_backlog(path: str, sizes: Sizes) -> None:
    """A file with ``sizes.submits`` idle nodes and, behind a run holding the
    one GPU node, ``sizes.queued`` runs waiting for it."""
    with store.open(path, max_leases_per_run=1, reserve_after=None) as db:
        advertise(db, 0, sizes.submits)
        db.advertise(store.Advert("gpu", "box-gpu", {"gpu"}))
        train = [store.Step("train", "exec", {"gpu"})]
        for i in range(sizes.queued + 1):
            view = db.submit_run(train)
            if view.state != ("RUNNING" if i == 0 else "QUEUED"):
                raise RuntimeError("the GPU node took two runs: the file is not as built")


def backlog_rate(base: str, sizes: Sizes, reserve_after: float | None) -> dict[str, float]:
    """(g): the first ``submit_run`` in milliseconds, then the others in runs
    per second, each placed at once on an idle node beside the backlog of
    ``base``."""
    with (
        copy_of(base) as path,
        store.open(path, max_leases_per_run=1, reserve_after=reserve_after) as db,
    ):
        start = time.perf_counter()
        submit(db, 1, "RUNNING")
        first = time.perf_counter() - start
        start = time.perf_counter()
        submit(db, sizes.submits - 1, "RUNNING")
        return {
            "first": first * 1e3,
            "placed": (sizes.submits - 1) / (time.perf_counter() - start),
        }


def run(opts: Options) -> list[Row]:
    """The wakes and submits on the long queue against the short one, and (f)."""
    sizes = QUICK if opts.quick else FULL
    with (
        scratch("short.sqlite3") as short,
        scratch("long.sqlite3") as long,
        scratch("backlog.sqlite3") as backlog,
    ):
        build(short, sizes.short, sizes)
        build(long, sizes.queued, sizes)
        build_backlog(backlog, sizes)
        costs = alternate(
            opts.rounds,
            {
                "long": lambda: queue_costs(long, sizes),
                "short": lambda: queue_costs(short, sizes),
                "no index": lambda: unindexed_costs(long, sizes),
                "placed": lambda: placed_rate(sizes.submits),
                "reserving": lambda: backlog_rate(backlog, sizes, 0.0),
                "not reserving": lambda: backlog_rate(backlog, sizes, None),
            },
        )

    def series(key: str, cost: str, name: str) -> Series:
        return Series(name, [c[cost] for c in costs[key]])

    long_q, short_q = f"{sizes.queued:,} queued", f"{sizes.short:,} queued"
    versus = f"{sizes.queued:,} vs {sizes.short:,}"

    def by_length(what: str, cost: str, unit: Unit, goal: Goal | None) -> Figure:
        return Figure(
            "5", what, unit, series("long", cost, long_q), series("short", cost, short_q), goal
        )

    def by_index(what: str, cost: str) -> Figure:
        return Figure(
            "5",
            what,
            "ms",
            series("long", cost, f"{long_q}, with the index"),
            series("no index", cost, f"{long_q}, without the index"),
        )

    per_run = [c["many"] / sizes.freed for c in costs["long"]]
    return [
        by_length(f"wake, none free, {versus}", "idle", "ms", Goal("median", "<", 5.0)),
        by_length(f"wake, 1 freed, {versus}", "one", "ms", Goal("ratio", "<=", 1.5)),
        by_length(f"wake, {sizes.freed} freed, {versus}", "many", "ms", Goal("ratio", "<=", 1.5)),
        Figure(
            "5",
            "  per run promoted vs 1 freed",
            "ms",
            Series(f"wake after {sizes.freed} freed, per run, {long_q}", per_run),
            series("long", "one", f"wake after 1 freed, {long_q}"),
            Goal("ratio", "<=", 1.0),
        ),
        by_length(f"submit_run queued {versus}", "submit", "/s", Goal("median", ">=", 2000.0)),
        Figure(
            "5",
            f"submit_run placed, {sizes.submits} idle nodes",
            "/s",
            series("placed", "placed", "submit_run, placed at once"),
        ),
        by_index("wake, none free vs no QUEUED index", "idle"),
        by_index("wake, 1 freed vs no QUEUED index", "one"),
        Figure(
            "5",
            f"submit_run placed, {sizes.queued:,} reserving",
            "/s",
            series("reserving", "placed", f"beside {sizes.queued:,} runs, reserve_after=0"),
            series("not reserving", "placed", "the same, reserve_after=None"),
            Goal("ratio", ">=", 0.8),
        ),
        Figure(
            "5",
            "  the first, which reads them",
            "ms",
            series("reserving", "first", f"beside {sizes.queued:,} runs, reserve_after=0"),
            series("not reserving", "first", "the same, reserve_after=None"),
        ),
    ]


SCENARIO: Scenario = join(Scenario("5", "the run queue", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
