"""The command line: ``python -m batch demo|fetch|jobs|status|targets``.

- ``demo``: a local server and five jobs of two callers, shown as they run.
- ``fetch FILE|-``: fetch the URLs listed in FILE (one per line; blank lines
  and ``#`` comments skipped), as one job, or one job per host
  (``--per-host``: each host gets one request at a time, the hosts take
  turns). Results go to the store; ``--save DIR`` keeps the bodies.
- ``jobs``, ``status JOB``, ``targets JOB``: read a store, never write it.
  ``--json`` prints one JSON object per line (per job, per target), with the
  same keys every time. A job id may be shortened to any prefix that only
  that job's id starts with (tables show 12 characters).

The store is ``--db``, else ``$BATCH_DB``, else ``batch.sqlite3``. Exit
status: 0 success; 1 a job ended ``failed`` or ``partial`` (``status`` says
so too), or the command could not do its work (missing file, unusable store,
unknown job); 2 bad usage or input; 130 interrupted. Each error is one line on
stderr, starting ``batch: ``.

Ctrl-C during ``fetch`` or ``demo`` cancels every live job, waits for the
targets in flight to be stored, and exits 130; a second Ctrl-C exits at once
(what was in flight then stays pending).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import math
import os
import re
import signal
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn, TypeVar

import store

from . import demo, web
from .errors import BatchError, InvalidJob
from .model import Config, Target
from .progress import SHORT_ID, JobCaller, LiveRun, summary, table

__all__ = ["main"]

T = TypeVar("T")

JOB_STATUSES = ("queued", "running", "done", "failed", "partial", "cancelled")


class Failure(Exception):
    """The command could not do its work: exit 1, the message on stderr."""

    code = 1


class BadInput(Failure):
    """What the command was given cannot be used: exit 2."""

    code = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit status."""
    _log_in_one_line()
    args = _parser().parse_args(argv)
    try:
        code: int = args.command(args)
    except Failure as e:
        return _fail(str(e), e.code)
    except (store.StoreError, BatchError) as e:
        return _fail(str(e), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`| head`): nothing left to say, nor anyone to say it to.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        return _fail(f"{e.strerror or e}{where}", 1)
    return code


