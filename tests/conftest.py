"""Shared fixtures: a fresh store file per test, a clock the test moves, and a
check that no test leaves a thread of its own running."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import store
from tests.helpers import Clock, store_clock


@pytest.fixture
def clock() -> Iterator[Clock]:
    """A clock the test moves by hand, read by the store for every timestamp."""
    with store_clock(Clock()) as c:
        yield c


@pytest.fixture
def db(tmp_path: Path) -> Iterator[store.Store]:
    """A new store file in the test's own temporary directory."""
    with store.open(tmp_path / "jobs.sqlite3") as s:
        yield s


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread it started still running."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for t in left:
        t.join(timeout=5)
    alive = [t.name for t in left if t.is_alive()]
    assert not alive, f"threads left running: {alive}"
