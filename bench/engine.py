"""Which engine the suite measures, and the stores it makes on it.

``python -m bench`` measures SQLite; ``--engine postgres`` measures the
scenarios that exist on both (1, 2 and 5), 10 (runner processes on one
database) and 11's rows of runner processes sharing an upstream's limits,
on a PostgreSQL server: the one ``--pg-url`` names (a
maintenance database the suite may create databases from), else a
throwaway server the suite starts itself, as the tests do.
Every store is then a database of its own, dropped afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

__all__ = ["Raw", "copy_of", "engine", "scratch", "server_cpu", "use"]

Engine = Literal["sqlite", "postgres"]

_engine: Engine = "sqlite"
_admin_url: str | None = None
_names = itertools.count(1)


def use(which: Engine, pg_url: str | None = None) -> None:
    """Measure on ``which`` from now on."""
    global _engine, _admin_url  # noqa: PLW0603 (the suite's one setting)
    _engine = which
    _admin_url = pg_url


def engine() -> Engine:
    return _engine


def _admin() -> str:
    """The maintenance database of the server measured on, started if need be."""
    global _admin_url  # noqa: PLW0603
    if _admin_url is None:
        from tests import pgserver  # noqa: PLC0415 (only the PostgreSQL suite needs it)

        bindir = pgserver.find_bin()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server here: pass --pg-url")
        running = pgserver.running(bindir)
        server = running.__enter__()
        atexit.register(running.__exit__, None, None, None)
        _admin_url = server.url()
    return _admin_url


def _url_for(name: str) -> str:
    """The URL of database ``name`` on the server of the maintenance URL."""
    admin = _admin()
    head, _, query = admin.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def _admin_sql(sql: str) -> None:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(_admin(), autocommit=True) as conn:
        conn.execute(sql)


@contextlib.contextmanager
def scratch(name: str = "bench.sqlite3") -> Iterator[str]:
    """Where a new store goes, removed afterwards: a file path in a
    temporary directory, or a new PostgreSQL database."""
    if _engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="bench-") as d:
            yield str(Path(d) / name)
        return
    db = f"bench_{os.getpid()}_{next(_names)}"
    _admin_sql(f"CREATE DATABASE {db}")
    try:
        yield _url_for(db)
    finally:
        _admin_sql(f"DROP DATABASE {db} WITH (FORCE)")


def server_cpu() -> float | None:
    """CPU seconds the PostgreSQL server measured on has used so far: its
    processes alive now and those that ended (counted in their parent's
    children times once reaped). None where it cannot be read: a server
    on another machine, or a user who may not ask where its data is."""
    import psycopg  # noqa: PLC0415

    try:
        with psycopg.connect(_admin(), autocommit=True) as conn:
            (data,) = conn.execute("SHOW data_directory").fetchone() or ("",)
        postmaster = int(Path(data, "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError, TypeError, psycopg.Error):
        return None
    ticks = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # After "pid (comm)": state, ppid, ..., utime, stime, cutime, cstime.
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        if int(proc.name) == postmaster:
            ticks += sum(int(f) for f in fields[11:15])
        elif int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def copy_of(base: str) -> Iterator[str]:
    """A scratch copy of the store ``base`` (nothing may have it open):
    every measure on a store built once starts from the same state."""
    if _engine == "sqlite":
        with scratch(Path(base).name) as path:
            shutil.copy(base, path)
            yield path
        return
    db = f"bench_{os.getpid()}_{next(_names)}"
    source = base.partition("?")[0].rsplit("/", 1)[1]
    _admin_sql(f"CREATE DATABASE {db} TEMPLATE {source}")
    try:
        yield _url_for(db)
    finally:
        _admin_sql(f"DROP DATABASE {db} WITH (FORCE)")


class Raw:
    """A connection of its own to the store at ``location``, on either
    engine, for what a scenario does behind the store's back (bulk history,
    freeing nodes): ``?`` placeholders; nothing is committed but by
    :meth:`commit` after :meth:`begin`, or each statement outside them."""

    def __init__(self, location: str) -> None:
        self.pg = location.startswith("postgresql://")
        if self.pg:
            import psycopg  # noqa: PLC0415

            self._conn: Any = psycopg.connect(location, autocommit=True)
        else:
            import sqlite3  # noqa: PLC0415

            self._conn = sqlite3.connect(location, isolation_level=None)
            # The schema's triggers read the time of the change.
            self._conn.create_function("store_now", 0, time.time)

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.pg else sql

    def execute(self, sql: str, args: tuple[object, ...] = ()) -> Any:
        return self._conn.execute(self._sql(sql), args)

    def executemany(self, sql: str, rows: Any) -> None:
        if self.pg:
            with self._conn.cursor() as cur:
                cur.executemany(self._sql(sql), list(rows))
        else:
            self._conn.executemany(sql, rows)

    def begin(self) -> None:
        self._conn.execute("BEGIN" if self.pg else "BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()
