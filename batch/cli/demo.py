"""The demo's world: a local document server, and the jobs two callers send it.

:class:`Site` is what the server answers: every document after a latency of
its own (50-250 ms, the same on every run), a few "busy" (429 or 503 with
``Retry-After``) the first time or two they are asked for, a few missing
(404). It also keeps what it saw, to show afterwards that the runner kept its
promises: at most one request per job at a time, every busy document asked
again no sooner than its ``Retry-After``. :data:`JOBS` are five jobs of two
callers; the ``archive`` job is cancelled part-way, from another thread, the
moment the server sees the request for :data:`CANCEL_AT`.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..model import Config
from .progress import JobCaller, LiveRun

__all__ = ["CANCEL_AT", "CANCEL_JOB", "CONFIG", "JOBS", "Site", "cancelling", "serving"]

#: Three workers for five jobs: the jobs take turns.
CONFIG = Config(workers=3, retry_wait=0.2, retry_for=10.0)


@dataclass(frozen=True, slots=True)
class Busy:
    """A document that answers ``status`` with ``Retry-After: after`` its
    first ``times`` requests."""

    status: int
    times: int
    after: int


#: (caller, job name, paths).
JOBS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("alice", "reports", tuple(f"/reports/2024-{m:02}.csv" for m in range(1, 13))),
    ("bob", "photos", tuple(f"/photos/img-{i:03}.jpg" for i in range(1, 11))),
    ("alice", "papers", tuple(f"/papers/paper-{i}.pdf" for i in range(1, 9))),
    ("bob", "mirror", tuple(f"/mirror/pkg-{i}.tar.gz" for i in range(1, 11))),
    ("alice", "archive", tuple(f"/archive/box-{i:02}.zip" for i in range(1, 17))),
)
BUSY = {
    "/reports/2024-05.csv": Busy(429, times=1, after=1),
    "/photos/img-004.jpg": Busy(503, times=2, after=1),
    "/mirror/pkg-3.tar.gz": Busy(429, times=1, after=2),
}
MISSING = frozenset({"/photos/img-009.jpg", "/papers/paper-6.pdf", "/papers/paper-7.pdf"})
#: The job cancelled part-way, and the request that gets it cancelled.
CANCEL_JOB = "archive"
CANCEL_AT = "/archive/box-06.zip"


def latency(path: str) -> float:
    """Seconds the server takes to answer ``path``: 0.05 to 0.25, fixed per path."""
    return 0.05 + hashlib.sha256(path.encode()).digest()[0] / 255 * 0.2


def body(path: str) -> bytes:
    """The document at ``path``: a few hundred to a few thousand bytes of text."""
    lines = 5 + hashlib.sha256(path.encode()).digest()[1]
    return "".join(f"{path} line {n}\n" for n in range(lines)).encode()


class Site:
    """What the server answers, and what it saw. Thread-safe.

    ``tripped`` is set once :data:`CANCEL_AT` is asked for.
    """

    def __init__(self) -> None:
        self.tripped = threading.Event()
        # _lock guards everything below: the server answers on many threads.
        self._lock = threading.Lock()
        self._asked: Counter[str] = Counter()  # requests per path
        self._open: Counter[str] = Counter()  # requests being answered, per job
        self._open_total = 0
        self._most_per_job = 0
        self._most_total = 0
        self._busy_at: dict[str, tuple[float, int]] = {}  # path -> (answered busy at, after)
        self._waits: list[tuple[float, int]] = []  # (seconds until asked again, after)

    def arrive(self, path: str) -> tuple[int, dict[str, str]]:
        """A request for ``path`` came: note it, and decide the answer's status and headers."""
        now = time.monotonic()
        job = path.split("/")[1]
        with self._lock:
            self._asked[path] += 1
            self._open[job] += 1
            self._open_total += 1
            self._most_per_job = max(self._most_per_job, self._open[job])
            self._most_total = max(self._most_total, self._open_total)
            if path in self._busy_at:
                answered, after = self._busy_at.pop(path)
                self._waits.append((now - answered, after))
            busy = BUSY.get(path)
            if busy is not None and self._asked[path] <= busy.times:
                return busy.status, {"Retry-After": str(busy.after)}
        if path == CANCEL_AT:
            self.tripped.set()
        return (404 if path in MISSING else 200), {}

    def leave(self, path: str, status: int) -> None:
        """The answer to ``path`` is about to be sent: the request no longer
        counts as open, and the wait a busy answer asks for starts. (Before
        sending, so that the job's next request cannot come first.)"""
        now = time.monotonic()
        with self._lock:
            self._open[path.split("/")[1]] -= 1
            self._open_total -= 1
            busy = BUSY.get(path)
            if busy is not None and status == busy.status:
                self._busy_at[path] = (now, busy.after)

    def report(self) -> str:
        """What the server saw, in a sentence."""
        with self._lock:
            requests = sum(self._asked.values())
            most_total, most_per_job = self._most_total, self._most_per_job
            waits = list(self._waits)
        text = (
            f"server: {requests} requests, at most {most_total} at once,"
            f" at most {most_per_job} per job at a time"
        )
        if waits:
            honoured = all(waited >= after for waited, after in waits)
            shortest = min(waits, key=lambda w: w[0] - w[1])
            text += (
                f"; {len(waits)} busy answers, each asked again"
                f" {'no sooner than' if honoured else 'SOONER than'} its Retry-After"
                f" (the soonest: {shortest[0]:.2f}s after a Retry-After of {shortest[1]}s)"
            )
        return text


class _Server(ThreadingHTTPServer):
    site: Site


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        site = self.server.site
        status, headers = site.arrive(path)
        try:
            time.sleep(latency(path))  # the upstream at work
            payload = body(path) if status == 200 else f"{status}\n".encode()
        finally:
            site.leave(path, status)
        self.send_response(status)
        for name, value in {**headers, "Content-Type": "text/plain"}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the demo shows its own progress."""


@contextlib.contextmanager
def serving(site: Site) -> Iterator[str]:
    """Serve ``site`` on 127.0.0.1 (a free port) in a thread; yield its base URL."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.site = site
    thread = threading.Thread(target=server.serve_forever, name="demo-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def cancelling(site: Site, run: LiveRun, job: JobCaller) -> Iterator[None]:
    """Cancel ``job``, from a thread of its own, as soon as ``site`` is tripped."""
    over = threading.Event()

    def watch() -> None:
        site.tripped.wait()
        if not over.is_set():
            run.runner.cancel(job, job.job)

    thread = threading.Thread(target=watch, name="demo-cancel", daemon=True)
    thread.start()
    try:
        yield
    finally:
        over.set()
        site.tripped.set()  # let the thread go, if the demo ended untripped
        thread.join()
