"""A proxy in front of the PostgreSQL server that delays every byte a set
time each way: the server a network round trip away, on one machine.

It listens on a unix socket of its own (``.s.PGSQL.<port>`` in a temporary
directory, as the server does) and forwards each connection to the
server's socket. Each direction of each connection is two threads: one
reads and stamps what it read with when it is due, the other sleeps until
then and writes it, so bytes keep their order and a burst is delayed once,
not once per chunk. ``time.sleep`` keeps the delay to tens of
microseconds; an event loop's timer would round it up to a millisecond.

    with delayed(url, 0.0005) as far:   # far: the same database, 1 ms further
        ...
"""

from __future__ import annotations

import contextlib
import queue
import socket
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DELAY", "delayed"]

#: Seconds added each way by default: a round trip of about a millisecond
#: more, as between two hosts of one data centre.
DELAY = 0.0005

_CHUNK = 1 << 16


def _socket_of(url: str) -> tuple[str, str]:
    """The server socket file a ``postgresql://`` URL over a unix socket
    reaches, and the port in its name."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    host, port = query["host"][0], query.get("port", ["5432"])[0]
    return str(Path(host) / f".s.PGSQL.{port}"), port


def _with_host(url: str, host: str) -> str:
    """``url`` with its ``host`` parameter replaced."""
    head, _, query = url.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    params["host"] = host
    return f"{head}?{urllib.parse.urlencode(params)}"


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy what ``src`` sends to ``dst``, each piece ``delay`` seconds
    after it came; then close ``dst``'s sending side."""
    due: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

    def write() -> None:
        with contextlib.suppress(OSError):
            while (item := due.get()) is not None:
                at, data = item
                if (wait := at - time.monotonic()) > 0:
                    time.sleep(wait)  # allow-sleep: the delay this proxy is for
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with contextlib.suppress(OSError):
        while data := src.recv(_CHUNK):
            due.put((time.monotonic() + delay, data))
    due.put(None)
    writer.join()


def _serve(listener: socket.socket, server: str, delay: float) -> None:
    """Accept connections until ``listener`` is closed; each is forwarded
    to ``server`` both ways, delayed."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(server)
        except OSError:
            client.close()
            upstream.close()
            continue
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(src, dst, delay), daemon=True).start()


@contextlib.contextmanager
def delayed(url: str, delay: float = DELAY) -> Iterator[str]:
    """The URL of the database ``url`` names (over a unix socket) reached
    through a proxy that delays each byte ``delay`` seconds each way."""
    server, port = _socket_of(url)
    with tempfile.TemporaryDirectory(prefix="bench-delay-") as root:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(Path(root) / f".s.PGSQL.{port}"))
        listener.listen(256)
        thread = threading.Thread(target=_serve, args=(listener, server, delay), daemon=True)
        thread.start()
        try:
            yield _with_host(url, root)
        finally:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            thread.join()
