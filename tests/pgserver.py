"""A throwaway PostgreSQL server for the tests: its data and its unix
socket in a temporary directory, no TCP port, gone at the end of the run.

Debian keeps ``initdb``, ``pg_ctl`` and ``postgres`` in a versioned
directory under ``/usr/lib/postgresql/``, off PATH; as root, the server
must run as another user, so it runs as ``postgres`` (``runuser``). When no
server is installed, :func:`find_bin` installs Debian's package, once.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["Server", "find_bin", "running", "terminate"]

USER = "postgres"
#: How many copies of a template are made, and how many dropped, at once
#: (see :meth:`Server.copy_of`).
IN_A_ROW = 20


def find_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest version),
    installing PostgreSQL from Debian's packages if it is absent; None if it
    cannot be had."""
    found = _newest()
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env, timeout=900
            )
        found = _newest()
    return found


def _newest() -> Path | None:
    dirs = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin") if Path(d, "initdb").exists()]
    for name in ("initdb", "pg_ctl"):
        on_path = shutil.which(name)
        if on_path and not dirs:
            dirs.append(Path(on_path).parent)
    if not dirs:
        return None
    return max(dirs, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)


class Server:
    """One running server; :attr:`url` is its maintenance database."""

    def __init__(self, bindir: Path, root: Path) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.socket = root / "socket"
        self.as_root = os.geteuid() == 0
        self.user = USER if self.as_root else os.environ.get("USER", "postgres")
        self._names = itertools.count()
        self._lock = threading.Lock()
        # Under _lock: the copies made and not handed out yet, by template;
        # the copies whose block has ended, not dropped yet.
        self._copies: dict[str, list[str]] = {}
        self._ended: list[str] = []

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URI for ``dbname`` on this server, over its unix socket."""
        return f"postgresql:///{dbname}?host={self.socket}&user={self.user}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_root:
            cmd = ["runuser", "-u", USER, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        self.socket.mkdir(parents=True)
        if self.as_root:
            shutil.chown(self.root, USER)
            shutil.chown(self.socket, USER)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "-A", "trust", "--no-sync")
        # No fsync: this server's data is thrown away at the end, and only
        # its processes are ever killed (never the machine), so what is
        # committed survives a restart all the same: each commit still
        # writes its WAL (synchronous_commit stays on).
        options = (
            f"-c listen_addresses='' -c unix_socket_directories={self.socket}"
            " -c fsync=off -c full_page_writes=off"
            " -c max_connections=300 -c shared_buffers=64MB"
        )
        self._options = options
        self.resume()

    def resume(self) -> None:
        """Start the server again after :meth:`stop`, as it was started."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", self._options, "-l", str(self.root / "log"),
            "-w", "start",
        )  # fmt: skip

    @contextlib.contextmanager
    def database(self, name: str) -> Iterator[str]:
        """A new, empty database on this server for as long as the block
        runs; its URL."""
        self._execute([f"CREATE DATABASE {name}"])
        try:
            yield self.url(name)
        finally:
            self._execute([f"DROP DATABASE {name} WITH (FORCE)"])

    @contextlib.contextmanager
    def copy_of(self, template: str) -> Iterator[str]:
        """A new copy of the database ``template`` for as long as the block
        runs; its URL.

        Copies are made :data:`IN_A_ROW` at a time, and dropped as many at a
        time: a CREATE DATABASE costs about ten times more after writes
        anywhere on the server than in a row of them (400 ms against 35 here).
        """
        with self._lock:
            made = self._copies.setdefault(template, [])
            if not made:
                names = [f"{template}_{next(self._names)}" for _ in range(IN_A_ROW)]
                self._execute(
                    f"CREATE DATABASE {name} TEMPLATE {template} STRATEGY FILE_COPY"
                    for name in names
                )
                made += names
            name = made.pop()
        try:
            yield self.url(name)
        finally:
            self._drop_later(name)

    def _drop_later(self, name: str) -> None:
        with self._lock:
            self._ended.append(name)
            if len(self._ended) < IN_A_ROW:
                return
            doomed, self._ended = self._ended, []
        self._execute(f"DROP DATABASE {name} WITH (FORCE)" for name in doomed)

    def _execute(self, statements: Iterable[str]) -> None:
        import psycopg  # noqa: PLC0415 (only the PostgreSQL half of the tests needs it)

        with psycopg.connect(self.url(), autocommit=True) as admin:
            for sql in statements:
                admin.execute(sql)

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server (closing every connection) and start it again:
        ``mode`` is pg_ctl's shutdown mode: ``"immediate"`` (at once, as a
        crash: the start replays the WAL), ``"fast"`` (each session ended,
        a checkpoint, then down) or ``"smart"``. The server keeps the
        options it was started with."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-m", mode, "-w",
            "restart",
        )  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def terminate(self, dbname: str) -> int:
        """End every session connected to ``dbname`` (``pg_terminate_backend``,
        as an operator or a failing network would), from a session on the
        maintenance database; how many were ended."""
        import psycopg  # noqa: PLC0415 (only the PostgreSQL half of the tests needs it)

        with psycopg.connect(self.url(), autocommit=True) as admin:
            return terminate(admin, dbname)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "log").read_text()
        return ""


def terminate(admin: Any, dbname: str) -> int:
    """``Server.terminate`` on an open autocommit connection ``admin`` (to
    another database than ``dbname``): for a caller that ends the sessions
    many times a second, one connection for all."""
    row = admin.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_backend_pid()",
        (dbname,),
    ).fetchone()
    return int(row[0]) if row is not None else 0


@contextlib.contextmanager
def running(bindir: Path) -> Iterator[Server]:
    """A server for as long as the block runs."""
    root = Path(tempfile.mkdtemp(prefix="batch-store-pg-"))
    server = Server(bindir, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
