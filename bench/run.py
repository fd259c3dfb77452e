"""The benchmark suite: each scenario measures our code and its baselines in
the same run, taking turns round by round, and the run ends with one table
and a JSON record.

    python -m bench [--rounds N] [--only 1,3,5] [--quick] [--json PATH]
    python bench/run.py ...            (the same)
    python -m bench.latency ...        (one scenario alone, same options)

Scenarios: 1 throughput, 2 many live jobs, 3 latency, 4 the store at size,
5 the run queue, 6 memory, 7 many I/O-bound workers, 8 the command line,
9 a mixed stream of runs (what ``reserve_after`` costs and buys).
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

if __package__ in (None, ""):  # python bench/run.py: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    command,
    engine,
    iobound,
    latency,
    live,
    memory,
    runs,
    scaleout,
    size,
    starve,
    throughput,
)
from bench.measure import REPO, Options, Row, Scenario, git_state, print_table, record

__all__ = ["SUITE", "main"]

#: The scenarios measured on PostgreSQL too (``--engine postgres``).
ON_POSTGRES = ("1", "2", "5", "10")

SUITE: tuple[Scenario, ...] = (
    throughput.SCENARIO,
    live.SCENARIO,
    latency.SCENARIO,
    size.SCENARIO,
    runs.SCENARIO,
    memory.SCENARIO,
    iobound.SCENARIO,
    command.SCENARIO,
    starve.SCENARIO,
    scaleout.SCENARIO,
)


def main(argv: Sequence[str] | None = None, suite: Sequence[Scenario] = SUITE) -> int:
    """Run the scenarios asked for, print the table, write the JSON record."""
    args = _parser(suite).parse_args(argv)
    opts = Options(rounds=args.rounds, quick=args.quick)
    engine.use(args.engine, args.pg_url)
    keys = args.only if args.only is not None else [s.key for s in suite]
    if args.engine == "postgres":
        keys = [k for k in keys if k in ON_POSTGRES] or list(ON_POSTGRES)
    chosen = [s for s in suite if s.key in keys]
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


def _parser(suite: Sequence[Scenario]) -> argparse.ArgumentParser:
    """The command line, for the whole suite or one scenario."""
    keys = [s.key for s in suite]
    parser = argparse.ArgumentParser(
        prog="python -m bench" if list(suite) == list(SUITE) else None,
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
    if [s.key for s in chosen] != [s.key for s in SUITE]:
        name += "-only-" + "-".join(s.key for s in chosen)
    return REPO / "bench" / "results" / f"{name}.json"


def _progress(text: str) -> None:
    """Say how the run goes, on stderr, apart from the table."""
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
