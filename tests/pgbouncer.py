"""A throwaway PgBouncer for the tests, in front of the tests' PostgreSQL
server: a transaction pooler, as PostgreSQL is deployed past a few hosts.

Debian's ``pgbouncer``, installed if absent (as root), run as the server's
user (PgBouncer refuses to run as root), listening on a unix socket in a
temporary directory, every database of the server behind it, trusted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from tests import pgserver
from tests.helpers import eventually

__all__ = ["Bouncer", "find", "fronts", "running"]

#: The port in the name of its socket (``.s.PGSQL.<port>``); no TCP.
PORT = 6432

CONFIG = """\
[databases]
* = host={server_socket} user={user}

[pgbouncer]
listen_addr =
listen_port = {port}
unix_socket_dir = {root}
auth_type = trust
auth_file = {root}/users.txt
pool_mode = {mode}
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
ignore_startup_parameters = extra_float_digits
"""


def fronts(location: str) -> bool:
    """Whether a store's ``location`` is reached through the tests' pooler."""
    return location.startswith("postgresql://") and f"port={PORT}" in location


def find() -> str | None:
    """The pgbouncer binary, installing Debian's package if it is absent;
    None if it cannot be had."""
    found = _installed()
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            install = ["apt-get", "install", "-y", "-qq", "pgbouncer"]
            if subprocess.run(install, check=False, env=env, timeout=600).returncode:
                subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
                subprocess.run(install, check=True, env=env, timeout=600)
        found = _installed()
    return found


def _installed() -> str | None:
    """Debian keeps it in /usr/sbin, off a user's PATH."""
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer",) if os.path.exists(p)), None
    )


class Bouncer:
    """One running PgBouncer in front of ``server``."""

    def __init__(self, binary: str, server: pgserver.Server, root: Path, mode: str) -> None:
        self.binary = binary
        self.server = server
        self.root = root
        self.mode = mode
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, direct: str) -> str:
        """The URL of the database ``direct`` names (a URL of the server's),
        through this pooler."""
        parts = urllib.parse.urlsplit(direct)
        query = {
            **urllib.parse.parse_qs(parts.query),
            "host": [str(self.root)],
            "port": [str(PORT)],
        }
        return f"postgresql://{parts.path}?{urllib.parse.urlencode(query, doseq=True, safe='/')}"

    def start(self) -> None:
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            CONFIG.format(
                server_socket=self.server.socket,
                user=self.server.user,
                port=PORT,
                root=self.root,
                mode=self.mode,
            )
        )
        (self.root / "users.txt").write_text(f'"{self.server.user}" ""\n')
        cmd = [self.binary, str(ini)]
        if os.geteuid() == 0:
            shutil.chown(self.root, pgserver.USER)
            for path in self.root.iterdir():
                shutil.chown(path, pgserver.USER)
            cmd = ["runuser", "-u", pgserver.USER, "--", *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sock = self.root / f".s.PGSQL.{PORT}"
        proc = self.proc
        # Nothing to wait on but the socket: PgBouncer tells no one it is up.
        # Its file is there once bound, before PgBouncer listens (a client
        # then is refused): up once a connection is taken.
        up = eventually(lambda: _accepts(sock) or proc.poll() is not None, timeout=30)
        if not up or not _accepts(sock):
            raise RuntimeError(f"pgbouncer did not start:\n{self.log()[-2000:]}")

    def _signal(self, signum: int) -> None:
        """Signal PgBouncer itself (its pid file names it: ``runuser`` may
        stand between), and wait until it and what started it have ended."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((self.root / "pgbouncer.pid").read_text()), signum)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        for left in (f".s.PGSQL.{PORT}", "pgbouncer.pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.root / left).unlink()

    def stop(self) -> None:
        self._signal(signal.SIGINT)  # at once: every client cut

    def restart(self) -> None:
        """Kill the pooler (every client connection cut) and start it again."""
        self._signal(signal.SIGKILL)
        self.start()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "pgbouncer.log").read_text()
        return ""


def _accepts(sock: Path) -> bool:
    """Whether something listens on the unix socket ``sock``."""
    with socket.socket(socket.AF_UNIX) as client:
        try:
            client.connect(str(sock))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def running(binary: str, server: pgserver.Server, mode: str = "transaction") -> Iterator[Bouncer]:
    """A pooler in front of ``server`` for as long as the block runs."""
    root = Path(tempfile.mkdtemp(prefix="batch-store-pgbouncer-"))
    bouncer = Bouncer(binary, server, root, mode)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)
