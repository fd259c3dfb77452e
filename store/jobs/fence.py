"""The job fence: how a write made under a runner's lease on a job
(``shapes.Lease``) is kept to the job's current holder. Every write a
runner makes for a job names its owner and token; the store makes it only
while the job still has exactly that owner and token (or, for the outcome
in flight when the job ended, the token unchanged since), so a runner
that lost a job can store nothing for it."""

from __future__ import annotations

from ..shapes import Lease
from ..states import LIVE_JOB

__all__ = ["fenced", "holds", "lease_args"]


def fenced(o: int, t: int) -> str:
    """The condition of a write to a job's row made under a lease: the job
    is held by owner (parameter) ``o`` with token ``t``; a NULL owner (no
    lease given) writes unconditioned.

    A condition on the row being written, never a look at it in a
    subquery: a statement that waited for the row's lock (PostgreSQL, READ
    COMMITTED) judges the row as the other writer left it only by such
    conditions; a subquery keeps what it read before the wait, and a
    take-over committed meanwhile would go unseen."""
    return f" AND (?{o} IS NULL OR (lease_owner = ?{o} AND lease_token = ?{t}))"


def lease_args(lease: Lease | None) -> tuple[str | None, int | None]:
    """The owner and token a fenced statement binds: both None for none."""
    return (None, None) if lease is None else (lease.owner, lease.token)


def holds(status: str | None, owner: str | None, token: int | None, lease: Lease | None) -> bool:
    """Whether a write made under ``lease`` (None: unconditioned) may be
    made to a job seen with this ``status``, lease ``owner`` and ``token``:
    the job is held with exactly that lease; or it is terminal, its lease
    released and its token unchanged (no runner took it since), which is
    how the outcome of the target in flight when it was cancelled finds it
    if a beat of its runner released the lease before the outcome came.
    (``store_record``, the batch on PostgreSQL, says the same in SQL.)"""
    if lease is None or (owner == lease.owner and token == lease.token):
        return True
    return owner is None and token == lease.token and status not in LIVE_JOB
