"""The dashboard in a real browser (headless Chromium, Debian's): the page
loads, shows a job's progress move while a runner works, and a cancel from
the page ends the job; ``batch-runner serve`` stops on SIGINT with 130."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from store.ledger import Ledger

pytest.importorskip("starlette")
pytest.importorskip("selenium")
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import batch
import store
from tests import browser
from tests.helpers import TIMEOUT, Script

# A guard against a hang, long enough for the first test to install
# Chromium where it is absent (CI installs it beforehand).
pytestmark = pytest.mark.timeout(600)

ALICE = batch.Caller("alice")


@pytest.fixture(scope="module")
def chromium_here() -> None:
    if not browser.find():
        if os.environ.get("CI"):
            pytest.fail("CI is set, and Chromium can be neither found nor installed")
        pytest.skip("no Chromium here")


@pytest.fixture
def page(chromium_here: None) -> Iterator[Any]:
    with browser.chromium() as driver:
        yield driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: ``python -m batch`` as from a terminal: a test run in the background
#: (SIGINT ignored, which the command keeps ignored) still sees Ctrl-C.
AT_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('batch', run_name='__main__', alter_sys=True)"
)


@contextlib.contextmanager
def serving(location: str, *options: str) -> Iterator[str]:
    """``batch-runner serve`` on the store, as a process of its own; its URL
    once it answers. Stopped with SIGINT, which it must end on with 130,
    quietly, its open event streams ended."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AT_A_TERMINAL,
            "serve",
            "--db",
            location,
            "--port",
            str(port),
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT * 3
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the dashboard never listened"
            threading.Event().wait(0.05)  # allow-sleep: a process starting; nothing to wait on
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err  # its event streams ended, not cut


def _row_text(page: Any, job_id: str) -> str:
    rows = page.find_elements(By.ID, f"job-{job_id}")
    return rows[0].text if rows else ""


def test_the_page_shows_a_jobs_progress_move_as_a_runner_works(location: str, page: Any) -> None:
    script = Script()
    script.hold("b", "c")
    with (
        store.open(location) as db,
        batch.Runner(db, script, batch.Config(workers=1)) as runner,
        serving(location) as url,
    ):
        job_id = runner.submit(ALICE, ["a", "b", "c"], name="crawl")
        script.started("b")
        page.get(url)
        wait = WebDriverWait(page, TIMEOUT * 2)
        wait.until(lambda p: "1/3" in _row_text(p, job_id))
        assert "crawl" in _row_text(page, job_id)
        assert page.find_element(By.ID, "live").get_attribute("class") == "on"
        script.release("b")  # the page learns it from the store's events
        wait.until(lambda p: "2/3" in _row_text(p, job_id))
        script.release("c")
        wait.until(lambda p: "3/3" in _row_text(p, job_id) and "done" in _row_text(p, job_id))
        page.find_element(By.ID, f"job-{job_id}").click()
        wait.until(lambda p: len(p.find_elements(By.CSS_SELECTOR, "#targets tr")) == 3)
        assert not page.find_elements(By.CSS_SELECTOR, f"#job-{job_id} button")


def test_a_cancel_from_the_page_ends_the_job(location: str, page: Any) -> None:
    script = Script()
    script.hold("a")
    with (
        store.open(location) as db,
        batch.Runner(db, script, batch.Config(workers=1)) as runner,
        serving(location, "--allow-cancel") as url,
    ):
        job_id = runner.submit(ALICE, ["a", "b"])
        script.started("a")
        page.get(url)
        wait = WebDriverWait(page, TIMEOUT * 2)
        wait.until(lambda p: p.find_elements(By.CSS_SELECTOR, f"#job-{job_id} button"))
        page.find_element(By.CSS_SELECTOR, f"#job-{job_id} button").click()
        wait.until(lambda p: "cancelled" in _row_text(p, job_id))
        script.release("a")
        assert runner.wait(ALICE, job_id, TIMEOUT).status == "cancelled"


def test_a_read_only_page_offers_no_cancel(location: str, page: Any) -> None:
    with store.open(location) as db, serving(location) as url:
        Ledger.of(db).create_job("j1", "alice", ["a"])
        page.get(url)
        wait = WebDriverWait(page, TIMEOUT * 2)
        wait.until(lambda p: "queued" in _row_text(p, "j1"))
        assert not page.find_elements(By.CSS_SELECTOR, "#job-j1 button")
