"""What a runner's caller gives, checked before anything is stored or
looked up: a job's targets and name, job ids, timeouts."""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice

from .clock import Clock
from .errors import InvalidJob, JobNotFound
from .model import Target

__all__ = [
    "MAX_NAME",
    "deadline",
    "idempotency_key",
    "job_id",
    "job_name",
    "stored_id",
    "targets",
]


def targets(given: object, most: int) -> list[Target]:
    """A job's targets, checked: an iterable (not a str) of 1 to ``most``
    refs or ``Target`` objects, each ref valid."""
    if isinstance(given, str | bytes) or not isinstance(given, Iterable):
        raise InvalidJob(
            f"targets must be a list of str or batch.Target, not {type(given).__name__}"
        )
    items = list(islice(given, most + 1))
    if not items:
        raise InvalidJob("a job needs at least one target")
    if len(items) > most:
        raise InvalidJob(f"a job holds at most {most} targets (Config.max_targets)")
    out: list[Target] = []
    for pos, item in enumerate(items):
        try:
            out.append(item if isinstance(item, Target) else Target(item))
        except InvalidJob as e:
            raise InvalidJob(f"target {pos}: {e}") from None
    return out


#: The longest name a job may have, in characters.
MAX_NAME = 200


def job_name(name: object) -> str | None:
    """A job's name, checked: None, or printable text of at most
    ``MAX_NAME`` characters."""
    return _label(name, "a job's name")


def idempotency_key(key: object) -> str | None:
    """An idempotency key, checked as a name is."""
    return _label(key, "an idempotency key")


def _label(value: object, what: str) -> str | None:
    """``value`` if it is None or printable text of 1 to ``MAX_NAME``
    characters, not all blank; else ``InvalidJob`` saying ``what`` it is."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidJob(f"{what} is a str or None, not {type(value).__name__}")
    if not value.strip() or not value.isprintable() or len(value) > MAX_NAME:
        raise InvalidJob(
            f"{what} is printable text of 1 to {MAX_NAME} characters, not {value[:40]!r}"
        )
    return value


def job_id(value: object) -> str:
    """A job id, checked: a str."""
    if not isinstance(value, str):
        raise TypeError(f"a job id is a str, not {type(value).__name__}")
    return value


def stored_id(value: object) -> str:
    """A job id, checked before it is looked up in the store."""
    checked = job_id(value)
    if not checked.isascii():
        # Job ids are hex: this one cannot exist (nor be bound, if it holds a
        # lone surrogate).
        raise JobNotFound(f"no job {checked!r}")
    return checked


def deadline(timeout: object, clock: Clock) -> float:
    """The deadline ``timeout`` seconds from now on ``clock`` (inf for None)."""
    if timeout is None:
        return math.inf
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"timeout is a number of seconds or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout}")
    return clock.monotonic() + timeout
