"""Scenario 11, pacing against a rate-limited host: a real nginx with
``limit_req`` at 20 requests a second per client (burst 2), answering 429
with ``Retry-After: 1`` (started by the bench; Debian's ``nginx-light``,
installed if absent). 8 jobs of 4 callers, 400 URLs on that one host, 16
workers, ``batch.web.fetch_url``, a new store each time.

Rows, each from nginx's own log:

- ``limits={"*": Limit(rate=20)}``: the share of requests answered 429
  (goal <= 1 %), and the pages a second against the 20 allowed (>= 0.95);
- ``Limit(adaptive=True)``, no rate given: after the first 5 s, the share
  answered 429 (<= 5 %) and the pages a second (>= 0.85 of 20); and, in the
  same rounds, the runner without pacing (``Config(upstream=None)``: each
  busy answer holds back only its own target): its share of 429s;
- ``batch-runner fetch FILE`` of those URLs, no flag given: the share of
  requests answered 429 over the whole crawl (<= 2 %), and the pages a
  second after the first 5 s (>= 0.8 of 20): the command learns a host's
  pace by itself;
- two runner processes on one store, ``rate=20`` each: together <= 1 %
  429s and >= 0.9 of the 20 allowed;
- three runner processes on one store, ``concurrency=2`` each, against a
  local server that counts what it has in flight (``bench.counting``; each
  page takes 50 ms): never more than 2 at once, and the pages a second
  against the 40 that 2 at a time allow.

With ``--engine postgres`` the store is a PostgreSQL database and only the
rows of several processes are measured (the others do not depend on the
engine).

    python -m bench.pacing [--rounds N] [--quick] [--json PATH] [--engine postgres]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import batch
import batch.web
import store
from bench import counting, nginx
from bench.engine import engine, scratch
from bench.measure import REPO, Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main

__all__ = ["SCENARIO"]

#: What nginx allows each client.
RATE = 20
BURST = 2
#: The crawl: jobs, callers, URLs, workers.
JOBS, CALLERS, URLS, WORKERS = 8, 4, 400, 16
QUICK_URLS = 120
#: Seconds at the start left out of the adaptive row: it learns meanwhile.
LEARNING = 5.0
#: The row of three processes: pages, and the seconds each takes to make.
CROWD_URLS, QUICK_CROWD_URLS, PAGE_SECONDS = 240, 60, 0.05

#: One runner process of the rows of several: argv = store, base URL, first
#: URL, URLs, and the upstream's limit (JSON of ``batch.Limit``'s arguments).
CHILD = """
import json, sys, batch, batch.web, store
where, base, first, count, limit = sys.argv[1:6]
config = batch.Config(workers=8, upstream=batch.web.host_of,
                      limits={"*": batch.Limit(**json.loads(limit))},
                      retry_wait=1.0, retry_for=600)
urls = [f"{base}/{n}.txt" for n in range(int(first), int(first) + int(count))]
me = batch.Caller(f"c{first}")
with store.open(where) as db, batch.Runner(db, batch.web.fetch_url, config) as r:
    ids = [r.submit(me, urls[k::4]) for k in range(4)]
    for job_id in ids:
        assert r.wait(me, job_id, timeout=600).status == "done"
