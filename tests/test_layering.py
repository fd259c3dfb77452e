"""The house's walls: what a user sees of the store, apart from what only a
runner calls (``docs/architecture.md``)."""

from __future__ import annotations

import ast
import pydoc
from pathlib import Path

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
    "newer_schema",
    "release_jobs",
)


def test_help_on_store_shows_what_a_user_calls_and_none_of_the_runners_protocol() -> None:
    shown = pydoc.render_doc(store.Store, renderer=pydoc.plaintext)
    assert [name for name in RUNNER_PROTOCOL if f" {name}(" in shown] == []
    for name in ("list_jobs", "get_job", "cancel_job", "prune", "pause", "watch", "submit_run"):
        assert f" {name}(" in shown


def test_the_runners_protocol_is_the_ledgers() -> None:
    assert [name for name in RUNNER_PROTOCOL if not callable(getattr(Ledger, name, None))] == []
    assert "Ledger" not in store.__all__


# -- what may import what ---------------------------------------------------------

STORE = Path(__file__).resolve().parent.parent / "store"


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (relative imports made absolute)."""
    package = ".".join(path.relative_to(STORE.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _store_imports(under: str = "") -> dict[str, set[str]]:
    """Each module of the store (under the folder ``under``) and the store
    modules it imports."""
    return {
        str(path.relative_to(STORE.parent)): {
            name for name in _imports(path) if name == "store" or name.startswith("store.")
        }
        for path in sorted((STORE / under).rglob("*.py"))
    }


def _of(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_store_imports_nothing_of_the_runner() -> None:
    runner = {
        path: sorted(n for n in _imports(STORE.parent / path) if _of(n, "batch"))
        for path in _store_imports()
    }
    assert {path: names for path, names in runner.items() if names} == {}


def test_the_engines_import_nothing_above_them() -> None:
    """An engine knows the schema it migrates and the errors it raises, and
    nothing of the operations above it."""
    allowed = ("store.engines", "store.errors", "store.schema")
    above = {
        path: sorted(n for n in names if not _of(n, *allowed))
        for path, names in _store_imports("engines").items()
    }
    assert {path: names for path, names in above.items() if names} == {}


def test_the_schema_is_its_own() -> None:
    mixed = {
        path: sorted(n for n in names if not _of(n, "store.schema"))
        for path, names in _store_imports("schema").items()
    }
    assert {path: names for path, names in mixed.items() if names} == {}


def test_only_the_store_face_picks_an_engine() -> None:
    """The operations are written against the interface (``store.engines``);
    which engine serves a store is chosen once, where it is opened."""
    engines = ("store.engines.sqlite", "store.engines.postgres")
    picking = {
        path
        for path, names in _store_imports().items()
        if not path.startswith("store/engines/") and any(_of(n, *engines) for n in names)
    }
    assert picking == {"store/store.py"}


def test_the_jobs_and_the_runs_share_the_engine_and_nothing_else() -> None:
    """The batch jobs (``store.jobs``) and the run scheduler (``store.runs``)
    are two products on one engine: neither imports the other."""
    crossing = {
        path: sorted(n for n in names if _of(n, other))
        for own, other in (("jobs", "store.runs"), ("runs", "store.jobs"))
        for path, names in _store_imports(own).items()
    }
    assert {path: names for path, names in crossing.items() if names} == {}
