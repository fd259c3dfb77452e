"""The store's schema: one history of numbered steps, for both engines.

``HISTORY[i]`` takes a store from version ``i`` to ``i + 1`` (SQLite's
``PRAGMA user_version``; PostgreSQL's ``store_schema`` table), and holds
its SQLite and its PostgreSQL text side by side: one number for a step on
both engines, so that a store of either, created at any version, reaches
the schema of a new one by replaying the steps it lacks.

Steps are only ever appended. A released step never changes, nor does
anything it says: the statuses in its checks and indexes are spelled out,
the server functions written out whole, whatever ``states`` or the code
that calls them become. A change to any of them is a new step (for a
function, ``CREATE OR REPLACE``).

On PostgreSQL, text keys sort by code point (``COLLATE "C"``), as
SQLite's do; times are ``DOUBLE PRECISION`` where SQLite's are ``REAL``.
"""

from __future__ import annotations

from . import steps_01, steps_09, steps_12
from .step import Step

__all__ = ["HISTORY", "VERSION", "Step"]

HISTORY: tuple[Step, ...] = (*steps_01.STEPS, *steps_09.STEPS, *steps_12.STEPS)
VERSION = len(HISTORY)
