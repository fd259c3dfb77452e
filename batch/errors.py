"""The runner's errors: one root, each class raised in one kind of situation."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import store

__all__ = [
    "BatchError",
    "InvalidJob",
    "JobNotFound",
    "RetryLater",
    "RunnerClosed",
    "StoreFailed",
    "TargetError",
    "store_failed",
]


class BatchError(Exception):
    """Root of every error of the ``batch`` package."""


class RetryLater(BatchError):
    """Raised by a fetch whose upstream is only busy: the target stays pending and
    is tried again after ``Config.retry_wait``, for up to ``Config.retry_for``.

    ``after``: seconds the upstream asked to wait (an HTTP ``Retry-After``);
    the next try waits at least that long, and a target that could only be
    tried again past ``retry_for`` fails at once. Also recognised in the
    ``__cause__``/``__context__`` chain of what fetch raises.
    """

    def __init__(self, msg: str = "upstream busy", *, after: float | None = None) -> None:
        if after is not None:
            if not isinstance(after, int | float) or isinstance(after, bool):
                raise TypeError(f"after is a number of seconds, not {type(after).__name__}")
            if not math.isfinite(after) or after < 0:
                raise ValueError(f"after must be a finite number of seconds >= 0, not {after}")
        super().__init__(msg)
        self.after = after


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


class StoreFailed(BatchError, store.StoreError):
    """The store could not do what a runner's method asked: unreachable,
    locked for longer than its timeout, read-only, full. The store's own
    error is its ``__cause__``; it is a ``store.StoreError`` too. A submit
    that raises it stored its jobs whole or not at all; stored (the answer
    to its commit was lost), they run all the same: the runner's next beat
    takes them up."""


@contextlib.contextmanager
def store_failed() -> Iterator[None]:
    """Raise what the store raises inside as :class:`StoreFailed`, so that a
    caller of the runner catches one root, ``BatchError``; but for
    ``store.UnknownUpstream``, a name the caller gave wrong (a
    ``ValueError``), which is raised as it is."""
    try:
        yield
    except (StoreFailed, store.UnknownUpstream):
        raise
    except store.StoreError as exc:
        raise StoreFailed(str(exc)) from exc


class RunnerClosed(BatchError, RuntimeError):
    """The runner is closed: it accepts no job, and a job it left unfinished will
    not end while it is closed."""
