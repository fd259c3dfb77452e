"""A real nginx for the bench and the tests: rate-limited with
``limit_req``, answering 429 with ``Retry-After``, serving files from a
directory of its own, its access log read back to count what it answered.

Installed from Debian's packages (``nginx-light``) if absent, as the tests
install PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Nginx", "find", "running"]

#: nginx's configuration: ``{rate}`` requests a second per client address,
#: ``{burst}`` more at once before it answers 429 with ``Retry-After: 1``.
CONFIG = """
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format status '$msec $status $request_uri';
    access_log {root}/access.log status;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    limit_req_zone $binary_remote_addr zone=per_client:1m rate={rate}r/s;
    limit_req_status 429;
    server {{
        listen 127.0.0.1:{port};
        root {root}/files;
        location / {{
            limit_req zone=per_client burst={burst} nodelay;
            error_page 429 = @busy;
        }}
        location @busy {{
            add_header Retry-After 1 always;
            return 429;
        }}
    }}
}}
"""


def find() -> str | None:
    """The nginx binary, installing Debian's ``nginx-light`` if it is absent;
    None if it cannot be had."""
    found = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
    if not found and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            install = ["apt-get", "install", "-y", "-qq", "nginx-light"]
            if subprocess.run(install, env=env, timeout=900, check=False).returncode:
                subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
                subprocess.run(install, check=True, env=env, timeout=900)
        found = shutil.which("nginx") or (os.path.exists("/usr/sbin/nginx") and "/usr/sbin/nginx")
    return found or None


@dataclass
class Nginx:
    """A running nginx: its base URL, the directory it serves, its log."""

    base: str
    files: Path
    log: Path

    def answers(self) -> Counter[int]:
        """How many requests it answered with each status so far."""
        return Counter(int(line.split()[1]) for line in self._lines())

    def times(self, status: int = 200) -> list[float]:
        """When it answered each request with ``status`` (epoch seconds)."""
        return [float(line.split()[0]) for line in self._lines() if int(line.split()[1]) == status]

    def _lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@contextlib.contextmanager
def running(binary: str, rate: int = 20, burst: int = 2) -> Iterator[Nginx]:
    """An nginx limiting each client to ``rate`` requests a second (with
    ``burst``), for the block; stopped after it."""
    root = Path(tempfile.mkdtemp(prefix="batch-nginx-"))
    root.chmod(0o755)  # nginx's workers run as another user, and read the files
    (root / "files").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (root / "nginx.conf").write_text(CONFIG.format(root=root, port=port, rate=rate, burst=burst))
    proc = subprocess.Popen(
        [binary, "-c", str(root / "nginx.conf"), "-p", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"nginx did not start: {err}")
            time.sleep(0.05)  # nothing to wait on but the port: nginx tells no one
        yield Nginx(f"http://127.0.0.1:{port}", root / "files", root / "access.log")
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(root, ignore_errors=True)
