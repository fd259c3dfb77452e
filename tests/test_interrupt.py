"""A script interrupted twice (Ctrl-C, then Ctrl-C again while the runner
closes and waits for a fetch that does not stop): the runner lets its jobs
go at once, so that no job stays leased to a process that is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import store
from tests.helpers import ROOT, TIMEOUT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

#: A script on the store at argv[1]: a job whose fetch never returns (it
#: ignores its context); once it started, the script says the job's id and
#: waits. The test's Ctrl-C then closes the runner, which waits for that
#: fetch; a second Ctrl-C comes as soon as the close began.
SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading, batch, store

    # Ctrl-C as on a terminal, even where this process was started with
    # SIGINT ignored (a background job's).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started, never = threading.Event(), threading.Event()

    def fetch(ctx, caller, target):
        started.set()
        never.wait(60)

    def interrupt_again(runner):
        while not runner.statistics().closed:
            never.wait(0.005)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    with store.open(sys.argv[1]) as db, batch.Runner(db, fetch) as runner:
        job = runner.submit(batch.Caller("alice"), ["a", "b"])
        started.wait(10)
        threading.Thread(target=interrupt_again, args=(runner,), daemon=True).start()
        print(job, flush=True)
        while True:  # until Ctrl-C, whichever thread the signal reaches
            never.wait(0.05)
    """
)


def test_a_second_ctrl_c_while_closing_lets_the_jobs_go(location: str, tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, location],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    try:
        assert child.stdout is not None
        job = child.stdout.readline().strip()
        assert job, child.communicate(timeout=TIMEOUT)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=TIMEOUT)
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err
    assert "its jobs are released" in err, err
    with store.open(location, readonly=True) as db:
        where = db.whereabouts(job)
        assert where is not None
        assert where.holder is None  # released: the next runner takes it at once
        assert where.job.status in ("queued", "running")  # live, for the next runner
        assert [t.status for t in where.job.targets] == ["pending", "pending"]
