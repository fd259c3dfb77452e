"""Lock helpers shared by the runner's threads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["unlocked"]


@contextlib.contextmanager
def unlocked(lock: threading.Lock) -> Iterator[None]:
    """Release ``lock``, held by the caller, for the block; hold it again
    after, however the block ends. What the lock guards may change
    meanwhile: the caller reads it again afterwards."""
    lock.release()
    try:
        yield
    finally:
        lock.acquire()
