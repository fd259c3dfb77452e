"""One step of the store's schema history (``store.schema``)."""

from __future__ import annotations

import dataclasses

__all__ = ["Step"]


@dataclasses.dataclass(frozen=True)
class Step:
    """What takes a store from the version before this step to its own: its
    statements on SQLite, and on PostgreSQL (the same tuple where the text
    is the same). Either may be empty: a step one engine needs and the
    other does not still has its number on both."""

    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]
