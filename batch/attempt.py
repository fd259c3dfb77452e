"""One fetch of one target, and what became of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from .context import Context
from .errors import RetryLater, TargetError
from .model import Target
from .states import Reason, TargetState

__all__ = ["INTERNAL_ERROR", "TIMED_OUT", "Outcome", "attempt", "attempt_async"]

log = logging.getLogger("batch")

C = TypeVar("C")
T = TypeVar("T")

#: The JSON of a result: compact, finite numbers only. Made once (json.dumps
#: with options builds an encoder per call).
_COMPACT = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)
_ESCAPED = json.JSONEncoder(allow_nan=False, separators=(",", ":"))

#: The error stored for a target whose fetch ran past ``Config.timeout``
#: and was abandoned (``batch.timeouts``).
TIMED_OUT = "timed out"

#: What is stored for a fetch that raised something unexpected: its text might
#: carry secrets or internals, so it goes to the log and never to the store.
INTERNAL_ERROR = "internal error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one fetch came to: the status its target is to have. ``done``:
    ``result`` holds its JSON; ``failed``: ``error`` and ``hint`` say why;
    ``pending``: the upstream was busy, and the target is to be tried again.
    ``err`` is what the fetch raised (or why its result was refused), for the
    hooks only."""

    status: TargetState
    seconds: float
    result: str | None = None
    error: str | None = None
    hint: str | None = None
    err: BaseException | None = None
    #: For a busy upstream: the seconds it asked to wait (``RetryLater.after``).
    after: float = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes of result JSON."""
        return 0 if self.result is None else len(self.result.encode())

    def busy_too_long(self, retry_for: float, asked: bool = False) -> Outcome:
        """This busy outcome, turned into the failure stored when it has been
        busy for longer than ``retry_for`` seconds, or (``asked``) when the
        wait the upstream asked for ends past that."""
        why = (
            f"the upstream asked to wait {self.after:g}s, past retry_for={retry_for:g}s"
            if asked
            else f"still busy after retrying for {retry_for:g}s"
        )
        return Outcome(
            TargetState.FAILED,
            self.seconds,
            error=self.error,
            hint=f"{why}; try again later",
            err=self.err,
        )


def attempt(
    fetch: Callable[[Context, C, Target], object],
    ctx: Context,
    caller: C,
    target: Target,
) -> Outcome:
    """Call ``fetch`` once and classify what it did. Never raises: this is
    the one guard around everything a worker runs that is not the runner's
    own bookkeeping (the fetch, the encoding of its result, the text of its
    error), ``BaseException`` included."""
    start = time.monotonic()
    try:
        value = fetch(ctx, caller, target)
    # A worker must survive whatever a fetch does, the Go "panic" included.
    except BaseException as exc:  # noqa: BLE001
        return _guarded(_failure, exc, start, target)
    return _guarded(_success, value, start, target)


async def attempt_async(
    fetch: Callable[[Context, C, Target], Awaitable[object]],
    ctx: Context,
    caller: C,
    target: Target,
) -> Outcome:
    """:func:`attempt` for a fetch that is an ``async def``: awaited on the
    runner's event loop. Never raises either."""
    start = time.monotonic()
    try:
        value = await fetch(ctx, caller, target)
    except asyncio.CancelledError as exc:
        if ctx.reason is Reason.TIMED_OUT:  # its task, cancelled past the time limit
            return Outcome(TargetState.FAILED, time.monotonic() - start, error=TIMED_OUT)
        return _guarded(_failure, exc, start, target)
    except BaseException as exc:  # noqa: BLE001 - as attempt(), the loop's task included
        return _guarded(_failure, exc, start, target)
    return _guarded(_success, value, start, target)


def _guarded(
    classify: Callable[[T, float], Outcome], what: T, start: float, target: Target
) -> Outcome:
    """``classify(what, seconds)``; whatever that raises (an exception the
    fetch raised and nothing recognises, a result whose encoding fails
    oddly) is logged and stored as ``internal error``."""
    try:
        return classify(what, time.monotonic() - start)
    except BaseException as exc:
        # Not even a broken log handler ends a worker.
        with contextlib.suppress(BaseException):
            log.error(  # noqa: TRY400 - the exception logged is exc, not the one handled
                "fetch of %r failed; stored as %r", target.ref, INTERNAL_ERROR, exc_info=exc
            )
        return Outcome(TargetState.FAILED, time.monotonic() - start, error=INTERNAL_ERROR, err=exc)


def _success(value: object, seconds: float) -> Outcome:
    """What a fetch returned, encoded; or why it cannot be stored."""
    try:
        text = _COMPACT.encode(value)
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError:
                # A lone surrogate: valid in a str, not in UTF-8. Escaped, it
                # is stored and decoded back to the very same value.
                text = _ESCAPED.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        why = _text(exc)
        return Outcome(
            TargetState.FAILED,
            seconds,
            error="result is not JSON-serializable",
            hint=f"{why}; return dicts, lists, strings, finite numbers, booleans or None",
            err=exc,
        )
    # Anything else the encoding raises (a mapping whose items() raise, no
    # memory for a huge result) is the guard's: stored "internal error".
    return Outcome(TargetState.DONE, seconds, result=text)


def _failure(exc: BaseException, seconds: float) -> Outcome:
    if isinstance(exc, TargetError):
        hint = None if exc.hint is None else _text(exc.hint)
        return Outcome(TargetState.FAILED, seconds, error=_text(exc.msg), hint=hint, err=exc)
    busy = _retry_later(exc)
    if busy is not None:
        return Outcome(
            TargetState.PENDING,
            seconds,
            error=_text(busy) or "upstream busy",
            err=exc,
            after=busy.after or 0.0,
        )
    raise exc  # the guard in attempt() logs it and stores "internal error"


def _text(value: object) -> str:
    """``str(value)`` made storable: what UTF-8 cannot hold (a lone surrogate)
    is written as a backslash escape."""
    return str(value).encode("utf-8", "backslashreplace").decode()


def _retry_later(exc: BaseException) -> RetryLater | None:
    """The ``RetryLater`` in ``exc`` or its cause/context chain, if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, RetryLater):
            return e
        todo.extend(x for x in (e.__context__, e.__cause__) if x is not None)
    return None
