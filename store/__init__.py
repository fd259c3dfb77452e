"""The SQLite store under the batch runner.

import store
with store.open("jobs.sqlite3") as db:
    ...
"""

from .db import CANCELLED, RESYNC, WORK
from .errors import Conflict, InvalidRun, NotFound, StoreError, Unsatisfiable
from .jobs import JobRow, JobSummary, Lease, Stored, TargetOutcome, TargetRow
from .leases import Beat
from .record import label
from .schema import JobStatus, ended_status
from .shapes import Advert, Assigned, Assignment, Claim, NodeView, RunView, Step, StepView
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
    "InvalidRun",
    "JobRow",
    "JobStatus",
    "JobSummary",
    "Lease",
    "NodeView",
    "NotFound",
    "RunView",
    "Step",
    "StepView",
    "Store",
    "StoreError",
    "Stored",
    "TargetOutcome",
    "TargetRow",
    "Unsatisfiable",
    "ended_status",
    "label",
    "open",
]
