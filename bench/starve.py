"""Scenario 9, a mixed stream of runs: what ``reserve_after`` costs in node
utilisation, and what it buys the runs that need many nodes.

Eight nodes, each ``linux`` plus a label of its own. A seeded random
stream of runs, about as much work as the nodes can do: small runs (one
step, ``linux``, 5 to 25 s) arrive one every 2 s on average, and every
200 s or so a big run (four steps, each needing the label of a different
node, 20 s each, so it must hold four nodes at once). The store's clock is
simulated: nodes claim a step as soon as one is theirs, and report it when
its time is up; the stream runs for two simulated hours (20 minutes with
``--quick``), a new seed each round.

Measured with ``reserve_after=600`` against ``None`` (the note's scan),
in the same rounds on the same streams:

- node utilisation: node-seconds spent running steps over node-seconds
  available;
- the longest wait of a big run (to its start, or to the end of the
  stream if it never started);
- the big runs started.

    python -m bench.starve [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from unittest import mock

import store
from bench.engine import scratch
from bench.measure import Figure, Options, Row, Scenario, Series, Unit, alternate
from bench.suite import join, main
from store.engines.postgres import PostgresDatabase
from store.engines.sqlite import SQLiteDatabase

__all__ = ["SCENARIO"]

NODES = 8
#: Seconds between runs, on average: small ones, big ones.
SMALL_EVERY, BIG_EVERY = 2.0, 200.0
SMALL_SECONDS = (5.0, 25.0)
BIG_STEPS, BIG_STEP_SECONDS = 4, 20.0
RESERVE_AFTER = 600.0
START = 1_700_000_000.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one stream gave under one setting."""

    #: Percent of the node-seconds spent running steps.
    utilisation: float
    longest_big_wait: float
    big_started: int


@dataclass(order=True)
class Arrival:
    at: float
    big: bool = field(compare=False)
    seconds: float = field(compare=False)
    labels: tuple[str, ...] = field(compare=False, default=())


def stream(seed: int, horizon: float) -> list[Arrival]:
    """The runs submitted over ``horizon`` seconds, in order."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    for every, big in ((SMALL_EVERY, False), (BIG_EVERY, True)):
        at = 0.0
        while (at := at + rng.expovariate(1 / every)) < horizon:
            if big:
                labels = tuple(rng.sample([f"l{i}" for i in range(NODES)], BIG_STEPS))
                out.append(Arrival(at, True, BIG_STEP_SECONDS, labels))
            else:
                out.append(Arrival(at, False, rng.uniform(*SMALL_SECONDS)))
    return sorted(out)


class Clock:
    """The simulated time every transaction reads."""

    now = START


@contextlib.contextmanager
def simulated(clock: Clock) -> Iterator[None]:
    """While the block runs, the stores read ``clock`` (on either engine)."""
    with (
        mock.patch.object(SQLiteDatabase, "clock", lambda self: clock.now),
        mock.patch.object(PostgresDatabase, "clock", lambda self, server: clock.now),
    ):
        yield


def play(arrivals: list[Arrival], horizon: float, reserve_after: float | None) -> Outcome:
    """Run the stream on a new store; how the nodes and big runs fared."""
    clock = Clock()
    seconds: dict[str, float] = {}
    big: dict[str, float] = {}  # big run id -> submitted at
    working: list[tuple[float, str, str, int]] = []  # (done at, node, run, seq)
    idle = {f"n{i}" for i in range(NODES)}
    work = 0.0
    end = START + horizon
    with (
        simulated(clock),
        scratch("starve.sqlite3") as path,
        # Leases outlive any wait here: a big run's last node waits for the others.
        store.open(path, lease_ttl=horizon, reserve_after=reserve_after) as db,
    ):
        for i in range(NODES):
            db.advertise(store.Advert(f"n{i}", f"box-{i}", frozenset({"linux", f"l{i}"})))
        pending = list(arrivals)
        pending.reverse()
        while clock.now < end:
            while working and working[0][0] <= clock.now:
                _, node_id, run_id, seq = heapq.heappop(working)
                db.report_step(node_id, run_id, seq)
                idle.add(node_id)
            while pending and START + pending[-1].at <= clock.now:
                a = pending.pop()
                steps = (
                    [store.Step(f"on-{x}", "exec", frozenset({x})) for x in a.labels]
                    if a.big
                    else [store.Step("work", "exec", frozenset({"linux"}))]
                )
                run_id = db.submit_run(steps).run_id
                seconds[run_id] = a.seconds
                if a.big:
                    big[run_id] = clock.now
            leased = {n.node_id for n in db.list_nodes() if n.run_id}
            for node_id in sorted(idle & leased):
                claim = db.claim_step(node_id)
                if claim is not None:
                    idle.discard(node_id)
                    took = seconds[claim.run_id]
                    work += min(took, end - clock.now)
                    heapq.heappush(working, (clock.now + took, node_id, claim.run_id, claim.seq))
            upcoming = [end]
            if working:
                upcoming.append(working[0][0])
            if pending:
                upcoming.append(START + pending[-1].at)
            clock.now = min(upcoming)
        starts = {run_id: db.get_run(run_id).started_at for run_id in big}
    waits = [(starts[r] or end) - at for r, at in big.items()]
    return Outcome(
        100 * work / (NODES * horizon),
        max(waits, default=0.0),
        sum(1 for s in starts.values() if s is not None),
    )


def run(opts: Options) -> list[Row]:
    """Each round a new stream, played with and without ``reserve_after``."""
    horizon = 1200.0 if opts.quick else 7200.0
    streams = [stream(seed, horizon) for seed in range(1, opts.rounds + 1)]

    def playing(reserve_after: float | None) -> Callable[[], Outcome]:
        """Plays the next round's stream: each setting plays every stream once."""
        rounds = iter(streams)
        return lambda: play(next(rounds), horizon, reserve_after)

    played = alternate(opts.rounds, {"reserve": playing(RESERVE_AFTER), "scan": playing(None)})

    def figure(what: str, unit: Unit, field: str) -> Figure:
        ours, scan = played["reserve"], played["scan"]
        return Figure(
            "9",
            what,
            unit,
            Series(f"reserve_after={RESERVE_AFTER:g}", [getattr(o, field) for o in ours]),
            Series("reserve_after=None", [getattr(o, field) for o in scan]),
        )

    return [
        figure("node utilisation, mixed stream", "%", "utilisation"),
        figure("  longest wait of a 4-node run", "s", "longest_big_wait"),
        figure("  4-node runs started", "n", "big_started"),
    ]


SCENARIO: Scenario = join(Scenario("9", "a mixed stream of runs", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
