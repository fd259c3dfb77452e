"""The SQLite store under the batch runner.

import store
with store.open("jobs.sqlite3") as db:
    ...
"""

from .errors import Conflict, InvalidRun, NotFound, StoreError, Unsatisfiable
from .jobs import JobRow, TargetRow
from .store import Store, open

__all__ = [
    "Conflict",
    "InvalidRun",
    "JobRow",
    "NotFound",
    "Store",
    "StoreError",
    "TargetRow",
    "Unsatisfiable",
    "open",
]
