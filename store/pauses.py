"""What an operator paused: callers and upstreams no runner of the store
starts a new target for, until unpaused (SPEC §2f).

The store only keeps the list; runners read it at every beat (in the
transaction that renews their leases), and a runner that pauses or
unpauses applies it at once. Functions take an open
transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

from .db import Tx
from .shapes import Paused

__all__ = ["KINDS", "pause", "read", "unpause"]

#: What can be paused.
KINDS = ("caller", "upstream")


def pause(tx: Tx, kind: str, name: str) -> bool:
    """Pause ``name`` (a caller id or an upstream); False if it was already."""
    return (
        tx.execute(
            "INSERT INTO paused (kind, name, since) VALUES (?, ?, ?)"
            " ON CONFLICT (kind, name) DO NOTHING",
            (kind, name, tx.now),
        ).rowcount
        == 1
    )


def unpause(tx: Tx, kind: str, name: str) -> bool:
    """Unpause ``name``; False if it was not paused."""
    return tx.execute("DELETE FROM paused WHERE kind = ? AND name = ?", (kind, name)).rowcount == 1


def read(tx: Tx) -> Paused:
    """What is paused now."""
    found: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
    for kind, name, since in tx.execute("SELECT kind, name, since FROM paused ORDER BY name"):
        found[kind][name] = since
    return Paused(found["caller"], found["upstream"])
