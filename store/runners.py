"""Batch runners sharing one store file: who is alive, and who owns which job.

A runner registers when it starts and beats while it lives. When one starts,
it takes over the live jobs of every runner that is gone: closed, silent for
longer than ``lapse`` seconds, or (on this host) whose process has exited.
A live runner's jobs are never taken. Functions take an open transaction's
connection and run inside it.
"""

from __future__ import annotations

import os
import socket
import sqlite3

from . import jobs
from .jobs import JobRow

__all__ = ["HOST", "beat", "pid_alive", "register", "retire", "take_over"]

#: This machine's name, as runners record it.
HOST = socket.gethostname()


def register(conn: sqlite3.Connection, runner_id: str, now: float) -> None:
    """Record a new runner of this process, alive as of ``now``."""
    conn.execute(
        "INSERT INTO runners (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
        (runner_id, HOST, os.getpid(), now, now),
    )


def beat(conn: sqlite3.Connection, runner_id: str, now: float) -> None:
    """The runner is alive as of ``now``."""
    conn.execute("UPDATE runners SET heartbeat_at = ? WHERE id = ?", (now, runner_id))


def retire(conn: sqlite3.Connection, runner_id: str) -> None:
    """The runner closed: the next runner to start may take its jobs at once."""
    conn.execute("UPDATE runners SET closed = 1 WHERE id = ?", (runner_id,))


def take_over(conn: sqlite3.Connection, runner_id: str, now: float, lapse: float) -> list[JobRow]:
    """Give ``runner_id`` the live jobs of every runner that is gone, and of
    none; forget the gone runners. Returns the jobs it took, oldest first."""
    gone = [
        (other,)
        for other, host, pid, heartbeat_at, closed in conn.execute(
            "SELECT id, host, pid, heartbeat_at, closed FROM runners WHERE id != ?", (runner_id,)
        ).fetchall()
        if closed or heartbeat_at < now - lapse or (host == HOST and not pid_alive(pid))
    ]
    conn.executemany("DELETE FROM runners WHERE id = ?", gone)
    taken = conn.execute(
        "UPDATE jobs SET runner_id = ? WHERE status IN ('queued', 'running')"
        " AND (runner_id IS NULL OR runner_id NOT IN (SELECT id FROM runners))"
        " RETURNING id",
        (runner_id,),
    ).fetchall()
    return jobs.load_jobs(conn, [job_id for (job_id,) in taken])


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True
