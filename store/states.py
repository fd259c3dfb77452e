"""The store's vocabulary: every status and state a row holds, spelled once.

Batch jobs and their targets have a lower-case ``status``; runs and their
steps an upper-case ``state``, as the public shapes show them. Each is a
``StrEnum``: a member *is* the text stored and shown, so it compares equal
to a plain string, serialises to JSON as one, and goes into SQL as one.
Rows read back hold members, not plain strings (``JOB_STATUSES`` and
``TARGET_STATES`` turn a column's text into its member by a dict lookup,
a twentieth of what calling the enum costs, for reads of many rows).

Adding a status: a member here, the schema's ``CHECK`` (a new migration
step), and the transitions that lead to it and from it;
``tests/test_states.py`` fails until the schema agrees.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ENDED_SQL",
    "JOB_STATUSES",
    "LIVE_JOB",
    "LIVE_SQL",
    "TARGET_STATES",
    "TERMINAL_JOB",
    "TERMINAL_SQL",
    "JobStatus",
    "RunState",
    "StepState",
    "TargetState",
    "Word",
    "ended_status",
    "sql_list",
    "sql_one_of",
]


class Word(StrEnum):
    """A word of the vocabulary: shown as its text everywhere, its repr
    too, so that a list or dict of statuses prints as ``['done', 'failed']``
    rather than as the members' enum reprs."""

    def __repr__(self) -> str:
        return repr(self.value)


class JobStatus(Word):
    """A batch job's status: live (``queued``, then ``running`` once a
    runner started it), then terminal for good."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PARTIAL = "partial"
    CANCELLED = "cancelled"


#: A job's member by its column's text.
JOB_STATUSES: dict[str, JobStatus] = {s.value: s for s in JobStatus}

#: A job that a runner may still change.
LIVE_JOB = (JobStatus.QUEUED, JobStatus.RUNNING)
#: A job that never changes again (it may only be evicted).
TERMINAL_JOB = (JobStatus.DONE, JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED)


class TargetState(Word):
    """A target's ``status``: ``pending`` until its outcome is stored, then
    ``done`` or ``failed`` for good."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


#: A target's member by its column's text.
TARGET_STATES: dict[str, TargetState] = {s.value: s for s in TargetState}


class RunState(Word):
    """A run's state: ``QUEUED`` while it waits for nodes, ``RUNNING`` once
    placed, then ``SUCCEEDED`` or ``FAILED`` (a cancelled run ends
    ``FAILED``) for good."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class StepState(Word):
    """A step's state: ``PENDING`` until its node starts it, ``RUNNING``,
    then ``SUCCEEDED`` or ``FAILED``."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


def ended_status(done: int, failed: int) -> JobStatus:
    """The status of a job whose every target is stored (rule 3): all done
    ``done``, all failed ``failed``, some of each ``partial``."""
    if not failed:
        return JobStatus.DONE
    return JobStatus.FAILED if not done else JobStatus.PARTIAL


def sql_list(*states: StrEnum) -> str:
    """These states as an SQL list, ``('a', 'b')``, for a statement's text:
    literals, not parameters, so that both engines match the partial
    indexes written with them."""
    return f"({', '.join(repr(s.value) for s in states)})"


def sql_one_of(column: str, *states: StrEnum) -> str:
    """The test that ``column`` holds one of these states, for a
    statement's text: ``(c = 'a' OR c = 'b' OR c = 'c')``. Where a test
    runs once per row written (a partial index's condition, a ``CHECK``),
    SQLite spends 3 us on an ``IN`` list of three or more values, building
    a lookup table each time a statement runs (each row of an
    ``executemany``), and nothing measurable on this chain."""
    return "(" + " OR ".join(f"{column} = {s.value!r}" for s in states) + ")"


#: The live and the terminal job statuses as SQL lists.
LIVE_SQL, TERMINAL_SQL = sql_list(*LIVE_JOB), sql_list(*TERMINAL_JOB)
#: That a job ended: the condition of the partial indexes of ended jobs
#: (``jobs_evictable``, ``jobs_ended``), which a query meant to use one
#: repeats word for word (SQLite takes a partial index only for a query
#: whose conditions include the index's).
ENDED_SQL = sql_one_of("status", *TERMINAL_JOB)
