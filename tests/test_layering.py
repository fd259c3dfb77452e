"""The house's walls: what a user sees of the store, apart from what only a
runner calls (``docs/architecture.md``)."""

from __future__ import annotations

import pydoc

import store
from store.ledger import Ledger

#: What only a runner calls: ``store.ledger.Ledger``'s, not ``Store``'s.
RUNNER_PROTOCOL = (
    "register_runner",
    "beat_runner",
    "retire_runner",
    "create_job",
    "create_jobs",
    "set_job_status",
    "store_target",
    "store_targets",
    "interrupt_job",
    "job_leases",
    "look",
    "sync_upstreams",
    "after_of",
    "subscribe",
    "total_bytes",
)


def test_help_on_store_shows_what_a_user_calls_and_none_of_the_runners_protocol() -> None:
    shown = pydoc.render_doc(store.Store, renderer=pydoc.plaintext)
    assert [name for name in RUNNER_PROTOCOL if f" {name}(" in shown] == []
    for name in ("list_jobs", "get_job", "cancel_job", "prune", "pause", "watch", "submit_run"):
        assert f" {name}(" in shown


def test_the_runners_protocol_is_the_ledgers() -> None:
    assert [name for name in RUNNER_PROTOCOL if not callable(getattr(Ledger, name, None))] == []
    assert "Ledger" not in store.__all__
