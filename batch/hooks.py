"""Metrics hooks, and the wrapper that keeps a failing hook from doing harm."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TypeVarTuple

from .states import JobStatus

__all__ = ["Hooks", "call_hook"]

log = logging.getLogger("batch")

Ts = TypeVarTuple("Ts")


class Hooks:
    """Subclass and override what you need; every method is a no-op here.

    The runner calls hooks with its lock held, so that each gauge sees the
    changes in the order they happened. Keep them quick, and never call back
    into the runner from one (it would deadlock). A hook that raises is logged
    and ignored: it never stops a worker or changes an outcome.
    """

    def depth(self, live: int) -> None:
        """The number of live jobs changed to ``live``."""

    def inflight(self, n: int) -> None:
        """The number of targets being fetched changed to ``n``."""

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        """A target was stored: ``err`` is None if it is done; ``seconds`` the
        fetch took; ``nbytes`` of result JSON."""

    def job(self, status: JobStatus) -> None:
        """A job became terminal with ``status`` (``cancelled`` included). Once per job."""

    def job_seconds(self, seconds: float) -> None:
        """A job ended ``done``, ``failed`` or ``partial``, ``seconds`` after it
        was submitted. Once per such job; a cancelled job gets none."""

    def retry(self, err: BaseException, wait: float) -> None:
        """A fetch answered busy (``err``, what it raised) and its target
        will be tried again in ``wait`` seconds. Once per such answer; a
        busy answer past ``retry_for`` is a stored failure instead
        (:meth:`target`)."""

    def upstream_held(self, upstream: str, seconds: float) -> None:
        """A busy answer (of this runner, or of another on the store, learned
        at a sync) holds ``upstream`` for ``seconds``: none of its targets
        starts meanwhile. Once per hold, however many answers extend it."""

    def upstream_released(self, upstream: str) -> None:
        """The hold of ``upstream`` is over: a target of it started again."""

    def abandoned(self, n: int) -> None:
        """The fetches abandoned at ``Config.timeout`` that have not returned
        yet changed to ``n``."""

    def ended(self, job_id: str, owner: str, status: JobStatus) -> None:
        """Job ``job_id`` of caller ``owner`` became terminal with ``status``:
        once per job, beside :meth:`job`, for hooks that want to know which."""


def call_hook(hook: Callable[[*Ts], object], *args: *Ts) -> None:
    """Call ``hook(*args)``; log and swallow anything it raises,
    ``BaseException`` included (a hook never ends a runner's thread)."""
    try:
        hook(*args)
    except BaseException:
        with contextlib.suppress(BaseException):  # nor does a broken log handler
            log.exception("hook %s raised; ignored", getattr(hook, "__qualname__", hook))
