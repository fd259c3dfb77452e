"""The SQLite store under the batch runner.

import store
with store.open("jobs.sqlite3") as db:
    ...
"""

from .errors import Conflict, InvalidRun, NotFound, StoreError, Unsatisfiable
from .jobs import JobRow, JobSummary, Stored, TargetOutcome, TargetRow
from .record import label
from .shapes import Advert, Assigned, Assignment, Claim, NodeView, RunView, Step, StepView
from .store import Store, open

__all__ = [
    "Advert",
    "Assigned",
    "Assignment",
    "Claim",
    "Conflict",
    "InvalidRun",
    "JobRow",
    "JobSummary",
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
    "label",
    "open",
]
