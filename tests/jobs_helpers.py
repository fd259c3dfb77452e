"""What the tests of the store's batch jobs build on: jobs of a given size,
reads of a job that must exist, byte counts, and SQLite's pragmas."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import store
from store.ledger import Ledger

JOIN_TIMEOUT = 30.0

TERMINAL = ("done", "failed", "partial", "cancelled")


def utf8_len(*texts: str | None) -> int:
    return sum(len(t.encode("utf-8")) for t in texts if t is not None)


def sqlite_pragma(path: Path, name: str) -> object:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (value,) = conn.execute(f"PRAGMA {name}").fetchone()
    return value


def job_of(db: store.Store, job_id: str, owner: str = "alice") -> store.JobRow:
    job = db.get_job(job_id, owner)
    assert job is not None, f"job {job_id!r} is gone"
    return job


def terminal_job(db: store.Store, job_id: str, nbytes: int, status: str = "done") -> None:
    """A job of exactly ``nbytes`` stored bytes (ASCII result), ended ``status``."""
    Ledger.of(db).create_job(job_id, "alice", ["t"])
    Ledger.of(db).store_target(job_id, 0, "done", result="x" * nbytes)
    assert Ledger.of(db).set_job_status(job_id, status)
