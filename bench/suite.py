"""The suite: a registry every scenario module joins as it is imported, and
the command line that runs the scenarios asked for, each measuring our code
and its baselines in the same run, taking turns round by round, and ends
with one table and a JSON record.

This module imports no scenario: ``bench.run`` (``python -m bench``)
imports them all, and a scenario module run alone (``python -m
bench.durability``) runs itself. What several scenarios share is in
``bench.workload``; no scenario imports another.

The machine is noisy and shared: compare ratios measured in the same run,
never absolute figures across runs.

The JSON record goes to ``bench/results/<commit>.json`` (git ignores that
directory), with ``-dirty`` when the library's code differs from the commit,
``-quick`` for small sizes and ``-only-...`` for a part of the suite, so that
a partial run never overwrites a full one. The exit status is 0 whenever the
suite ran, whatever targets it met: a benchmark reports, it does not judge.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import engine
from bench.measure import REPO, Options, Row, Scenario, git_state, print_table, record

__all__ = ["ON_POSTGRES", "SCENARIOS", "join", "main"]

#: The scenarios measured on PostgreSQL too (``--engine postgres``).
ON_POSTGRES = ("1", "2", "5", "10", "11", "12", "13", "14")

#: Every scenario imported so far, by key: each module joins as it is
#: imported (:func:`join`).
SCENARIOS: dict[str, Scenario] = {}


def join(scenario: Scenario) -> Scenario:
    """Add ``scenario`` to the registry under its key; return it."""
    if SCENARIOS.get(scenario.key, scenario) is not scenario:
        raise ValueError(f"two scenarios have the key {scenario.key!r}")
    SCENARIOS[scenario.key] = scenario
    return scenario


def _suite() -> list[Scenario]:
    """The whole suite: every scenario joined with a number for its key, in
    that order (a lettered one, such as durability, runs only when named)."""
    return sorted((s for s in SCENARIOS.values() if s.key.isdigit()), key=lambda s: int(s.key))


def _known() -> list[Scenario]:
    """Every scenario joined: the suite's, then the lettered ones."""
    suite = _suite()
    return suite + sorted((s for s in SCENARIOS.values() if s not in suite), key=lambda s: s.key)


def main(argv: Sequence[str] | None = None, suite: Sequence[Scenario] | None = None) -> int:
    """Run the scenarios asked for (of ``suite``, else of the whole suite),
    print the table, write the JSON record."""
    whole = suite is None
    suite = _suite() if suite is None else list(suite)
    known = _known() if whole else suite
    args = _parser(known, whole).parse_args(argv)
    opts = Options(rounds=args.rounds, quick=args.quick)
    engine.use(args.engine, args.pg_url)
    keys = args.only if args.only is not None else [s.key for s in suite]
    if args.engine == "postgres":
        keys = [k for k in keys if k in ON_POSTGRES] or list(ON_POSTGRES)
    chosen = [s for s in known if s.key in keys]
    code = git_state()  # what is measured: the code as it was imported
    start = time.perf_counter()
    rows = [row for scenario in chosen for row in _run(scenario, opts)]
    rec = record(rows, opts, time.perf_counter() - start, code)
    print(_headline(rec))
    print_table(rows)
    path = args.json or _default_json(rec, chosen)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"JSON record: {path}")
    return 0


def _run(scenario: Scenario, opts: Options) -> list[Row]:
    """One scenario's rows, saying on stderr how long it took."""
    _progress(f"scenario {scenario.key}, {scenario.name}: running")
    start = time.perf_counter()
    rows = scenario.run(opts)
    _progress(f"scenario {scenario.key}, {scenario.name}: {time.perf_counter() - start:.0f} s")
    return rows


def _headline(rec: dict[str, Any]) -> str:
    """The line above the table: what was measured, where, how."""
    host = rec["machine"]
    return (
        f"commit {rec['commit']}{' (library modified)' if rec['dirty'] else ''},"
        f" Python {host['python']}, SQLite {host['sqlite']}, {host['cpus']} CPUs,"
        f" on {engine.engine()},"
        f" {rec['rounds']} rounds{', quick sizes' if rec['quick'] else ''}, {rec['seconds']:.0f} s"
    )


def _parser(suite: Sequence[Scenario], whole: bool) -> argparse.ArgumentParser:
    """The command line, for the whole suite or one scenario."""
    keys = [s.key for s in suite]
    parser = argparse.ArgumentParser(
        prog="python -m bench" if whole else None,
        description="Benchmarks of the batch runner and its store, each against its baselines.",
        epilog="scenarios: " + ", ".join(f"{s.key} {s.name}" for s in suite),
    )
    parser.add_argument(
        "--rounds", type=_positive, default=3, help="rounds of each measure (default 3)"
    )
    parser.add_argument(
        "--only",
        type=lambda text: _keys(text, keys),
        default=None,
        metavar="1,3,5",
        help="run these scenarios only",
    )
    parser.add_argument(
        "--engine",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="the store measured; postgres runs scenarios"
        f" {', '.join(ON_POSTGRES)} (default sqlite)",
    )
    parser.add_argument(
        "--pg-url",
        metavar="URL",
        help="with --engine postgres: a maintenance database of the server to measure on"
        " (default: a throwaway server started for the run)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, to try the suite out quickly"
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="where to write the JSON record (default: bench/results/<commit>.json,"
        " suffixed -dirty, -quick, -only-... as they apply)",
    )
    return parser


def _positive(text: str) -> int:
    """A number of rounds: at least one."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _keys(text: str, known: Sequence[str]) -> list[str]:
    """The scenario keys of ``--only``: comma-separated, each one of ``known``."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in known]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"choose among {', '.join(known)}; not {', '.join(unknown) or 'nothing'}"
        )
    return keys


def _default_json(rec: dict[str, Any], chosen: Sequence[Scenario]) -> Path:
    """Where the record goes unless ``--json`` says: named for what it holds."""
    name = rec["commit"] + ("-dirty" if rec["dirty"] else "") + ("-quick" if rec["quick"] else "")
    if engine.engine() != "sqlite":
        name += f"-{engine.engine()}"
    if [s.key for s in chosen] != [s.key for s in _suite()]:
        name += "-only-" + "-".join(s.key for s in chosen)
    return REPO / "bench" / "results" / f"{name}.json"


def _progress(text: str) -> None:
    """Say how the run goes, on stderr, apart from the table."""
    print(text, file=sys.stderr, flush=True)
