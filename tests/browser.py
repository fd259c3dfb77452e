"""A real headless browser for the dashboard's tests: Debian's Chromium and
its ChromeDriver, installed with apt-get where they are absent (as the
PostgreSQL server is), driven by Selenium."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium", "find"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

#: Chromium's flags: headless, as root, and quiet on a closed network (its
#: background connections would be refused, many at a time). ChromeDriver
#: talks to it over a pipe, not a port it must wait for Chromium to write
#: to a file (ChromeDriver's own advice: that wait is what failed, once, on
#: a loaded machine).
FLAGS = (
    "--headless=new",
    "--remote-debugging-pipe",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
)


def _there() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def find() -> bool:
    """Whether Chromium and ChromeDriver are here, installing Debian's
    ``chromium`` and ``chromium-driver`` if they are not and we may."""
    if not _there() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            if subprocess.run(install, env=env, timeout=900, check=False).returncode:
                subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
                subprocess.run(install, check=True, env=env, timeout=900)
    return _there()


#: How many times a Chromium that never answered ChromeDriver (it hung or
#: died at start, which a loaded machine now and then makes it do) is
#: started again before the test fails with ChromeDriver's log.
STARTS = 3


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium driver of a new headless Chromium, with a profile of its
    own; quit afterwards."""
    from selenium import webdriver  # noqa: PLC0415 - only the browser tests need it
    from selenium.common.exceptions import SessionNotCreatedException  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="chromium-") as scratch:
        log = os.path.join(scratch, "chromedriver.log")
        for start in range(1, STARTS + 1):
            options = webdriver.ChromeOptions()
            options.binary_location = CHROMIUM
            profile = os.path.join(scratch, f"profile-{start}")
            for flag in (*FLAGS, f"--user-data-dir={profile}"):
                options.add_argument(flag)
            service = Service(CHROMEDRIVER, service_args=["--verbose"], log_output=log)
            try:
                driver = webdriver.Chrome(service=service, options=options)
                break
            except SessionNotCreatedException as e:
                if start == STARTS:
                    with open(log, errors="replace") as f:
                        tail = f.readlines()[-40:]
                    e.msg = f"{e.msg}\nChromeDriver's log, last lines:\n{''.join(tail)}"
                    raise
        try:
            yield driver
        finally:
            driver.quit()
