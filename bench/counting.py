"""A local HTTP server that counts what reaches it: how many requests are
in flight at once (the most of them), and when each arrived. Each GET is
answered ``ok`` after ``seconds``, as a page that takes that long to make.
The bench and the tests measure a concurrency limit against it, and serve
it (or any other server of theirs) on a thread with :func:`serving`."""

from __future__ import annotations

import contextlib
import socketserver
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

__all__ = ["Counting", "serving"]

#: Seconds to wait for the serving thread to end after its shutdown.
JOIN = 60.0


class Counting(ThreadingHTTPServer):
    """Answers every GET after ``seconds``; ``peak`` is the most requests in
    flight at once, ``arrivals`` when each came (monotonic seconds). Its
    lock guards both and ``inflight``."""

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


S = TypeVar("S", bound=socketserver.BaseServer)


@contextlib.contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve on a thread of its own for the block, then shut the server down
    and close it (joining its handler threads, if it keeps them)."""
    # A short poll: shutdown() waits for it, at every teardown.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,))
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(JOIN)
