"""The runner's errors: one root, each class raised in one kind of situation."""

from __future__ import annotations

__all__ = ["BatchError", "InvalidJob", "JobNotFound", "RetryLater", "RunnerClosed", "TargetError"]


class BatchError(Exception):
    """Root of every error of the ``batch`` package."""


class RetryLater(BatchError):
    """Raised by a fetch whose upstream is only busy: the target stays pending and
    is tried again after ``Config.retry_wait``, for up to ``Config.retry_for``.

    Also recognised in the ``__cause__``/``__context__`` chain of what fetch raises.
    """


class TargetError(BatchError):
    """Raised by a fetch for a target that failed for good; ``msg`` and ``hint``
    are stored with it, for the caller to read."""

    def __init__(self, msg: str, hint: str | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.hint = hint


class JobNotFound(BatchError, LookupError):
    """No such job for this caller: the id is unknown, evicted, or another caller's."""


class InvalidJob(BatchError, ValueError):
    """The target list cannot be a job: empty, longer than ``Config.max_targets``,
    or holding a bad ref. Nothing was stored."""


class RunnerClosed(BatchError, RuntimeError):
    """The runner is closed: it accepts no job, and a job it left unfinished will
    not end while it is closed."""
