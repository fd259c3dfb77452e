"""Scenario 3, latency: how soon the runner acts, one job at a time.

(a) submit -> fetch start on an idle runner, against a ``queue.Queue``
    handing an item to an idle thread: the least any thread-pool scheduler
    can do. Both count from just before the call that hands the work over.
(b) retry wake-up overshoot: a fetch raises ``RetryLater`` once; the next
    try's start minus (the first try's end + ``retry_wait``). Against a plain
    timed ``Event.wait(retry_wait)`` overshooting, which is what the worker
    waits on. Measured with the other workers idle, then with three jobs
    keeping the other three workers busy with CPU-bound Python (the
    interpreter switches threads every 5 ms), the baseline under that same
    load. Runner and baseline take turns sample by sample.
(c) cancel -> ``cancelled``: a job with a target in flight is cancelled, then
    its status read until it says ``cancelled``. Cancel is synchronous, so
    the first read should say so; this is the cost of cancel and one read.

    python -m bench.latency [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import batch
from bench.measure import Figure, Goal, Options, Row, Scenario, Series, alternate
from bench.suite import join, main
from bench.workload import CALLER, PATIENCE, WORKERS, Tally, open_runner, scratch

__all__ = ["SCENARIO"]

#: The retry_wait of (b): short, so that many samples fit in a few seconds.
RETRY_WAIT = 0.02

#: How long a load target keeps its worker busy with Python, in seconds.
LOAD_SLICE = 0.01

#: Targets per load job: enough to outlast the measurement (checked).
LOAD_TARGETS = 1_000

#: Status reads after which a cancelled job that does not say so is a failure.
MAX_READS = 10_000


@dataclass(frozen=True, slots=True)
class Sizes:
    """Samples per round of each measure."""

    handoffs: int
    retries: int
    cancels: int


FULL = Sizes(handoffs=150, retries=50, cancels=100)
QUICK = Sizes(handoffs=20, retries=10, cancels=20)


def ms(seconds: float) -> float:
    """Seconds in milliseconds, the unit of every latency here."""
    return seconds * 1e3


class Stamp:
    """When something happened in another thread, and a way to wait for it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.at = 0.0

    def hit(self) -> None:
        """It happens now."""
        self.at = time.perf_counter()
        self._event.set()

    def wait(self) -> float:
        """Block until it has happened; when it did. Ready for the next time."""
        if not self._event.wait(PATIENCE):
            raise TimeoutError("the stamped event never happened")
        self._event.clear()
        return self.at


# -- (a) submit -> fetch start --------------------------------------------------------


def handoffs(samples: int) -> tuple[list[float], list[float]]:
    """Milliseconds from handing work over to its start: the runner's (submit
    to fetch) and a queue's (put to get), taking turns."""
    started = Stamp()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        started.hit()

    ours: list[float] = []
    base: list[float] = []
    with scratch() as path, open_runner(path, fetch) as (runner, _), idle_consumer(started) as q:
        for i in range(samples):
            start = time.perf_counter()
            job_id = runner.submit(CALLER, [f"t{i}"])
            ours.append(ms(started.wait() - start))
            runner.wait(CALLER, job_id, timeout=PATIENCE)
            start = time.perf_counter()
            q.put(i)
            base.append(ms(started.wait() - start))
    return ours, base


@contextlib.contextmanager
def idle_consumer(started: Stamp) -> Iterator[queue.Queue[int | None]]:
    """A thread taking items off a queue and stamping each; stopped afterwards."""
    q: queue.Queue[int | None] = queue.Queue()

    def consume() -> None:
        while q.get() is not None:
            started.hit()

    thread = threading.Thread(target=consume, name="bench-consumer")
    thread.start()
    try:
        yield q
    finally:
        q.put(None)
        thread.join()


# -- (b) retry overshoot --------------------------------------------------------------


