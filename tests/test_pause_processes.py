"""A pause by host, from the command line, reaches a runner in another
process within a fifth of a second (SPEC §2f): on SQLite, whose runners
look at the store every tenth of a second, and on PostgreSQL alike."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import batch.cli
import store
from tests.helpers import ROOT, TIMEOUT, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

#: How soon a pause or an unpause reaches every runner of the store.
REACHES = 0.2

#: A runner on the store at argv[1], fetching two jobs of URLs of one host
#: without a network: each fetch logs when it started to argv[2] and takes
#: a millisecond. It says ``ready`` once the jobs are submitted, and closes
#: at the end of its standard input.
CHILD = textwrap.dedent(
    """
    import sys, time, batch, batch.web, store

    location, log = sys.argv[1], sys.argv[2]
    starts = open(log, "a", buffering=1, encoding="utf-8")

    def fetch(ctx, caller, target):
        starts.write(f"{time.time():.6f}\\n")
        ctx.wait(0.001)
        return None

    config = batch.Config(workers=2, upstream=batch.web.host_of)
    with store.open(location) as db, batch.Runner(db, fetch, config) as runner:
        for k in range(2):
            urls = [f"http://127.0.0.1:8765/{k}/{n}" for n in range(20_000)]
            runner.submit(batch.Caller("alice"), urls)
        print("ready", flush=True)
        sys.stdin.read()
        runner.close(timeout=10)
    """
)

UPSTREAM = "http://127.0.0.1:8765"


def starts(log: Path) -> list[float]:
    """When each fetch of the child started, in order."""
    return [float(line) for line in log.read_text().split()]


def quiet_since(log: Path, seconds: float) -> bool:
    """Whether no fetch started in the last ``seconds``."""
    return time.time() - starts(log)[-1] > seconds


def cli(*args: str) -> int:
    return batch.cli.main(list(args))


def test_a_pause_by_host_reaches_a_runner_of_another_process_at_once(
    location: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``batch-runner pause --upstream 127.0.0.1`` holds the targets of
    ``http://127.0.0.1:8765`` on a runner of another process within
    ``REACHES`` seconds; ``unpause`` lets them go as soon; a name that
    matches no upstream the store knows is refused with status 2 and
    pauses nothing."""
    log = tmp_path / "starts"
    log.touch()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, location, str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        with store.open(location, readonly=True) as db:
            assert eventually(lambda: UPSTREAM in {v.name for v in db.upstreams()})
        assert eventually(lambda: len(starts(log)) > 10)

        capsys.readouterr()
        assert cli("pause", "--upstream", "nowhere.example", "--db", location) == 2
        refused = capsys.readouterr().err
        assert "no upstream 'nowhere.example'" in refused and UPSTREAM in refused
        with store.open(location, readonly=True) as db:
            assert db.paused().upstreams == {}

        assert cli("pause", "--upstream", "127.0.0.1", "--db", location) == 0
        paused_at = time.time()
        assert eventually(lambda: quiet_since(log, 0.5)), "the fetches never stopped"
        late = [t - paused_at for t in starts(log) if t > paused_at]
        assert max(late, default=0.0) <= REACHES, f"fetches started {late} s after the pause"

        assert cli("unpause", "--upstream", "127.0.0.1", "--db", location) == 0
        unpaused_at = time.time()
        assert eventually(lambda: starts(log)[-1] > unpaused_at, TIMEOUT)
        first = min(t for t in starts(log) if t > unpaused_at) - unpaused_at
        assert first <= REACHES, f"the first fetch started {first:.3f} s after the unpause"
    finally:
        child.communicate(timeout=TIMEOUT)  # its standard input ends: it closes
    assert child.returncode == 0
