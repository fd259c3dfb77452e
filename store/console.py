"""What the two command lines (``python -m batch``, ``python -m store``)
share: their options and usage errors, how a command's output is printed,
exit statuses, one-line errors and logs, signals, and the formatting of
tables, times and sizes.

A command is a handler that takes the parsed arguments and returns an
:class:`Output`: the data printed as JSON with ``--json``, the text
printed otherwise, and the exit status. :func:`run` parses, calls, prints
and maps every error to its status, the same way for both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, TypeVar

from .errors import NotFound, StoreError

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "SHORT_ID",
    "BadInput",
    "Failure",
    "Missing",
    "Output",
    "Parser",
    "Stop",
    "about",
    "add_db",
    "add_version",
    "bytes_size",
    "count",
    "duration",
    "moment",
    "run",
    "seconds",
    "seconds_or_never",
    "size",
    "stopping",
    "table",
]

#: Characters of an id shown in tables and messages (any unique prefix
#: finds what it names).
SHORT_ID = 12

EXIT_OK = 0
#: A job or run ended failed or partial, or the command could not do its work.
EXIT_FAILED = 1
EXIT_USAGE = 2
#: The job or run asked about does not exist.
EXIT_NOT_FOUND = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

#: What a table shows in an empty cell.
EMPTY = "-"

#: The store both command lines use unless ``--db`` names one: ``$BATCH_DB``,
#: else this file in the current directory.
DB_ENV = "BATCH_DB"
DEFAULT_DB = "batch.sqlite3"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Output:
    """What a command prints: ``data`` as JSON with ``--json`` (a list: one
    object per line; anything else: one line; None: nothing), else
    ``text`` (nothing if empty); and the exit status."""

    data: Any
    text: str
    status: int = EXIT_OK


class Failure(Exception):
    """The command could not do its work: its message on stderr, exit 1."""

    status = EXIT_FAILED


class BadInput(Failure):
    """What the command was given cannot be used: exit 2."""

    status = EXIT_USAGE


class Missing(Failure):
    """The job or run asked about does not exist: exit 3."""

    status = EXIT_NOT_FOUND


class Stop(BaseException):
    """SIGTERM came: the command stops as after Ctrl-C, exit 143."""


# -- parsing -----------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr."""

    def error(self, message: str) -> NoReturn:
        """Say what is wrong in one line and exit with status 2."""
        self.exit(EXIT_USAGE, f"{_name(self.prog)}: {message} (see {self.prog} --help)\n")


def _name(prog: str) -> str:
    """The name errors start with: ``batch`` for ``python -m batch fetch``,
    ``batch-runner`` for ``batch-runner fetch``."""
    words = prog.split()
    return words[2] if words[:2] == ["python", "-m"] and len(words) > 2 else words[0]


