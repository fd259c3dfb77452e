"""Pacing against a real rate-limited server (SPEC §2d): nginx with
``limit_req`` at 20 requests a second, burst 2, answering 429 with
``Retry-After: 1``; the crawl is ``batch-runner fetch``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import nginx as nginxserver
from tests.cli_helpers import cli, url_file

RATE = 20
FILES = 60


@pytest.fixture(scope="module")
def nginx() -> Iterator[nginxserver.Nginx]:
    binary = nginxserver.find()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set, and nginx can be neither found nor installed")
        pytest.skip("no nginx here")
    with nginxserver.running(binary, rate=RATE, burst=2) as server:
        for n in range(FILES):
            (server.files / f"{n}.txt").write_text(f"file {n}\n" * 100)
        yield server


def crawl(tmp_path: Path, nginx: nginxserver.Nginx, *options: str) -> None:
    before = nginx.answers()
    urls = url_file(tmp_path, *(f"{nginx.base}/{n}.txt" for n in range(FILES)))
    done = cli("fetch", urls, "--db", tmp_path / "jobs.sqlite3", "--per-host", "4", *options)
    assert done.returncode == 0, done
    after = nginx.answers()
    return after - before  # type: ignore[return-value]


@pytest.mark.timeout(120)
def test_a_rate_per_host_draws_no_429(tmp_path: Path, nginx: nginxserver.Nginx) -> None:
    answered = crawl(tmp_path, nginx, "--workers", "8", "--rate", f"{RATE}/s")
    assert answered[200] == FILES
    assert answered[429] <= FILES // 100, answered


@pytest.mark.timeout(120)
def test_adaptive_pacing_learns_the_host_s_rate(tmp_path: Path, nginx: nginxserver.Nginx) -> None:
    answered = crawl(tmp_path, nginx, "--workers", "8", "--adaptive")
    assert answered[200] == FILES
    assert answered[429] <= FILES // 10, answered
