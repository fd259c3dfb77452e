"""What every scenario shares: rounds, statistics, goals, the printed table and
the JSON record.

A scenario returns rows: a :class:`Figure` (our code's samples, often with a
baseline's samples from the same rounds, and the goal it is held to) or a
:class:`Skipped` (a baseline that could not run here, and why).
"""

from __future__ import annotations

import datetime
import operator
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

__all__ = [
    "REPO",
    "Figure",
    "Goal",
    "Options",
    "Row",
    "Scenario",
    "Series",
    "Skipped",
    "Unit",
    "alternate",
    "git_state",
    "percentile",
    "print_table",
    "record",
]

T = TypeVar("T")

#: Units a figure is given in: a rate, durations, a size, a plain count, a
#: share, round trips to the server.
Unit = Literal["/s", "ms", "us", "s", "B", "n", "%", "rt"]

#: The checkout the suite runs from.
REPO = Path(__file__).resolve().parent.parent

_OPS: Mapping[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class Options:
    """How the suite was asked to run: ``rounds`` per scenario; ``quick`` for
    small sizes while developing (the figures then mean little)."""

    rounds: int
    quick: bool


@dataclass(frozen=True, slots=True)
class Goal:
    """A target: ``stat`` of a figure compared with ``bound``. ``stat`` is the
    median, p99 or max of our samples, or ``ratio``: our median over the
    baseline's."""

    stat: Literal["median", "p99", "max", "ratio"]
    op: Literal["<", "<=", ">="]
    bound: float

    def text(self, unit: Unit) -> str:
        """The goal as the table prints it, e.g. ``>= 1x`` or ``p99 < 5 ms``."""
        if self.stat == "ratio":
            return f"{self.op} {self.bound:g}x"
        prefix = "" if self.stat == "median" else f"{self.stat} "
        return f"{prefix}{self.op} {fmt(self.bound, unit)}"


@dataclass(frozen=True, slots=True)
class Series:
    """Samples of one thing measured, under a name that says what it is."""

    name: str
    samples: Sequence[float]

    @property
    def median(self) -> float:
        """The median of the samples."""
        return statistics.median(self.samples)

    def summary(self) -> dict[str, Any]:
        """The series for the JSON record."""
        return {
            "name": self.name,
            "median": self.median,
            "min": min(self.samples),
            "max": max(self.samples),
            "p99": percentile(self.samples, 99),
            "samples": list(self.samples),
        }


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure: ``ours`` against ``baseline`` (measured in the
    same rounds), in ``unit``, held to ``goal``. ``spread`` says what the table
    shows beside the median: the range over rounds, or the p99 of a
    latency's many samples."""

    scenario: str
    what: str
    unit: Unit
    ours: Series
    baseline: Series | None = None
    goal: Goal | None = None
    spread: Literal["range", "p99"] = "range"

    @property
    def ratio(self) -> float | None:
        """Our median over the baseline's, when there is a baseline and both
        are above zero (a ratio of bytes retained, say, can be meaningless)."""
        if self.baseline is None or min(self.ours.median, self.baseline.median) <= 0:
            return None
        return self.ours.median / self.baseline.median

    @property
    def met(self) -> bool | None:
        """Whether the goal is met; None when there is no goal."""
        if self.goal is None:
            return None
        value = {
            "median": self.ours.median,
            "p99": percentile(self.ours.samples, 99),
            "max": max(self.ours.samples),
            "ratio": self.ratio,
        }[self.goal.stat]
        return value is not None and _OPS[self.goal.op](value, self.goal.bound)

    def cells(self) -> list[str]:
        """The table's cells for this figure, after the scenario and what."""
        samples = self.ours.samples
        if self.spread == "p99":
            spread = f"p99 {fmt(percentile(samples, 99), self.unit)}"
        else:
            spread = f"{fmt(min(samples), self.unit, bare=True)}..{fmt(max(samples), self.unit)}"
        ratio = self.ratio
        return [
            fmt(self.ours.median, self.unit),
            spread,
            "-" if self.baseline is None else fmt(self.baseline.median, self.unit),
            "-" if ratio is None else f"{ratio:.{2 if ratio < 10 else 0}f}x",
            "-" if self.goal is None else self.goal.text(self.unit),
            {None: "-", True: "yes", False: "NO"}[self.met],
        ]

    def summary(self) -> dict[str, Any]:
        """The figure for the JSON record."""
        return {
            "scenario": self.scenario,
            "what": self.what,
            "unit": self.unit,
            "ours": self.ours.summary(),
            "baseline": None if self.baseline is None else self.baseline.summary(),
            "ratio": self.ratio,
            "target": None
            if self.goal is None
            else {
                "text": self.goal.text(self.unit),
                "stat": self.goal.stat,
                "op": self.goal.op,
                "bound": self.goal.bound,
            },
            "met": self.met,
        }


@dataclass(frozen=True, slots=True)
class Skipped:
    """A figure that could not be measured here, and why."""

    scenario: str
    what: str
    why: str

    def summary(self) -> dict[str, Any]:
        """The skipped figure for the JSON record."""
        return {"scenario": self.scenario, "what": self.what, "skipped": self.why}


Row = Figure | Skipped


@dataclass(frozen=True, slots=True)
class Scenario:
    """A numbered scenario of the suite: ``run`` measures it and returns its rows."""

    key: str
    name: str
    run: Callable[[Options], list[Row]]


def alternate(rounds: int, measures: Mapping[str, Callable[[], T]]) -> dict[str, list[T]]:
    """Run every measure once per round, round after round, and return each
    one's results in round order.

    Taking turns spreads a noisy spell of the machine over our code and its
    baseline alike; the order is reversed every other round so that neither
    always goes first (warm caches, a checkpoint left behind).
    """
    results: dict[str, list[T]] = {name: [] for name in measures}
    order = list(measures)
    for i in range(rounds):
        for name in order if i % 2 == 0 else reversed(order):
            results[name].append(measures[name]())
    return results


def percentile(samples: Sequence[float], pct: int) -> float:
    """The ``pct``-th percentile of ``samples`` (linear between the nearest two)."""
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[pct - 1]


def fmt(value: float, unit: Unit, *, bare: bool = False) -> str:
    """``value`` in ``unit``, short enough for a table cell; ``bare`` leaves the
    unit off (the low end of a range). Bytes from 10 KiB on are in KiB,
    from 10 MiB on in MiB."""
    suffix = unit if unit in ("/s", "%") else "" if unit == "n" else f" {unit}"
    if unit == "B" and abs(value) >= 10 * 1024 * 1024:
        value, suffix = value / (1024 * 1024), " MiB"
    elif unit == "B" and abs(value) >= 10 * 1024:
        value, suffix = value / 1024, " KiB"
    if unit in ("%", "rt"):
        text = f"{value:.1f}"
    elif unit in ("/s", "s", "B", "n") or abs(value) >= 100:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.3g}"
    return text if bare else text + suffix