class _OneLine(logging.Formatter):
    """A log record as one line: its message and the exception's text, never a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text += f" ({type(exc).__name__}: {exc})"
        return "batch: " + " ".join(text.splitlines())


def _log_in_one_line() -> None:
    """Show what the library logs (a store refusing a write, a fetch that
    raised) as the other messages are: one line each on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine())
    for name in ("batch", "store"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.propagate = False


def _fail(message: str, code: int) -> int:
    _say(message)
    return code


def _say(message: str) -> None:
    print(f"batch: {message}", file=sys.stderr, flush=True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, not the usage and the error: every error here is one line."""
        self.exit(2, f"batch: {message} (see {self.prog} --help)\n")


def _parser() -> _Parser:
    db = _Parser(add_help=False)
    db.add_argument(
        "--db",
        default=os.environ.get("BATCH_DB") or "batch.sqlite3",
        help="the store: a file, or a postgresql:// URL (default: $BATCH_DB, else batch.sqlite3)",
    )
    as_json = _Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON lines for scripts")

    parser = _Parser(prog="python -m batch", description="Run and inspect batch jobs.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    p = commands.add_parser("demo", help="watch a local demo run (a few seconds)")
    p.add_argument(
        "--db", help="the store: a file, or a postgresql:// URL (default: a new file, kept)"
    )
    p.set_defaults(command=_demo)

    p = commands.add_parser("fetch", parents=[db, as_json], help="fetch the URLs listed in FILE")
    p.add_argument("file", metavar="FILE", help="URLs, one per line; - reads standard input")
    p.add_argument("--per-host", action="store_true", help="one job per host, taking turns")
    p.add_argument("--save", metavar="DIR", help="save each body in DIR (created if missing)")
    p.add_argument("--caller", type=_text, default=_user(), help="whose jobs (default: you)")
    defaults = Config()
    p.add_argument("--workers", type=_count, default=defaults.workers, help="fetches at once")
    p.add_argument(
        "--retry-wait",
        type=_seconds,
        default=defaults.retry_wait,
        metavar="S",
        help="wait before asking a busy host again (or what its Retry-After says)",
    )
    p.add_argument(
        "--retry-for",
        type=_seconds,
        default=defaults.retry_for,
        metavar="S",
        help="give up on a URL still busy after this long",
    )
    p.add_argument(
        "--max-bytes",
        type=_bytes,
        default=defaults.max_bytes,
        help="stored bytes past which the oldest ended jobs are evicted",
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=30.0,
        metavar="S",
        help="longest wait to connect, or for more of an answer",
    )
    p.set_defaults(command=_fetch)

    p = commands.add_parser("jobs", parents=[db, as_json], help="list the stored jobs")
    p.add_argument("--caller", type=_text, help="only this caller's jobs")
    p.add_argument("--status", choices=JOB_STATUSES, help="only jobs in this status")
    p.set_defaults(command=_jobs)

    p = commands.add_parser("status", parents=[db, as_json], help="one job's summary")
    p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")
    p.set_defaults(command=_status)

    p = commands.add_parser("targets", parents=[db, as_json], help="one job's targets")
    p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")
    p.set_defaults(command=_targets)
    return parser


# -- argument types ----------------------------------------------------------------


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


_count = _typed(int, "a whole number >= 1", lambda n: n >= 1)
_bytes = _typed(int, "a whole number of bytes >= 0", lambda n: n >= 0)
_seconds = _typed(float, "seconds >= 0", lambda s: math.isfinite(s) and s >= 0)
_positive_seconds = _typed(float, "seconds > 0", lambda s: math.isfinite(s) and s > 0)
_text = _typed(str, "printable text", lambda t: bool(t.strip()) and t.isprintable())


def _user() -> str:
    """Who runs this, for ``--caller``: the login name, else ``batch``."""
    try:
        return getpass.getuser() or "batch"
    except (OSError, KeyError):  # no name for this uid (a bare container)
        return "batch"


# -- demo and fetch -----------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    path = args.db or os.path.join(tempfile.mkdtemp(prefix="batch-demo-"), "jobs.sqlite3")
    site = demo.Site()
    fetch = web.Fetcher(timeout=10.0, proxies={})  # the server is local: never via a proxy
    with _sigint() as interrupted, demo.serving(site) as base, store.open(path) as db:
        with LiveRun(db, fetch, demo.CONFIG, sys.stdout) as run:
            jobs = {
                name: run.submit(caller, name, [base + p for p in paths])
                for caller, name, paths in demo.JOBS
            }
            with demo.cancelling(site, run, jobs[demo.CANCEL_JOB]):
                stopped = _follow(run, interrupted)
        print()
        summary(sys.stdout, run)
    print(site.report())
    print(f"store: {path}")
    return 130 if stopped else 0


def _fetch(args: argparse.Namespace) -> int:
    urls = _read_urls(args.file)
    jobs = _by_host(urls) if args.per_host else [(_label(args.file), urls)]
    config = Config(
        workers=args.workers,
        retry_wait=args.retry_wait,
        retry_for=args.retry_for,
        max_bytes=args.max_bytes,
        max_targets=max(Config().max_targets, *(len(refs) for _, refs in jobs)),
    )
    fetch = web.Fetcher(timeout=args.timeout, save_dir=_save_dir(args.save))
    out = sys.stderr if args.json else sys.stdout
    with _sigint() as interrupted, store.open(args.db) as db:
        with LiveRun(db, fetch, config, out, on_target=_print_json if args.json else None) as run:
            for label, refs in jobs:
                run.submit(args.caller, label, refs)
            stopped = _follow(run, interrupted)
        if not args.json:
            print()
            summary(sys.stdout, run)
            print(f"store: {db.path}")
    if stopped:
        return 130
    return 1 if any(run.status(job) in ("failed", "partial") for job in run.jobs) else 0


@contextlib.contextmanager
def _sigint() -> Iterator[Callable[[], bool]]:
    """Turn the first Ctrl-C into a flag the block looks at (it can then stop
    cleanly); a second one raises ``KeyboardInterrupt`` as usual. Yields the
    flag's getter. An ignored SIGINT (a background job) stays ignored."""
    seen = False

    def first(signum: int, frame: FrameType | None) -> None:
        # A handler must not take a lock its thread may hold (Event.set would):
        # it only sets a flag, which the loop that follows the jobs reads.
        nonlocal seen
        seen = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        yield lambda: False
        return
    signal.signal(signal.SIGINT, first)
    try:
        yield lambda: seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _follow(run: LiveRun, interrupted: Callable[[], bool]) -> bool:
    """Follow ``run`` to its end; if interrupted first, cancel its live jobs,
    say so, and return True."""
    if not run.follow(interrupted):
        return False
    cancelled = run.cancel()
    inflight = run.runner.statistics().inflight
    _say(f"interrupted: cancelled {cancelled} job(s); storing the {inflight} target(s) in flight")
    return True


def _print_json(job: JobCaller, target: store.TargetRow) -> None:
    line: dict[str, Any] = {"url": target.ref, "status": target.status, "job": job.job}
    if target.result is not None:
        line["result"] = json.loads(target.result)
    else:
        line.update(error=target.error, hint=target.hint)
    print(json.dumps(line), flush=True)


def _read_urls(source: str) -> list[str]:
    """The URLs listed in ``source`` (a file, or ``-`` for standard input)."""
    name = _label(source)
    try:
        if source == "-":
            text = sys.stdin.buffer.read().decode()
        else:
            with open(source, "rb") as f:
                text = f.read().decode()
    except UnicodeDecodeError as e:
        raise BadInput(f"{name}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise Failure(f"cannot read {source}: {e.strerror}") from None
    urls = [
        _url(line, f"{name} line {n}")
        for n, raw in enumerate(text.split("\n"), 1)
        if (line := raw.strip()) and not line.startswith("#")
    ]
    if not urls:
        raise BadInput(f"{name}: no URLs in it")
    return urls


def _url(text: str, where: str) -> str:
    """``text``, checked to be a URL a fetch can use; ``BadInput`` naming ``where`` if not."""
    shown = text if len(text) <= 80 else text[:77] + "..."
    if re.search(r"[\x00-\x20\x7f]", text):
        raise BadInput(f"{where}: spaces or control characters in {shown!r}")
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 (parsing the port is what checks it)
        Target(text)
    except (ValueError, InvalidJob) as e:
        raise BadInput(f"{where}: not a usable URL ({e}): {shown!r}") from None
    if parts.scheme not in web.SCHEMES:
        raise BadInput(f"{where}: not an http, https or file URL: {shown!r}")
    if parts.scheme != "file" and not parts.hostname:
        raise BadInput(f"{where}: no host in {shown!r}")
    return text


def _by_host(urls: list[str]) -> list[tuple[str, list[str]]]:
    """The URLs grouped by host name (any port; ``file`` URLs apart), hosts
    in first-seen order."""
    hosts: dict[str, list[str]] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        host = "file" if parts.scheme == "file" else parts.hostname or ""
        hosts.setdefault(host, []).append(url)
    return list(hosts.items())


def _label(source: str) -> str:
    return "stdin" if source == "-" else os.path.basename(source) or source


def _save_dir(path: str | None) -> str | None:
    """``--save DIR``, created if missing."""
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise BadInput(f"--save: {path!r} exists and is not a directory") from None
    except OSError as e:
        raise Failure(f"--save: cannot create {path!r}: {e.strerror}") from None
    return path


# -- jobs, status, targets ------------------------------------------------------


def _jobs(args: argparse.Namespace) -> int:
    with store.open(args.db, readonly=True) as db:
        jobs = db.list_jobs(owner=args.caller, status=args.status)
    if args.json:
        for job in jobs:
            print(json.dumps(_job_json(job)))
        return 0
    if not jobs:
        print("no jobs")
        return 0
    headers = ("job", "caller", "status", "done", "failed", "pending", "bytes")
    for line in table((*headers, "created", "updated"), [_job_cells(job) for job in jobs]):
        print(line)
    return 0


def _status(args: argparse.Namespace) -> int:
    with store.open(args.db, readonly=True) as db:
        job = _summary(_find(db, args.job))
    if args.json:
        print(json.dumps(_job_json(job)))
    else:
        fields = {
            "job": job.id,
            "caller": job.owner,
            "status": job.status,
            "targets": f"{job.done} done, {job.failed} failed, {job.pending} pending",
            "bytes": _size(job.nbytes),
            "created": _when(job.created_at),
            "updated": f"{_when(job.updated_at)} ({job.updated_at - job.created_at:.1f}s later)",
        }
        for key, value in fields.items():
            print(f"{key:<8} {value}")
    return 1 if job.status in ("failed", "partial") else 0


def _targets(args: argparse.Namespace) -> int:
    with store.open(args.db, readonly=True) as db:
        job = _find(db, args.job)
    if args.json:
        for t in job.targets:
            result = None if t.result is None else json.loads(t.result)
            size = None if t.result is None else len(t.result.encode())
            print(
                json.dumps(
                    {
                        "pos": t.pos,
                        "ref": t.ref,
                        "status": t.status,
                        "error": t.error,
                        "hint": t.hint,
                        "result": result,
                        "result_bytes": size,
                    }
                )
            )
        return 0
    rows = [
        (
            t.pos,
            t.status,
            t.ref,
            t.error and (f"{t.error} ({t.hint})" if t.hint else t.error),
            None if t.result is None else _size(len(t.result.encode())),
        )
        for t in job.targets
    ]
    for line in table(("pos", "status", "ref", "error (hint)", "result"), rows):
        print(line)
    return 0


def _find(db: store.Store, given: str) -> store.JobRow:
    """The job whose id is ``given``, or the one job whose id starts with it."""
    prefix = given.strip().lower()
    if not prefix or not prefix.isascii():
        raise Failure(f"no job {given!r} in {db.path}")
    job = db.find_job(prefix)
    if job is None:
        ids = [s.id for s in db.list_jobs() if s.id.startswith(prefix)]
        if len(ids) > 1:
            raise Failure(f"{given!r} is the start of {len(ids)} job ids: give more of it")
        job = db.find_job(ids[0]) if ids else None
    if job is None:
        raise Failure(f"no job {given!r} in {db.path}")
    return job


def _summary(job: store.JobRow) -> store.JobSummary:
    """``job`` without its targets, counted instead."""
    count = [t.status for t in job.targets].count
    return store.JobSummary(
        job.id,
        job.owner,
        job.status,
        job.created_at,
        job.updated_at,
        job.nbytes,
        count("done"),
        count("failed"),
        count("pending"),
    )


def _job_json(job: store.JobSummary) -> dict[str, Any]:
    return {
        "id": job.id,
        "caller": job.owner,
        "status": job.status,
        "done": job.done,
        "failed": job.failed,
        "pending": job.pending,
        "bytes": job.nbytes,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


def _job_cells(job: store.JobSummary) -> tuple[str, str, str, int, int, int, str, str, str]:
    return (
        job.id[:SHORT_ID],
        job.owner,
        job.status,
        job.done,
        job.failed,
        job.pending,
        _size(job.nbytes),
        _when(job.created_at),
        _when(job.updated_at),
    )


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _size(n: int) -> str:
    """``n`` bytes, for people: ``512 B``, ``1.5 KiB``, ``3.0 MiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, power = float(n), 0
    while value >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{n} B" if power == 0 else f"{value:.1f} {units[power]}"