class FlakyOnce:
    """The fetch of (b): each probe target is busy on its first try and done
    on its second, recording when the first ended and the second began. A
    ``load`` target keeps its worker busy with Python for ``LOAD_SLICE``."""

    def __init__(self) -> None:
        self.ended: dict[str, float] = {}
        self.began = Stamp()

    def __call__(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        if target.ref.startswith("load"):
            spin(LOAD_SLICE)
        elif target.ref not in self.ended:
            self.ended[target.ref] = time.perf_counter()
            raise batch.RetryLater("busy once")
        else:
            self.began.hit()


def spin(seconds: float) -> None:
    """Run Python, holding the interpreter as a CPU-bound fetch does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def overshoots(samples: int, loaded: bool) -> tuple[list[float], list[float]]:
    """Milliseconds past ``RETRY_WAIT`` at which the runner tried a busy
    target again, and at which a timed ``Event.wait`` returned, taking turns;
    ``loaded``: with the other workers busy running Python meanwhile."""
    fetch = FlakyOnce()
    ours: list[float] = []
    base: list[float] = []
    with (
        scratch() as path,
        open_runner(path, fetch, retry_wait=RETRY_WAIT, max_targets=LOAD_TARGETS) as (
            runner,
            tally,
        ),
    ):
        load = start_load(runner, tally) if loaded else []
        for i in range(samples):
            ref = f"probe{i}"
            job_id = runner.submit(CALLER, [ref])
            ours.append(ms(fetch.began.wait() - fetch.ended[ref] - RETRY_WAIT))
            runner.wait(CALLER, job_id, timeout=PATIENCE)
            start = time.perf_counter()
            threading.Event().wait(RETRY_WAIT)
            base.append(ms(time.perf_counter() - start - RETRY_WAIT))
        stop_load(runner, load)
    return ours, base


def start_load(runner: batch.Runner[batch.Caller], tally: Tally) -> list[str]:
    """Submit a load job per worker but one, and wait until each has a target
    in flight; their ids."""
    load = [
        runner.submit(CALLER, [f"load{j}-{i}" for i in range(LOAD_TARGETS)])
        for j in range(WORKERS - 1)
    ]
    tally.wait_inflight(WORKERS - 1)
    return load


def stop_load(runner: batch.Runner[batch.Caller], load: list[str]) -> None:
    """Cancel the load jobs, after checking they kept their workers busy all along."""
    for job_id in load:
        if runner.status(CALLER, job_id).status != "running":
            raise RuntimeError("a load job ended before the measurement: raise LOAD_TARGETS")
        runner.cancel(CALLER, job_id)


# -- (c) cancel -----------------------------------------------------------------------


def cancels(samples: int) -> tuple[list[float], list[float]]:
    """Milliseconds from calling cancel on a job with a target in flight until
    its status reads ``cancelled``, and how many reads that took."""
    held = Stamp()
    release = threading.Event()

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> None:
        held.hit()
        release.wait(PATIENCE)

    times: list[float] = []
    reads: list[float] = []
    with scratch() as path, open_runner(path, fetch) as (runner, tally):
        for i in range(samples):
            release.clear()
            job_id = runner.submit(CALLER, [f"c{i}-0", f"c{i}-1"])
            held.wait()
            start = time.perf_counter()
            if not runner.cancel(CALLER, job_id):
                raise RuntimeError("a live job could not be cancelled")
            reads.append(reads_until_cancelled(runner, job_id))
            times.append(ms(time.perf_counter() - start))
            release.set()
            tally.wait_ended()
    return times, reads


def reads_until_cancelled(runner: batch.Runner[batch.Caller], job_id: str) -> int:
    """Read the job's status until it says ``cancelled``; how many reads."""
    for n in range(1, MAX_READS + 1):
        if runner.status(CALLER, job_id).status == "cancelled":
            return n
    raise RuntimeError(f"job still not cancelled after {MAX_READS} reads")


# -- the scenario -----------------------------------------------------------------------


def run(opts: Options) -> list[Row]:
    """The latencies (a), (b) idle and loaded, (c), each pooled over the rounds."""
    sizes = QUICK if opts.quick else FULL
    results = alternate(
        opts.rounds,
        {
            "handoff": lambda: handoffs(sizes.handoffs),
            "idle": lambda: overshoots(sizes.retries, loaded=False),
            "loaded": lambda: overshoots(sizes.retries, loaded=True),
            "cancel": lambda: cancels(sizes.cancels),
        },
    )

    def pooled(key: str, which: int) -> list[float]:
        return [x for sample in results[key] for x in sample[which]]

    def latency(what: str, key: str, ours: str, base: str | None, goal: Goal) -> Figure:
        baseline = None if base is None else Series(base, pooled(key, 1))
        return Figure("3", what, "ms", Series(ours, pooled(key, 0)), baseline, goal, "p99")

    busy = f"{WORKERS - 1} workers running Python"
    return [
        latency(
            "submit -> fetch start, idle",
            "handoff",
            "Runner.submit -> fetch",
            "queue.Queue put -> get, idle thread",
            Goal("median", "<", 1.0),
        ),
        latency(
            "retry overshoot, idle",
            "idle",
            "busy target tried again",
            "Event.wait(retry_wait) returns",
            Goal("median", "<", 1.0),
        ),
        latency(
            f"retry overshoot, {WORKERS - 1} workers busy",
            "loaded",
            f"busy target tried again, {busy}",
            f"Event.wait(retry_wait) returns, {busy}",
            Goal("median", "<=", 5.0),
        ),
        latency(
            "cancel -> status cancelled",
            "cancel",
            "Runner.cancel, then Runner.status until cancelled",
            None,
            Goal("median", "<", 1.0),
        ),
        Figure(
            "3",
            "  status reads until cancelled",
            "n",
            Series("Runner.status calls until cancelled", pooled("cancel", 1)),
            goal=Goal("max", "<=", 1),
        ),
    ]


SCENARIO: Scenario = join(Scenario("3", "latency", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