"""


@dataclass(frozen=True)
class Crawl:
    """What nginx answered one crawl: the share of 429s (%) and the pages a
    second, both from ``since`` seconds after its first request."""

    busy: float
    rate: float


def _answered(server: nginx.Nginx, start: float, since: float = 0.0) -> Crawl:
    lines = [
        (float(at), int(status))
        for at, status, _ in (line.split() for line in server.log.read_text().splitlines())
        if float(at) >= start
    ]
    first = min(at for at, _ in lines)
    kept = [(at, status) for at, status in lines if at - first >= since]
    ok = [at for at, status in kept if status == 200]
    busy = sum(1 for _, status in kept if status == 429)
    span = max(ok) - min(ok)
    return Crawl(100.0 * busy / len(kept), len(ok) / span if span > 0 else 0.0)


def _crawl(server: nginx.Nginx, urls: int, config: batch.Config, since: float = 0.0) -> Crawl:
    """Fetch ``urls`` pages of ``server`` in one runner with ``config``."""
    start = time.time()
    pages = [f"{server.base}/{n}.txt" for n in range(urls)]
    callers = [batch.Caller(f"caller-{k % CALLERS}") for k in range(JOBS)]
    with (
        tempfile.TemporaryDirectory() as d,
        store.open(Path(d) / "jobs.sqlite3") as db,
        batch.Runner(db, batch.web.fetch_url, config) as runner,
    ):
        ids = [runner.submit(callers[k], pages[k::JOBS]) for k in range(JOBS)]
        for caller, job_id in zip(callers, ids, strict=True):
            assert runner.wait(caller, job_id, timeout=900).status == "done"
    return _answered(server, start, since)


@dataclass(frozen=True)
class Crowd:
    """What the counting server saw of one crawl: the most requests in
    flight at once, and the pages a second."""

    peak: int
    rate: float


def _processes(base: str, urls: int, n: int, limit: str) -> None:
    """Fetch ``urls`` pages of ``base`` in ``n`` runner processes on one new
    store (of the engine measured), each with the upstream limit ``limit``."""
    with scratch() as where:
        store.open(where).close()
        each = urls // n
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, where, base, str(k * each), str(each), limit],
                cwd=REPO,
            )
            for k in range(n)
        ]
        for proc in procs:
            if proc.wait(900):
                raise RuntimeError("a runner process of the pacing rows failed")


def _command(server: nginx.Nginx, urls: int) -> Crawl:
    """``batch-runner fetch`` of ``urls`` pages of ``server``, as a user
    runs it (no flag): its 429s over the whole crawl, its pages a second
    once it learned (after ``LEARNING`` seconds)."""
    with tempfile.TemporaryDirectory() as d:
        listed = Path(d) / "urls.txt"
        listed.write_text("".join(f"{server.base}/{n}.txt\n" for n in range(urls)))
        start = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "batch", "fetch", str(listed), "--db", str(Path(d) / "b.db")],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            check=False,
        )
    if done.returncode:
        raise RuntimeError(f"batch-runner fetch exited {done.returncode}")
    return Crawl(_answered(server, start).busy, _answered(server, start, LEARNING).rate)


def _two_processes(server: nginx.Nginx, urls: int) -> Crawl:
    start = time.time()
    _processes(server.base, urls, 2, f'{{"rate": {RATE}}}')
    return _answered(server, start)


def _three_at_two(urls: int) -> Crowd:
    with counting.serving(counting.Counting(PAGE_SECONDS)) as server:
        _processes(server.base, urls, 3, '{"concurrency": 2}')
    span = max(server.arrivals) - min(server.arrivals)
    return Crowd(server.peak, len(server.arrivals) / span)


def _config(**limit: object) -> batch.Config:
    return batch.Config(
        workers=WORKERS,
        upstream=batch.web.host_of if limit else None,
        limits={"*": batch.Limit(**limit)} if limit else None,  # type: ignore[arg-type]
        retry_wait=1.0,
        retry_for=600.0,
    )


def run(opts: Options) -> list[Row]:
    """Measure the rows (see the module)."""
    binary = nginx.find()
    if binary is None:
        return [Skipped("11", "pacing against nginx", "nginx can be neither found nor installed")]
    urls = QUICK_URLS if opts.quick else URLS
    crowd_urls = QUICK_CROWD_URLS if opts.quick else CROWD_URLS
    one_process = engine() == "sqlite"
    with nginx.running(binary, rate=RATE, burst=BURST) as server:
        for n in range(urls):
            (server.files / f"{n}.txt").write_text(f"page {n}\n" * 50)
        tries: dict[str, Callable[[], Crawl]] = {"two": lambda: _two_processes(server, urls)}
        if one_process:
            tries |= {
                "rate": lambda: _crawl(server, urls, _config(rate=float(RATE))),
                "adaptive": lambda: _crawl(server, urls, _config(adaptive=True), LEARNING),
                "unpaced": lambda: _crawl(server, urls, _config(), LEARNING),
                "command": lambda: _command(server, urls),
            }
        crawls = alternate(opts.rounds, tries)
    crowds = [_three_at_two(crowd_urls) for _ in range(opts.rounds)]
    allowed = [float(RATE)] * opts.rounds

    def busy(key: str) -> Series:
        return Series(f"{key}: requests answered 429", [c.busy for c in crawls[key]])

    def pages(key: str, what: str) -> Series:
        return Series(what, [c.rate for c in crawls[key]])

    limit = Series("nginx limit_req rate", allowed)
    several: list[Row] = [
        Figure("11", "2 processes: answered 429", "%", busy("two"), goal=Goal("median", "<=", 1.0)),
        Figure(
            "11",
            "2 processes: pages/s of 20",
            "/s",
            pages("two", "2 runner processes, rate=20"),
            limit,
            Goal("ratio", ">=", 0.9),
        ),
        Figure(
            "11",
            "concurrency=2, 3 processes: most in flight",
            "n",
            Series("the server's count", [float(c.peak) for c in crowds]),
            goal=Goal("max", "<=", 2.0),
        ),
        Figure(
            "11",
            "concurrency=2, 3 processes: pages/s",
            "/s",
            Series("3 runner processes, concurrency=2", [c.rate for c in crowds]),
            Series("2 at a time, 50 ms each", [2 / PAGE_SECONDS] * opts.rounds),
        ),
    ]
    if not one_process:
        return several
    return [
        Figure("11", "rate=20: answered 429", "%", busy("rate"), goal=Goal("median", "<=", 1.0)),
        Figure(
            "11",
            "rate=20: pages/s of 20 allowed",
            "/s",
            pages("rate", "Limit(rate=20), 16 workers"),
            limit,
            Goal("ratio", ">=", 0.95),
        ),
        Figure(
            "11",
            "adaptive after 5 s: answered 429",
            "%",
            busy("adaptive"),
            busy("unpaced"),
            Goal("median", "<=", 5.0),
        ),
        Figure(
            "11",
            "adaptive after 5 s: pages/s",
            "/s",
            pages("adaptive", "Limit(adaptive=True), no rate"),
            limit,
            Goal("ratio", ">=", 0.85),
        ),
        Figure(
            "11",
            "batch-runner fetch: answered 429",
            "%",
            busy("command"),
            goal=Goal("median", "<=", 2.0),
        ),
        Figure(
            "11",
            "batch-runner fetch after 5 s: pages/s",
            "/s",
            pages("command", "batch-runner fetch FILE, no flag"),
            limit,
            Goal("ratio", ">=", 0.8),
        ),
        *several,
    ]


SCENARIO = join(Scenario("11", "pacing against a rate-limited host", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
