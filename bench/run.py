"""``python -m bench``: the whole suite (see :mod:`bench.suite`).

    python -m bench [--rounds N] [--only 1,3,5] [--quick] [--json PATH]
    python bench/run.py ...            (the same)
    python -m bench.latency ...        (one scenario alone, same options)

Scenarios: 1 throughput, 2 many live jobs, 3 latency, 4 the store at size,
5 the run queue, 6 memory, 7 many I/O-bound workers, 8 the command line,
9 a mixed stream of runs (what ``reserve_after`` costs and buys), 10
runner processes on one database, 11 pacing against a rate-limited host,
12 watching, 13 what queue users expect (keys, later jobs, pruning), 14
a network round trip away; D
durability (``synchronous``), only when named.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # python bench/run.py: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Each scenario joins the suite's registry as it is imported.
from bench import (  # noqa: F401
    command,
    durability,
    iobound,
    latency,
    live,
    memory,
    network,
    pacing,
    queueing,
    runs,
    scaleout,
    size,
    starve,
    throughput,
    watching,
)
from bench.suite import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
