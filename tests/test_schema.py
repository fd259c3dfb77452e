"""The schema's one history (``store.schema``): a step per version, both
engines' text side by side, and the server functions' text agreeing with
what the engine sends and listens for."""

from __future__ import annotations

import re

from store import engines
from store.engines import postgres
from store.schema import HISTORY, VERSION


def test_every_step_holds_statements_for_both_engines() -> None:
    assert len(HISTORY) == VERSION
    for step in HISTORY:
        for statements in (step.sqlite, step.postgres):
            assert isinstance(statements, tuple)
            assert all(isinstance(s, str) and s.strip() for s in statements)


def _postgres_text() -> str:
    return "\n".join(s for step in HISTORY for s in step.postgres)


def test_the_server_functions_speak_the_engines_notices() -> None:
    """The functions, written out as released, notify on the channel the
    engine listens on, with the notices it knows."""
    text = _postgres_text()
    channels = set(re.findall(r"pg_notify\('(\w+)'", text))
    assert channels == {postgres.CHANNEL}
    assert f"'{engines.WORK}'" in text
    assert f"'{engines.TOLD}'" in text and f"'{engines.EVENT}'" in text
    assert f"<= {postgres.TOLD_BYTES}" in text
    assert f"pg_advisory_xact_lock({postgres.KEYS_LOCK}, h)" in text


def test_a_function_is_created_once_or_replaced_by_a_later_step() -> None:
    created = re.findall(r"CREATE FUNCTION (\w+)\(", _postgres_text())
    assert len(created) == len(set(created))