def about(handler: Callable[..., object]) -> str:
    """What a command does, for its help: the first paragraph of its
    function's docstring, on one line."""
    paragraph = (handler.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def add_version(parser: argparse.ArgumentParser) -> None:
    """Add ``--version``: the name and version of the install."""
    from . import __version__  # noqa: PLC0415 - the package imports this module

    parser.add_argument("--version", action="version", version=f"batch-store {__version__}")


def add_db(
    parser: argparse.ArgumentParser, older_env: str | None = None
) -> Callable[[argparse.ArgumentParser], None]:
    """Add ``--db`` to ``parser`` (default: ``$BATCH_DB``, else ``older_env``
    if named and set, else ``batch.sqlite3``), and return what adds it to a
    subcommand too, so that it may come before or after the subcommand's
    name (there, it overrides only when given)."""
    fallback = os.environ.get(DB_ENV) or (older_env and os.environ.get(older_env)) or DEFAULT_DB
    helps = f"the store: a file, or a postgresql:// URL (default: ${DB_ENV}, else {DEFAULT_DB})"
    parser.add_argument("--db", metavar="PATH|URL", default=fallback, help=helps)

    def also(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--db", metavar="PATH|URL", default=argparse.SUPPRESS, help=helps)

    return also


def _typed(kind: Callable[[str], T], what: str, ok: Callable[[T], bool]) -> Callable[[str], T]:
    """An argparse ``type``: ``kind(text)`` if that works and is ``ok``, else
    an error saying ``what`` was expected."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            pass
        else:
            if ok(value):
                return value
        raise argparse.ArgumentTypeError(f"expected {what}, not {text!r}")

    return parse


count = _typed(int, "a whole number >= 1", lambda n: n >= 1)
seconds = _typed(float, "a number of seconds >= 0", lambda s: math.isfinite(s) and s >= 0)
seconds_or_never = _typed(
    lambda text: None if text.strip().lower() == "never" else float(text),
    "a number of seconds >= 0, or never",
    lambda s: s is None or (math.isfinite(s) and s >= 0),
)

_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_IEC = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def _bytes(text: str) -> int:
    """``123``, ``64KiB``, ``1MiB``, ``2.5GB``, ``10M`` (any case) as bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None:
        raise ValueError(text)
    unit = m.group(2).lower()
    factor = _IEC.get(unit) or _UNITS.get(unit.removesuffix("b") if unit != "b" else unit)
    if factor is None:
        raise ValueError(text)
    return int(float(m.group(1)) * factor)


bytes_size = _typed(_bytes, "a size such as 1048576, 512KiB or 1MiB", lambda n: n >= 0)


# -- formatting ----------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[object]], empty: str = "") -> str:
    """``rows`` as aligned columns under ``header``: numbers to the right
    (floats with one decimal), the rest to the left, None as ``-``. With no
    row, ``empty`` (``"no jobs"``, say) instead of a bare header."""
    values = [list(row) for row in rows]
    if not values and empty:
        return empty
    cells = [[_cell(v) for v in row] for row in values]
    right = [any(isinstance(row[i], int | float) for row in values) for i in range(len(header))]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(header)]

    def line(items: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(items, widths, right, strict=True)
        ).rstrip()

    return "\n".join([line(header), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return EMPTY if value is None else str(value)


def duration(secs: float) -> str:
    """A span of time as people read it: ``12s``, ``3m04s``, ``2h01m``,
    ``3d04h``. A negative span (clocks that disagree) reads ``0s``."""
    s = max(0, int(secs))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return "{}m{:02d}s".format(*divmod(s, 60))
    if s < 86400:
        return "{}h{:02d}m".format(*divmod(s // 60, 60))
    return "{}d{:02d}h".format(*divmod(s // 3600, 24))


def moment(epoch: float | None) -> str:
    """A time, local, to the second; ``-`` for one that has not happened."""
    if epoch is None:
        return EMPTY
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def size(n: int) -> str:
    """``n`` bytes, for people: ``512 B``, ``1.5 KiB``, ``3.0 MiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, power = float(n), 0
    while value >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{n} B" if power == 0 else f"{value:.1f} {units[power]}"


# -- running ---------------------------------------------------------------------------


class _OneLine(logging.Formatter):
    """A log record as one line: its message and the exception's text, never a traceback."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" ({type(exc).__name__}: {exc})"
        return f"{self._name}: " + " ".join(text.splitlines())


@contextlib.contextmanager
def _brief_logs(name: str) -> Iterator[None]:
    """While inside, what the libraries log (a store refusing a write, a
    fetch that raised) reaches stderr as the other messages do: one line."""
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_OneLine(name))
    loggers = [logging.getLogger(n) for n in ("batch", "store")]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, (propagate, _) in zip(loggers, saved, strict=True):
            logger.removeHandler(handler)
            logger.propagate = propagate


@contextlib.contextmanager
def stopping() -> Iterator[Callable[[], str | None]]:
    """While inside, the first Ctrl-C or SIGTERM only sets a flag that a
    long-running command looks at (to stop cleanly: cancel, store what is
    in flight); a second raises as usual. Yields the flag's getter: None,
    ``"interrupted"`` or ``"terminated"``. A signal ignored when the block
    began (a background job's SIGINT) stays ignored."""
    seen: list[str] = []

    def first(signum: int, frame: FrameType | None) -> None:
        # A handler must not take a lock its thread may hold (Event.set would):
        # it only notes the signal, which the command's loop reads.
        seen.append("terminated" if signum == signal.SIGTERM else "interrupted")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminate)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(signum, first)
    try:
        yield lambda: seen[0] if seen else None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Stop


def _say(name: str, message: str) -> None:
    print(f"{name}: {message}", file=sys.stderr, flush=True)


def emit(out: Output, as_json: bool) -> None:
    """Print a command's output: JSON (one object per line), or its text."""
    if as_json:
        if out.data is None:
            return
        items = out.data if isinstance(out.data, list) else [out.data]
        text = "".join(json.dumps(item) + "\n" for item in items)
    else:
        text = out.text + "\n" if out.text else ""
    sys.stdout.write(text)
    sys.stdout.flush()


def run(
    name: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    not_found: tuple[type[BaseException], ...] = (),
) -> int:
    """Parse ``argv``, call the command's handler, print its output; return
    the exit status. Every error is one line on stderr starting ``name:``;
    ``not_found`` (with the store's ``NotFound``) exit 3; Ctrl-C 130;
    SIGTERM 143; a reader that went away (``| head``) ends the command
    quietly, exit 0."""
    args = parser.parse_args(argv)
    missing: tuple[type[BaseException], ...] = (NotFound, *not_found)
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        with _brief_logs(name):
            out: Output = args.handler(args)
            emit(out, getattr(args, "json", False))
    except Failure as e:
        _say(name, str(e))
        return e.status
    except missing as e:
        _say(name, str(e))
        return EXIT_NOT_FOUND
    except StoreError as e:
        _say(name, str(e))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _say(name, "interrupted")
        return EXIT_INTERRUPTED
    except Stop:
        _say(name, "terminated")
        return EXIT_TERMINATED
    except BrokenPipeError:
        # The reader went away (`| head`): what it wanted it has; keep Python
        # from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        _say(name, f"{e.strerror or e}{where}")
        return EXIT_FAILED
    finally:
        if previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)
    return out.status
