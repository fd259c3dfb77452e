"""The schema, one numbered step per version.

``MIGRATIONS[i]`` takes a file from ``PRAGMA user_version = i`` to ``i + 1``.
Steps are only ever appended: a released step never changes, so every file,
however old, reaches the same schema by replaying the steps it lacks.
"""

from __future__ import annotations

__all__ = ["LIVE_JOB", "MIGRATIONS", "TERMINAL_JOB", "VERSION"]

#: Job statuses, as stored. A terminal job never changes status again.
LIVE_JOB = ("queued", "running")
TERMINAL_JOB = ("done", "failed", "partial", "cancelled")

_JOBS = (
    # seq orders jobs by creation (AUTOINCREMENT: never reused, even after the
    # newest job is evicted), which breaks ties in eviction and orders restart.
    """
    CREATE TABLE jobs (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        id         TEXT    NOT NULL UNIQUE,
        owner      TEXT    NOT NULL,
        status     TEXT    NOT NULL CHECK (status IN
                   ('queued', 'running', 'done', 'failed', 'partial', 'cancelled')),
        created_at REAL    NOT NULL,
        updated_at REAL    NOT NULL,
        touched_at REAL    NOT NULL,
        nbytes     INTEGER NOT NULL DEFAULT 0 CHECK (nbytes >= 0)
    )
    """,
    # Eviction takes the least recently touched terminal job: this index hands
    # it over without a scan, and holds no live job at all.
    """
    CREATE INDEX jobs_evictable ON jobs (touched_at, seq)
    WHERE status IN ('done', 'failed', 'partial', 'cancelled')
    """,
    """
    CREATE TABLE targets (
        job_id TEXT    NOT NULL REFERENCES jobs (id),
        pos    INTEGER NOT NULL CHECK (pos >= 0),
        ref    TEXT    NOT NULL,
        status TEXT    NOT NULL DEFAULT 'pending'
               CHECK (status IN ('pending', 'done', 'failed')),
        result TEXT,
        error  TEXT,
        hint   TEXT,
        PRIMARY KEY (job_id, pos)
    ) WITHOUT ROWID
    """,
    # The byte total of every job, kept as targets are stored so that the
    # budget check after each target is one row read, not a SUM over targets.
    """
    CREATE TABLE job_bytes (
        one   INTEGER PRIMARY KEY CHECK (one = 1),
        total INTEGER NOT NULL CHECK (total >= 0)
    )
    """,
    "INSERT INTO job_bytes (one, total) VALUES (1, 0)",
)

MIGRATIONS: tuple[tuple[str, ...], ...] = (_JOBS,)
VERSION = len(MIGRATIONS)