# -- the table ----------------------------------------------------------------

_HEADER = ("sc", "what", "median", "min..max / p99", "baseline", "ratio", "target", "met")
_WIDTHS = (2, 34, 10, 16, 10, 6, 12, 3)


def print_table(rows: Sequence[Row], out: Any = sys.stdout) -> None:
    """One line per row, 100 columns wide; a skipped figure says why."""
    print(_line(_HEADER), file=out)
    print("-" * (sum(_WIDTHS) + len(_WIDTHS) - 1), file=out)
    for row in rows:
        if isinstance(row, Skipped):
            print(_line((row.scenario, row.what)) + f" skipped: {row.why}", file=out)
        else:
            print(_line((row.scenario, row.what, *row.cells())), file=out)


def _line(cells: Sequence[str]) -> str:
    """The cells padded to their columns; what overflows ends in ``~``."""
    parts = []
    for i, (cell, width) in enumerate(zip(cells, _WIDTHS, strict=False)):
        text = cell if len(cell) <= width else cell[: width - 1] + "~"
        parts.append(text.ljust(width) if i < 2 else text.rjust(width))
    return " ".join(parts)


# -- the record ----------------------------------------------------------------


def record(
    rows: Sequence[Row], opts: Options, seconds: float, code: tuple[str, bool]
) -> dict[str, Any]:
    """The JSON record of a run: the machine, the code measured (``code``, from
    :func:`git_state` when the run began), the options, every row."""
    commit, dirty = code
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
        },
        "rounds": opts.rounds,
        "quick": opts.quick,
        "seconds": round(seconds, 1),
        "figures": [row.summary() for row in rows],
    }


def git_state() -> tuple[str, bool]:
    """The short commit of the checkout, and whether the library's code
    (``batch``, ``store``) differs from it; ``("unknown", False)`` without git."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", "--", "batch", "store"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return commit, dirty


def _git(*args: str) -> str:
    """What git says, run in the checkout."""
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
