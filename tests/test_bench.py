"""The benchmark suite's shape: every scenario joins the registry, and no
scenario imports another (what several share is in ``bench.workload``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

BENCH = Path(__file__).resolve().parent.parent / "bench"

#: The modules a scenario may take from: the suite's own parts.
SHARED = {
    "bench.counting",
    "bench.delay",
    "bench.engine",
    "bench.fleet",
    "bench.measure",
    "bench.nginx",
    "bench.suite",
    "bench.workload",
}


def test_every_scenario_joins_the_suite_once() -> None:
    import bench.run  # noqa: PLC0415, F401 - imports every scenario
    from bench.suite import SCENARIOS  # noqa: PLC0415

    assert sorted(SCENARIOS, key=lambda k: (not k.isdigit(), k.zfill(3))) == [
        *map(str, range(1, 15)),
        "D",
    ]


def test_no_scenario_imports_another() -> None:
    scenarios = [p for p in BENCH.glob("*.py") if "join(Scenario(" in p.read_text(encoding="utf-8")]
    assert len(scenarios) == 15
    borrowed = {}
    for path in scenarios:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        taken = {
            node.module if node.module != "bench" else f"bench.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench")
            for alias in node.names
        }
        if taken - SHARED:
            borrowed[path.name] = sorted(taken - SHARED)
    assert not borrowed, f"scenarios importing others: {borrowed}"
