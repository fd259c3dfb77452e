"""Scenario 8, the command line: ``python -m batch fetch`` of 20,000 URLs
against a local web server, set against what the runner alone does with
the same list, grouping and workers; and the same command into a store file
that holds a long history, against an empty one.

The server runs in a process of its own, answering on 16 loopback
addresses (127.0.0.1 to 127.0.0.16, one port) with a small body, so that
the list has 16 hosts as a crawl would. Both sides fetch with
``batch.web.Fetcher`` through no proxy, one job per host (``--per-host``),
16 workers.

- the command: ``python -m batch fetch urls.txt --per-host --workers 16``,
  its output to a file (not a terminal: progress lines once a second),
  timed from its start to its exit: the interpreter's start and the
  summary included;
- the runner alone: a ``Runner`` in this process, the same jobs submitted
  at once, until the last target is stored;
- the history: the same command into a copy of a file holding one done job
  of 100,000 targets of the same caller.

    python -m bench.command [--rounds N] [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import batch
import batch.web
from bench.measure import REPO, Figure, Goal, Options, Row, Scenario, Series, Skipped, alternate
from bench.suite import join, main
from bench.workload import PATIENCE, Tally, raw_sqlite, result_json

__all__ = ["SCENARIO"]

#: Loopback addresses the server answers on: the list's hosts.
HOSTS = 16
#: Workers on both sides.
WORKERS = 16
#: Whose jobs: the command's --caller and the runner's.
CALLER = batch.Caller("bench")

#: The server: answers every GET with a small body, on each address given.
SERVER = """
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

port = int(sys.argv[1])
servers = []
for address in sys.argv[2:]:
    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    servers.append(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@dataclass(frozen=True, slots=True)
class Sizes:
    """URLs fetched per measure, and targets in the history."""

    urls: int
    history: int


FULL = Sizes(urls=20_000, history=100_000)
QUICK = Sizes(urls=2_000, history=10_000)


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """The server, answering on :data:`HOSTS` addresses; yields the URL
    pattern (``http://127.0.0.{host}:{port}/``) of its hosts."""
    port = _free_port()
    addresses = [f"127.0.0.{k}" for k in range(1, HOSTS + 1)]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), *addresses],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the bench's web server did not start")
        yield f"http://127.0.0.{{host}}:{port}/"
    finally:
        proc.kill()
        proc.wait(PATIENCE)


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def url_list(pattern: str, n: int) -> list[str]:
    """``n`` distinct URLs, dealt round the hosts."""
    return [pattern.format(host=1 + i % HOSTS) + f"page/{i}" for i in range(n)]


def by_host(urls: list[str]) -> list[list[str]]:
    """The URLs grouped by host, hosts in first-seen order: the command's
    ``--per-host`` grouping."""
    hosts: dict[str, list[str]] = {}
    for url in urls:
        hosts.setdefault(url.split("/")[2].split(":")[0], []).append(url)
    return list(hosts.values())


def no_proxy_env() -> dict[str, str]:
    """This environment without proxy settings: the server is local."""
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


def command_rate(urls_file: Path, db: Path, n: int) -> float:
    """URLs per second of ``python -m batch fetch``, start to exit."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "batch",
                "fetch",
                str(urls_file),
                "--per-host",
                "--workers",
                str(WORKERS),
                "--db",
                str(db),
                "--caller",
                CALLER.id,
            ],
            cwd=REPO,
            env=no_proxy_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=PATIENCE * 5,
        )
        return n / (time.perf_counter() - start)


def runner_rate(urls: list[str], db: Path) -> float:
    """URLs per second of a runner in this process, the same jobs."""
    import store  # noqa: PLC0415

    tally = Tally()
    fetch = batch.web.Fetcher(timeout=30.0, proxies={})
    config = batch.Config(workers=WORKERS, max_targets=len(urls))
    with store.open(db) as s, batch.Runner(s, fetch, config, hooks=tally) as runner:
        start = time.perf_counter()
        runner.submit_many(CALLER, by_host(urls))
        tally.wait_stored(len(urls), PATIENCE * 5)
        return len(urls) / (time.perf_counter() - start)


def build_history(path: Path, targets: int) -> None:
    """A store file holding one done job of ``targets`` targets of the
    caller's, written with raw SQL in the store's schema."""
    import store  # noqa: PLC0415

    store.open(path).close()
    conn = raw_sqlite(path)
    try:
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO jobs (id, owner, status, created_at, updated_at, touched_at, nbytes,"
            " ntargets, ndone) VALUES ('old', ?, 'done', 1, 1, 1, ?, ?, ?)",
            (CALLER.id, targets * len(result_json("old")), targets, targets),
        )
        conn.executemany(
            "INSERT INTO targets (job_id, pos, ref, status, result)"
            " VALUES ('old', ?, ?, 'done', ?)",
            ((i, f"http://old.example/{i}", result_json("old")) for i in range(targets)),
        )
        conn.execute("UPDATE job_bytes SET total = ?", (targets * len(result_json("old")),))
        conn.execute("COMMIT")
    finally:
        conn.close()


def run(opts: Options) -> list[Row]:
    """The command against the runner alone, and into a long history
    against an empty file."""
    if sys.platform != "linux":
        return [Skipped("8", "python -m batch fetch", "needs 127.0.0.0/8 on loopback (Linux)")]
    sizes = QUICK if opts.quick else FULL
    with tempfile.TemporaryDirectory(prefix="bench-") as d, serving() as pattern:
        root = Path(d)
        urls = url_list(pattern, sizes.urls)
        urls_file = root / "urls.txt"
        urls_file.write_text("\n".join(urls) + "\n")
        history = root / "history.sqlite3"
        build_history(history, sizes.history)
        names = iter(range(1_000_000))

        def fresh() -> Path:
            return root / f"run{next(names)}.sqlite3"

        def into_history() -> float:
            path = fresh()
            shutil.copy(history, path)
            return command_rate(urls_file, path, len(urls))

        rates = alternate(
            opts.rounds,
            {
                "command": lambda: command_rate(urls_file, fresh(), len(urls)),
                "runner": lambda: runner_rate(urls, fresh()),
                "history": into_history,
            },
        )
    command = Series(f"python -m batch fetch, {len(urls):,} URLs, new file", rates["command"])
    return [
        Figure(
            "8",
            f"fetch {len(urls):,} URLs vs runner alone",
            "/s",
            command,
            Series(f"batch.Runner, the same {HOSTS} jobs", rates["runner"]),
            Goal("ratio", ">=", 0.67),  # within 1.5x the time,
        ),
        Figure(
            "8",
            f"  into {sizes.history:,} old targets vs new",
            "/s",
            Series(f"the same, into a file of {sizes.history:,} targets", rates["history"]),
            command,
            Goal("ratio", ">=", 0.91),  # within 1.1x the time,
        ),
    ]


SCENARIO: Scenario = join(Scenario("8", "the command line", run))

if __name__ == "__main__":
    raise SystemExit(main(suite=[SCENARIO]))
