"""The runner's vocabulary: the store's statuses, which the runner's jobs
and targets have (spelled once, in ``store.states``), and the runner's own
words for why a fetch is cancelled and what a view shows of a job gone."""

from __future__ import annotations

from store.states import LIVE_JOB, TERMINAL_JOB, JobStatus, TargetState, Word, ended_status

__all__ = [
    "EVICTED",
    "LIVE_JOB",
    "TERMINAL_JOB",
    "JobStatus",
    "Reason",
    "TargetState",
    "ended_status",
]


class Reason(Word):
    """Why a fetch's context is cancelled: the runner closes, the job was
    cancelled (through any runner on the store), or the fetch ran past
    ``Config.timeout``."""

    CLOSED = "closed"
    CANCELLED = JobStatus.CANCELLED.value
    TIMED_OUT = "timed out"


#: What the command line shows for a job that ended and was evicted by
#: ``Config.max_bytes`` before it looked.
EVICTED = "evicted"
