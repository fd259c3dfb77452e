"""The vocabulary and the schema agree: a status added to ``store.states``
is refused by the store until a migration step lets its column hold it,
and a job status is either live or terminal."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest

import batch
import store
from store.ledger import Ledger
from store.states import LIVE_JOB, TERMINAL_JOB, JobStatus, RunState, StepState, TargetState
from tests.helpers import raw

pytestmark = pytest.mark.timeout(60)

COLUMNS: list[tuple[str, str, type[StrEnum]]] = [
    ("jobs", "status", JobStatus),
    ("targets", "status", TargetState),
    ("runs", "state", RunState),
    ("steps", "state", StepState),
]


def checked_values(location: str, table: str, column: str) -> set[str]:
    """The values the schema's CHECK lets ``table.column`` hold, as the
    engine itself reports its constraint."""
    if location.startswith("postgresql://"):
        texts = [
            text
            for (text,) in raw(
                location,
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = ?::regclass AND contype = 'c'",
                (table,),
            )
        ]
    else:
        (text,) = raw(location, "SELECT sql FROM sqlite_master WHERE name = ?", (table,))[0]
        texts = re.findall(r"CHECK\s*\((.*?)\)\s*[,)]", text, re.DOTALL)
    (found,) = [t for t in texts if re.search(rf"\b{column}\b", t) and "'" in t]
    return set(re.findall(r"'(\w+)'", found))


@pytest.mark.parametrize(("table", "column", "states"), COLUMNS)
def test_each_state_column_holds_exactly_its_vocabulary(
    db: store.Store, location: str, table: str, column: str, states: type[StrEnum]
) -> None:
    assert checked_values(location, table, column) == {s.value for s in states}


def test_a_job_status_is_live_or_terminal_and_never_both() -> None:
    assert sorted(LIVE_JOB + TERMINAL_JOB) == sorted(JobStatus)
    assert not set(LIVE_JOB) & set(TERMINAL_JOB)


def test_rows_read_back_hold_the_vocabulary_members(db: store.Store) -> None:
    Ledger.of(db).create_job("j", "alice", ["a", "b"])
    row = db.get_job("j", "alice")
    assert row is not None
    assert type(row.status) is JobStatus
    assert {type(t.status) for t in row.targets} == {TargetState}
    (summary,) = db.list_jobs()
    assert type(summary.status) is JobStatus


def test_both_packages_speak_one_vocabulary() -> None:
    assert batch.JobStatus is store.JobStatus
    assert batch.TargetState is store.TargetState
    assert batch.Reason.CANCELLED == JobStatus.CANCELLED
