"""The store under the batch runner: an SQLite file, or a PostgreSQL
database shared by processes on many hosts, behind one API.

import store
with store.open("jobs.sqlite3") as db:                       # or
with store.open("postgresql://app@db.internal/jobs") as db:  # pip install 'batch-store[postgres]'
    ...
"""

#: The version of batch-store (both packages).
__version__ = "0.2.0"

from .engines import CANCELLED, RESYNC, WORK
from .errors import (
    Conflict,
    EventsPruned,
    InvalidRun,
    NotFound,
    StoreError,
    UnknownUpstream,
    Unsatisfiable,
)
from .runs.record import label
from .shapes import (
    Advert,
    Assigned,
    Assignment,
    Beat,
    Claim,
    Event,
    Gauges,
    JobRow,
    JobSummary,
    Later,
    Lease,
    Look,
    NodeView,
    Paused,
    RunView,
    Step,
    StepView,
    Stored,
    TargetOutcome,
    TargetRow,
    UpstreamShare,
    UpstreamView,
    UpstreamWant,
    Whereabouts,
)
from .states import JobStatus, RunState, StepState, TargetState, ended_status
from .store import Store, open

__all__ = [
    "CANCELLED",
    "RESYNC",
    "WORK",
    "Advert",
    "Assigned",
    "Assignment",
    "Beat",
    "Claim",
    "Conflict",
    "Event",
    "EventsPruned",
    "Gauges",
    "InvalidRun",
    "JobRow",
    "JobStatus",
    "JobSummary",
    "Later",
    "Lease",
    "Look",
    "NodeView",
    "NotFound",
    "Paused",
    "RunState",
    "RunView",
    "Step",
    "StepState",
    "StepView",
    "Store",
    "StoreError",
    "Stored",
    "TargetOutcome",
    "TargetRow",
    "TargetState",
    "UnknownUpstream",
    "Unsatisfiable",
    "UpstreamShare",
    "UpstreamView",
    "UpstreamWant",
    "Whereabouts",
    "__version__",
    "ended_status",
    "label",
    "open",
]
