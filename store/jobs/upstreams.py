"""Upstreams the runners of a store share (SPEC §2d): each runner's share of
an upstream's limits, and the holds busy answers put on it.

A runner that paces upstreams syncs them now and then (``sync``: one write
for all of them, none per target): it says how many of its jobs want each,
how many of its targets are in flight, and the holds its busy answers put
on them; it learns how many runners want each (it divides the rate by
that), the concurrency slots it may use, and how long each is held.

Guarantees (``docs/concurrency.md`` says how they hold, and within what):

1. The slots of an upstream stored for its live runners (a row seen within
   its ``lapse``) never sum past its ``concurrency``, and no runner has
   more of its targets in flight than its stored slots: a grant is made
   only of slots no other live runner holds, and a runner keeps, beyond
   its grant, the slots its fetches in flight use until they return.
   Its rate likewise: the starts a second stored never sum past ``rate``,
   and a runner starts no faster than its own.
2. Slots and rate are shared equally among the runners that want the
   upstream; slots left over when they do not divide go to each runner in
   turn (the turn moves every ``lapse``), so none waits for ever. While no
   runner wants it, one that syncs keeps what it would have alone (of what
   the others hold none of): a runner whose upstream goes idle now and
   then, alone on the store above all, starts its next target at once. A share
   another runner must give back first is granted once it has (at its
   next sync): the newcomer waits for that, the limit is never exceeded.
3. A hold any runner stores is seen by every runner at its next sync, and
   never shortened.
4. A dead runner's rows count until they lapse, then not at all.

``upstream_holds`` has a row for every upstream a runner of the store has
met (a sync names those it met since its last): what a pause may name.
Syncs of one upstream take turns: each locks the upstream's row of
``upstream_holds``, in name order, before it reads the others' slots.
Functions take an open transaction (``Tx``) and run inside it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..engines import Tx, in_list
from ..shapes import UpstreamShare, UpstreamView, UpstreamWant

__all__ = ["forget", "sync", "view"]


def sync(
    tx: Tx,
    runner_id: str,
    lapse: float,
    wants: Sequence[UpstreamWant],
    met: Sequence[str] = (),
) -> dict[str, UpstreamShare]:
    """Record what ``runner_id`` wants of each upstream (its rows last for
    ``lapse`` seconds unless synced again; those of upstreams it no longer
    names go), and the names of the upstreams it ``met``; return its share
    of each upstream it wants."""
    now = tx.now
    names = sorted({want.upstream for want in wants})
    # One insert, in name order (as the locks below are taken), for the
    # upstreams wanted and those met.
    tx.executemany(
        "INSERT INTO upstream_holds (upstream, held_until) VALUES (?, 0)"
        " ON CONFLICT (upstream) DO NOTHING",
        [(name,) for name in sorted({*names, *met})],
    )
    named, args = in_list("upstream", names)
    tx.execute(
        f"DELETE FROM upstream_shares WHERE runner_id = ? AND NOT ({named})", (runner_id, *args)
    )
    if not names:
        return {}
    held: dict[str, float] = dict(
        tx.execute(
            f"SELECT upstream, held_until FROM upstream_holds WHERE {named}"
            f" ORDER BY upstream {tx.locking()}",
            args,
        )
    )
    longer = {}
    for want in wants:
        if want.hold > 0 and now + want.hold > held[want.upstream]:
            held[want.upstream] = longer[want.upstream] = now + want.hold
    tx.executemany(
        "UPDATE upstream_holds SET held_until = ? WHERE upstream = ?",
        [(until, name) for name, until in longer.items()],
    )
    tx.execute(f"DELETE FROM upstream_shares WHERE {named} AND seen_at + lapse < ?", (*args, now))
    others: dict[str, list[tuple[str, int, int, float]]] = {name: [] for name in names}
    for name, other, demand, slots, rate in tx.execute(
        f"SELECT upstream, runner_id, demand, slots, rate FROM upstream_shares"
        f" WHERE {named} AND runner_id != ?",
        (*args, runner_id),
    ):
        others[name].append((other, demand, slots, rate))
    shares: dict[str, UpstreamShare] = {}
    rows = []
    for want in wants:
        rivals = others[want.upstream]
        wanting = sorted(
            [other for other, demand, _, _ in rivals if demand > 0]
            + ([runner_id] if want.demand > 0 else [])
        ) or [runner_id]
        slots = rate = None
        kept, kept_rate = 0, 0.0
        if want.concurrency is not None:
            free = max(0, want.concurrency - sum(used for _, _, used, _ in rivals))
            slots = min(free, _fair(want.concurrency, wanting, runner_id, int(now // lapse)))
            kept = max(slots, want.inflight)
        if want.rate is not None:
            free_rate = max(0.0, want.rate - sum(used for _, _, _, used in rivals))
            fair_rate = want.rate / len(wanting) if runner_id in wanting else 0.0
            rate = kept_rate = min(free_rate, fair_rate)
        rows.append((want.upstream, runner_id, want.demand, kept, kept_rate, now, lapse))
        shares[want.upstream] = UpstreamShare(
            len(wanting), slots, rate, max(0.0, held[want.upstream] - now)
        )
    tx.executemany(
        "INSERT INTO upstream_shares"
        " (upstream, runner_id, demand, slots, rate, seen_at, lapse)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (upstream, runner_id) DO UPDATE SET"
        " demand = excluded.demand, slots = excluded.slots, rate = excluded.rate,"
        " seen_at = excluded.seen_at, lapse = excluded.lapse",
        rows,
    )
    return shares


def view(tx: Tx) -> list[UpstreamView]:
    """Every upstream held now or paced by a live runner, by name; its
    ``runners`` are those of them that want it now."""
    now = tx.now
    rows = tx.execute(
        "SELECT h.upstream, h.held_until, count(s.runner_id),"
        " coalesce(sum(CASE WHEN s.demand > 0 THEN 1 ELSE 0 END), 0),"
        " coalesce(sum(s.demand), 0), coalesce(sum(s.slots), 0), coalesce(sum(s.rate), 0)"
        " FROM upstream_holds h LEFT JOIN upstream_shares s"
        " ON s.upstream = h.upstream AND s.seen_at + s.lapse >= ?"
        " GROUP BY h.upstream, h.held_until ORDER BY h.upstream",
        (now,),
    )
    return [
        UpstreamView(
            name, held_until if held_until > now else None, wanting, demand, slots, float(rate)
        )
        for name, held_until, paced, wanting, demand, slots, rate in rows
        if held_until > now or paced
    ]


def forget(tx: Tx, runner_id: str) -> None:
    """The runner closed: its shares go at once (its holds stay)."""
    tx.execute("DELETE FROM upstream_shares WHERE runner_id = ?", (runner_id,))


def _fair(concurrency: int, wanting: list[str], me: str, turn: int) -> int:
    """``me``'s equal part of ``concurrency`` among the runners ``wanting``
    it (sorted): ``concurrency // n`` each, and one more for each of the
    ``concurrency % n`` runners whose turn it is (``turn`` moves them)."""
    if me not in wanting:
        return 0
    base, extra = divmod(concurrency, len(wanting))
    return base + ((wanting.index(me) - turn) % len(wanting) < extra)
