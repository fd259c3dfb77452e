"""A batch runner: fair, serial per job, patient with busy upstreams.

import batch, store
with store.open("jobs.sqlite3") as db, batch.Runner(db, fetch) as runner:
    job_id = runner.submit(batch.Caller("alice"), ["doc-1", "doc-2"])
    job = runner.wait(batch.Caller("alice"), job_id, timeout=30)
"""

from store import __version__

from .client import Client
from .context import Context
from .errors import (
    BatchError,
    InvalidJob,
    JobNotFound,
    RetryLater,
    RunnerClosed,
    StoreFailed,
    TargetError,
)
from .hooks import Hooks
from .model import (
    Caller,
    CallerLike,
    Config,
    Job,
    Limit,
    Statistics,
    Target,
    TargetStatus,
    UpstreamState,
)
from .runner import Fetch, Runner
from .states import JobStatus, Reason, TargetState

__all__ = [
    "BatchError",
    "Caller",
    "CallerLike",
    "Client",
    "Config",
    "Context",
    "Fetch",
    "Hooks",
    "InvalidJob",
    "Job",
    "JobNotFound",
    "JobStatus",
    "Limit",
    "Reason",
    "RetryLater",
    "Runner",
    "RunnerClosed",
    "Statistics",
    "StoreFailed",
    "Target",
    "TargetError",
    "TargetState",
    "TargetStatus",
    "UpstreamState",
    "__version__",
]
