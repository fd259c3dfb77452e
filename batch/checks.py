"""What a runner's caller gives, checked before anything is stored or
looked up: a job's targets and name, job ids, timeouts."""

from __future__ import annotations

import math
from collections.abc import Iterable
from itertools import islice

import store

from .clock import Clock
from .errors import InvalidJob, JobNotFound
from .model import Target

__all__ = [
    "MAX_NAME",
    "deadline",
    "idempotency_key",
    "job_id",
    "job_name",
    "later",
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

#: The most jobs one job may wait after.
MAX_AFTER = 1000


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


def job_id(value: object, error: type[Exception] = TypeError) -> str:
    """A job id, checked: a str (else ``error``)."""
    if not isinstance(value, str):
        raise error(f"a job id is a str, not {type(value).__name__}")
    return value


def stored_id(value: object) -> str:
    """A job id, checked before it is looked up in the store."""
    checked = job_id(value)
    if not checked.isascii():
        # Job ids are hex: this one cannot exist (nor be bound, if it holds a
        # lone surrogate).
        raise JobNotFound(f"no job {checked!r}")
    return checked


def later(not_before: object, after: object, after_ok: object) -> store.Later | None:
    """When a job may start, checked (None: at once): ``not_before`` an
    epoch time or None, ``after`` job ids (each once) or None, ``after_ok``
    a bool that needs ``after``. ``InvalidJob`` otherwise."""
    if not isinstance(after_ok, bool):
        raise InvalidJob(f"after_ok is a bool, not {type(after_ok).__name__}")
    if not_before is not None and (
        not isinstance(not_before, int | float)
        or isinstance(not_before, bool)
        or not math.isfinite(not_before)
    ):
        raise InvalidJob(f"not_before is an epoch time (seconds) or None, not {not_before!r}")
    ids: tuple[str, ...] = ()
    if after is not None:
        if isinstance(after, str) or not isinstance(after, Iterable):
            raise InvalidJob(f"after is a list of job ids, not {type(after).__name__}")
        ids = tuple(dict.fromkeys(job_id(value, InvalidJob) for value in after))
        if len(ids) > MAX_AFTER:
            raise InvalidJob(f"a job waits after at most {MAX_AFTER} jobs, not {len(ids)}")
    if after_ok and not ids:
        raise InvalidJob("after_ok=True needs the jobs to wait after (after=[...])")
    if not_before is None and not ids:
        return None
    return store.Later(float(not_before or 0.0), ids, after_ok)


def deadline(timeout: object, clock: Clock, name: str = "timeout") -> float:
    """The deadline ``timeout`` seconds from now on ``clock`` (inf for None);
    ``name``: what the caller calls it, for the errors."""
    if timeout is None:
        return math.inf
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(f"{name} is a number of seconds or None, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"{name} must be >= 0 seconds, not {timeout}")
    return clock.monotonic() + timeout
