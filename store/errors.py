"""The store's errors: one root, each class raised in one kind of situation."""

from __future__ import annotations

__all__ = [
    "Conflict",
    "EventsPruned",
    "InvalidRun",
    "NotFound",
    "StoreError",
    "UnknownUpstream",
    "Unsatisfiable",
]


class StoreError(Exception):
    """Root of every error the store raises; also raised when the file cannot be used."""


class NotFound(StoreError, LookupError):
    """The run, node or job named does not exist in this store."""


class Unsatisfiable(StoreError):
    """The run could never be placed, even with every advertised node free."""


class Conflict(StoreError):
    """The request disagrees with the stored state (for example a node reporting a
    step it does not hold); nothing was changed."""


class InvalidRun(StoreError, ValueError):
    """The submitted run is malformed (empty, duplicate names, bad kind or needs);
    nothing was stored."""


class EventsPruned(StoreError, LookupError):
    """A watch asked for events after a number the store has pruned since."""


class UnknownUpstream(StoreError, ValueError):
    """A pause names an upstream that matches none the store's runners
    pace (by name, host, ``host:port`` or URL): it would hold nothing
    back, so nothing was changed. ``known``: the upstreams there are."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        there = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
        super().__init__(
            f"no upstream {name!r}: the runners of this store pace "
            + (there if known else "none yet")
            + " (give one of these, its host, or host:port)"
        )
