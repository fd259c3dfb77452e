"""What an operator paused: callers and upstreams no runner of the store
starts a new target for, until unpaused (SPEC §2f).

The store only keeps the list; runners read it at every beat and every
look for cancelled jobs (in the transaction that renews their leases, or
reads those), and a runner that pauses or unpauses applies it at once.

An upstream is paused by the name a person knows it by (:func:`covers`):
its own name, or for an upstream named after a URL's origin
(``scheme://host:port``, as ``batch.web.host_of`` names it) its host,
``host:port``, or any URL of that origin. A pause that covers no upstream
the store knows of is refused: it would hold nothing back.

Functions that take an open transaction (``Tx``) run inside it.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterable

from ..engines import Tx
from ..errors import UnknownUpstream
from ..shapes import Paused

__all__ = ["KINDS", "covering", "covers", "gathered", "known", "origin", "pause", "read", "unpause"]

#: What can be paused.
KINDS = ("caller", "upstream")

#: The port a URL means when it names none, by scheme.
_PORTS = {"http": 80, "https": 443}


def covers(paused: str, upstream: str) -> bool:
    """Whether a pause of ``paused`` holds the targets of ``upstream``: the
    same name, or ``upstream`` is a URL's origin and ``paused`` names its
    host (any case), its ``host:port``, or a URL of that origin."""
    return paused == upstream or _key(paused) in _aliases(upstream)


def covering(paused: Iterable[str], upstream: str) -> str | None:
    """The first of the ``paused`` upstream names (in their order) that
    covers ``upstream``; None if none does."""
    return next((name for name in paused if covers(name, upstream)), None)


def origin(url: str) -> str | None:
    """The origin of an http or https URL as upstreams are named after it
    (``batch.web.host_of``): ``scheme://host:port``, in lower case, the
    scheme's port filled in, an IPv6 host in brackets. None for anything
    else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _PORTS or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}:{port or _PORTS[scheme]}"


@functools.lru_cache(maxsize=4096)
def _aliases(upstream: str) -> frozenset[str]:
    """What a pause may call ``upstream`` by, besides its own name."""
    named = origin(upstream)
    if named is None:
        return frozenset()
    host_port = named.split("://", 1)[1]
    return frozenset({named, host_port, host_port.rsplit(":", 1)[0]})


@functools.lru_cache(maxsize=4096)
def _key(paused: str) -> str:
    """A paused name as :func:`_aliases` spells them: a URL as its origin,
    anything else in lower case."""
    return origin(paused) or paused.lower()


def known(tx: Tx) -> list[str]:
    """Every upstream a runner of the store has paced, by name."""
    return [name for (name,) in tx.execute("SELECT upstream FROM upstream_holds ORDER BY upstream")]


def pause(tx: Tx, kind: str, name: str, also_known: Iterable[str] = ()) -> bool:
    """Pause ``name`` (a caller id or an upstream); False if it was already.
    ``UnknownUpstream`` for an upstream name that covers none of those the
    store knows of, nor of ``also_known`` (those of the runner pausing)."""
    if kind == "upstream":
        names = sorted({*known(tx), *also_known})
        if not any(covers(name, upstream) for upstream in names):
            raise UnknownUpstream(name, names)
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
    return gathered(tx.execute("SELECT kind, name, since FROM paused ORDER BY name"))


def gathered(rows: Iterable[tuple[str, str, float]]) -> Paused:
    """What is paused, from rows of ``paused`` (kind, name, since) in name order."""
    found: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
    for kind, name, since in rows:
        found[kind][name] = since
    return Paused(found["caller"], found["upstream"])
