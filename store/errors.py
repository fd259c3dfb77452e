"""The store's errors: one root, each class raised in one kind of situation."""

from __future__ import annotations

__all__ = ["Conflict", "EventsPruned", "InvalidRun", "NotFound", "StoreError", "Unsatisfiable"]


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
