"""``batch-runner work`` processes for the tests: each a real process on
a store, with a fetch module of the test's in its working directory."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, TIMEOUT, eventually

#: The fetch the workers run: logs ``<pid> <ref>`` for each call, takes a
#: few milliseconds (on its context, so a drain's cancel cuts it short)
#: and returns who fetched what.
FETCH = textwrap.dedent(
    """
    import os

    LOG = os.environ["WORK_LOG"]

    def fetch(ctx, caller, target):
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {target.ref}\\n")
        ctx.wait(0.005)
        return {"ref": target.ref, "pid": os.getpid()}
    """
)

#: How long a worker's drain may take: a fetch in flight takes milliseconds.
GRACE = 5.0


class Worker:
    """One ``batch-runner work`` process, its stderr in a file."""

    def __init__(
        self, where: Path, location: str, name: str, *flags: str, program: str | None = None
    ) -> None:
        """``program``: a script in ``where`` that runs the command line in
        place of ``python -m batch``."""
        self.name = name
        self.err = where / f"{name}.err"
        with self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *(["-m", "batch"] if program is None else [program]),
                    "work",
                    "--db",
                    location,
                    "--fetch",
                    "workfetch:fetch",
                    "--workers",
                    "4",
                    "--takeover-after",
                    "1",
                    "--grace",
                    str(GRACE),
                    *flags,
                ],
                cwd=where,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PYTHONPATH": str(ROOT), "WORK_LOG": str(where / "fetches")},
            )
        self.exited_at: float | None = None
        self._waiter = threading.Thread(target=self._wait, daemon=True)
        self._waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def log(self) -> str:
        return self.err.read_text(encoding="utf-8", errors="replace")

    def said(self, pattern: str) -> re.Match[str] | None:
        """The first match of ``pattern`` in its log, once it is there."""
        found: list[re.Match[str]] = []

        def look() -> bool:
            match = re.search(pattern, self.log())
            if match is not None:
                found.append(match)
            return match is not None

        eventually(look)
        return found[0] if found else None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self._waiter.join(TIMEOUT)


@pytest.fixture(name="workplace")
def workplace_fixture(tmp_path: Path) -> Iterator[Path]:
    """A working directory with the workers' fetch module in it."""
    (tmp_path / "workfetch.py").write_text(FETCH, encoding="utf-8")
    yield tmp_path


@contextlib.contextmanager
def workers(where: Path, location: str, n: int, *flags: str) -> Iterator[list[Worker]]:
    started = [Worker(where, location, f"w{i}", *flags) for i in range(n)]
    try:
        for w in started:
            assert w.said(r"runner \w+ works on"), w.log()
        yield started
    finally:
        for w in started:
            w.stop()
