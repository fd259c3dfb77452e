"""``Client``: submit, wait for, read and cancel jobs that other processes
run (``batch-runner work``), without running any here."""

from __future__ import annotations

import dataclasses
from typing import NoReturn, TypeVar

import store

from .clock import Clock
from .context import Context
from .hooks import Hooks
from .model import CallerLike, Config, Target
from .runner import Runner

__all__ = ["Client"]

C = TypeVar("C", bound=CallerLike)


class Client(Runner[C]):
    """Submits, waits for, reads and cancels jobs that worker processes run.

    A runner that runs nothing: what a web service or a script holds to
    hand jobs to worker processes (``batch-runner work``, or any runner
    with ``Config(resume=...)``) on the same store.

    Every method of :class:`Runner` works as there, with every submit form
    (``submit_many``, idempotency keys, ``not_before``, ``after``): each
    job is stored ``queued``, held by no runner, and the first worker with
    room takes it, in submit order (at once on PostgreSQL, which tells the
    workers; within ``keeper.CANCEL_POLL``, a tenth of a second, where the
    store cannot tell them: SQLite, or PostgreSQL through a transaction
    pooler). ``wait``, ``as_completed`` and ``wait_async``
    learn of its end from the store's events. The client starts no worker
    thread; its keeper keeps it registered, so that a runner that does not
    resume other callers' jobs leaves its jobs alone (once the client has
    closed, such a runner ends the jobs it left waiting as
    ``interrupted``, while one that resumes runs them).

    ``config``: as for a runner (``max_targets``, ``tracing``, ``keep``,
    ``takeover_after``...); its ``max_live`` is 0 whatever is given.
    """

    def __init__(
        self,
        db: store.Store,
        config: Config | None = None,
        hooks: Hooks | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config must be a batch.Config, not {type(config).__name__}")
        runs_none = dataclasses.replace(config or Config(), max_live=0)
        super().__init__(db, _runs_nothing, runs_none, hooks, clock=clock)


def _runs_nothing(ctx: Context, caller: object, target: Target) -> NoReturn:
    raise AssertionError("a client runs no job")  # pragma: no cover - max_live=0 starts none
