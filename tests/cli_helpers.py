"""What the command-line tests share: a real HTTP server on 127.0.0.1, and
``python -m batch`` run as a real process."""

import os
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import store
from bench.counting import serving

REPO = Path(__file__).resolve().parent.parent
WAIT = 30.0
#: The Crawl-delay the test server's robots.txt asks of "localhost".
CRAWL_DELAY = 0.2
#: The columns of the table ``demo`` and ``fetch`` end with.
SUMMARY = ["job", "name", "caller", "status", "done", "failed", "pending", "seconds", "retries"]


class Upstream(ThreadingHTTPServer):
    """A server answering by path: ``/busy/...`` 429 (``Retry-After: 0``) the
    first time, then 200; ``/missing`` 404; ``/broken`` 500; ``/hold`` sets
    ``arrived``, then answers 200 once ``release`` is set; any other path 200,
    with the path as the body."""

    daemon_threads = False  # server_close() joins every handler thread

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.arrived = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._asked: Counter[str] = Counter()
        self.arrivals: list[float] = []  # time.monotonic() of each request

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.server_port}{path}"

    def asked(self, path: str) -> int:
        """How many requests came for ``path``."""
        with self._lock:
            return self._asked[path]

    def note(self, path: str) -> int:
        with self._lock:
            self.arrivals.append(time.monotonic())
            self._asked[path] += 1
            return self._asked[path]


class _Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        times = self.server.note(path)
        headers = {}
        if path == "/robots.txt" and self.headers.get("Host", "").startswith("localhost"):
            body = f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path.startswith("/busy/") and times == 1:
            status, headers = 429, {"Retry-After": "0"}
        elif path in ("/missing", "/broken"):
            status = 404 if path == "/missing" else 500
        else:
            status = 200
        if path == "/hold":
            self.server.arrived.set()
            self.server.release.wait(WAIT)
        body = path.encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(name="upstream")
def upstream_fixture() -> Iterator[Upstream]:
    with serving(Upstream()) as server:
        try:
            yield server
        finally:
            server.release.set()


def environment() -> dict[str, str]:
    """This environment, without a default store or a proxy in the way."""
    env = {k: v for k, v in os.environ.items() if k != "BATCH_DB" and "proxy" not in k.lower()}
    return {**env, "PYTHONPATH": str(REPO), "NO_PROXY": "*"}


def command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "batch", *map(str, args)]


def cli(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batch ARGS`` to its end."""
    return subprocess.run(
        command(*args),
        cwd=REPO,
        env=environment(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def url_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def stored(path: Path) -> list[store.JobRow]:
    """Every job in the store at ``path``, with its targets, oldest first."""
    with store.open(path, readonly=True) as db:
        return [job for s in db.list_jobs() if (job := db.find_job(s.id)) is not None]


def outcome(target: store.TargetRow) -> tuple[str, str, str | None, str | None]:
    return target.ref, target.status, target.error, target.hint
