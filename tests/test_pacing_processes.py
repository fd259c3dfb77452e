"""An upstream's limits hold across runner processes on one store (SPEC §2d):
real processes fetching from one local server that counts what arrives."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helpers import TIMEOUT, serving

#: One runner process: fetch ``jobs`` jobs of ``per_job`` pages of the
#: server at argv[2], on the store at argv[1], paced by argv[3]'s limit.
CHILD = """
import sys, batch, batch.web, store
where, base, kind, value, jobs, per_job = sys.argv[1:7]
limit = batch.Limit(**{kind: float(value) if kind == "rate" else int(value)})
config = batch.Config(workers=8, upstream=batch.web.host_of, limits={"*": limit}, retry_wait=0.01)
me = batch.Caller(f"p{sys.argv[7]}")
with store.open(where) as db, batch.Runner(db, batch.web.fetch_url, config) as r:
    ids = [r.submit(me, [f"{base}/{sys.argv[7]}/{j}/{i}" for i in range(int(per_job))])
           for j in range(int(jobs))]
    for job_id in ids:
        job = r.wait(me, job_id, timeout=120)
        assert job.status == "done", job
"""


class Counting(ThreadingHTTPServer):
    """Answers every GET after ``seconds``, counting what is in flight at
    once and when each request arrived."""

    daemon_threads = True

    def __init__(self, seconds: float) -> None:
        self.lock = threading.Lock()
        self.inflight = self.peak = 0
        self.arrivals: list[float] = []
        self.seconds = seconds
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Counting

    def do_GET(self) -> None:
        s = self.server
        with s.lock:
            s.arrivals.append(time.monotonic())
            s.inflight += 1
            s.peak = max(s.peak, s.inflight)
        threading.Event().wait(s.seconds)  # the page takes this long to make
        with s.lock:
            s.inflight -= 1  # before the answer leaves: its client cannot be quicker
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def run_children(location: str, base: str, kind: str, value: str, n: int) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, location, base, kind, value, "2", "15", str(k)],
        )
        for k in range(n)
    ]
    for child in children:
        assert child.wait(TIMEOUT) == 0


@pytest.mark.timeout(2 * TIMEOUT)
def test_concurrency_holds_across_three_processes(location: str) -> None:
    with serving(Counting(seconds=0.05)) as server:
        run_children(location, server.base, "concurrency", "2", 3)
    assert len(server.arrivals) == 3 * 2 * 15
    assert server.peak == 2


@pytest.mark.timeout(2 * TIMEOUT)
def test_a_rate_holds_across_two_processes(location: str) -> None:
    rate = 20.0
    with serving(Counting(seconds=0.0)) as server:
        run_children(location, server.base, "rate", str(rate), 2)
    arrivals = sorted(server.arrivals)
    assert len(arrivals) == 2 * 2 * 15
    # In any second, at most the rate and the burst of each process (their
    # shares move as they come and go: the documented error).
    for i, first in enumerate(arrivals):
        within = sum(1 for t in arrivals[i:] if t - first < 1.0)
        assert within <= rate + 2, (i, within)
