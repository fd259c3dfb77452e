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
        far.trips  # round trips made through it so far, on every connection

A round trip, as counted: a client's message that follows an answer on
its connection (or opens it). Messages sent one after another without
waiting, as a pipeline or a multi-statement query goes, are one.
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

__all__ = ["DELAY", "Far", "delayed"]

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


class Far(str):
    """The URL through the proxy, and the round trips made through it."""

    trips: int = 0


class _Turns:
    """Whose turn it is on one connection: a client's message after the
    server's answer is a round trip more (``Far.trips``)."""

    def __init__(self, far: Far) -> None:
        self.far = far
        self.answered = True

    def sent(self, by_client: bool) -> None:
        if by_client and self.answered:
            self.far.trips += 1  # only the connection's pumps write it: a race costs a count
        self.answered = not by_client


def _pump(
    src: socket.socket, dst: socket.socket, delay: float, turns: _Turns, by_client: bool
) -> None:
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
            turns.sent(by_client)
            due.put((time.monotonic() + delay, data))
    due.put(None)
    writer.join()


def _serve(listener: socket.socket, server: str, delay: float, far: Far) -> None:
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
        turns = _Turns(far)
        for src, dst, by_client in ((client, upstream, True), (upstream, client, False)):
            threading.Thread(
                target=_pump, args=(src, dst, delay, turns, by_client), daemon=True
            ).start()


@contextlib.contextmanager
def delayed(url: str, delay: float = DELAY) -> Iterator[Far]:
    """The URL of the database ``url`` names (over a unix socket) reached
    through a proxy that delays each byte ``delay`` seconds each way."""
    server, port = _socket_of(url)
    with tempfile.TemporaryDirectory(prefix="bench-delay-") as root:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(Path(root) / f".s.PGSQL.{port}"))
        listener.listen(256)
        far = Far(_with_host(url, root))
        thread = threading.Thread(target=_serve, args=(listener, server, delay, far), daemon=True)
        thread.start()
        try:
            yield far
        finally:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            thread.join()
