"""The command line: ``python -m batch demo|fetch|work|jobs|status|targets|cancel|wait|requeue``
and more (also installed as ``batch-runner``).

- ``demo``: a local server and five jobs of two callers, shown as they run.
- ``fetch FILE|-``: fetch the URLs listed in FILE (one per line; blank lines
  and ``#`` comments skipped). One job per host by default: each host gets
  one request at a time, and the hosts take turns on the workers;
  ``--per-host N`` deals each host's URLs among N jobs (N at once per
  host); ``--in-order`` makes the list one job, fetched in its order.
  Results go to the store; ``--save DIR`` keeps the bodies.
- ``work --fetch MODULE:FUNCTION``: the worker process of a deployment: it
  runs the store's jobs (those ``batch.Client`` submits) until SIGTERM or
  Ctrl-C, which drain it and exit 0 (``batch.cli.work``).
- ``requeue JOB``: fetch again, as a new job, the URLs of a job that did not
  end done (its failures, and what a cancelled job left pending).
- ``jobs``, ``status JOB``, ``targets JOB``, ``wait JOB``: read a store,
  never write it. ``cancel JOB``: cancel a live job, whichever process runs
  it. A job id may be shortened to any prefix only that job's id starts
  with (tables show 12 characters).

The store is ``--db`` (before or after the command), else ``$BATCH_DB``,
else ``batch.sqlite3``. ``--json``: one JSON object per line (see
``store.console``). Exit status: 0 success; 1 a job ended ``failed`` or
``partial``, or the command could not do its work; 2 bad usage or input;
3 no such job; 130 interrupted (Ctrl-C); 143 terminated (SIGTERM). Each
error is one line on stderr.

Ctrl-C or SIGTERM during ``fetch``, ``requeue`` or ``demo`` cancels every
live job, stores the targets in flight (an unfinished download leaves no
file behind), and exits; a second one exits at once (what was in flight
then stays pending, for the next runner). A reader that goes away (``fetch
--json | head``) stops a fetch the same way, quietly.
"""

from __future__ import annotations

import argparse
import getpass
import math
from collections.abc import Callable, Sequence
from typing import Any

from store.console import (
    Output,
    Parser,
    about,
    add_db,
    add_version,
    bytes_size,
    count,
    run,
    seconds,
)

from .. import web
from ..errors import JobNotFound
from ..model import Config
from ..states import TERMINAL_JOB, JobStatus
from . import work
from .running import _demo, _fetch, _requeue
from .views import (
    _cancel,
    _explain,
    _jobs,
    _pause,
    _prune,
    _serve,
    _status,
    _targets,
    _unpause,
    _upstreams,
    _wait,
)

__all__ = ["console_main", "main"]


def main(argv: Sequence[str] | None = None, prog: str = "python -m batch") -> int:
    """Run one command; return the exit status."""
    return run(_name(prog), build_parser(prog), argv, not_found=(JobNotFound,))


def _name(prog: str) -> str:
    """What the command's messages start with: ``batch-runner``, or
    ``batch`` under ``python -m batch``."""
    return "batch" if prog.startswith("python") else prog


def console_main() -> int:
    """The ``batch-runner`` command."""
    return main(prog="batch-runner")


def build_parser(prog: str = "python -m batch") -> Parser:
    """The parser of every command; each command's function is its ``handler``."""
    parser = Parser(prog=prog, description="Run and inspect batch jobs.")
    parser.set_defaults(name=_name(prog))
    also_db = add_db(parser)
    add_version(parser)
    as_json = Parser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON, one object per line")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], Output], **kw: Any) -> Parser:
        said = about(handler)
        sub: Parser = commands.add_parser(name, help=said, description=said, **kw)
        sub.set_defaults(handler=handler)
        also_db(sub)
        return sub

    p = add("demo", _demo)
    p.set_defaults(db=None)  # a new file, kept, unless --db names one

    p = add("fetch", _fetch, parents=[as_json])
    p.add_argument("file", metavar="FILE", help="URLs, one per line; - reads standard input")
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--per-host",
        type=count,
        nargs="?",
        const=1,
        default=1,
        metavar="N",
        help="N requests at once per host (its URLs dealt among N jobs; default 1)",
    )
    group.add_argument(
        "--in-order", action="store_true", help="one job: the URLs one at a time, in order"
    )
    _fetch_options(p)

    work.add_options(add("work", work.work))

    p = add("requeue", _requeue, parents=[as_json])
    p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")
    _fetch_options(p)

    p = add("jobs", _jobs, parents=[as_json])
    p.add_argument("--caller", type=_text, help="only this caller's jobs")
    p.add_argument("--status", choices=tuple(JobStatus), help="only jobs in this status")

    for name, handler in (("status", _status), ("targets", _targets), ("cancel", _cancel)):
        p = add(name, handler, parents=[as_json])
        p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")

    add("upstreams", _upstreams, parents=[as_json])
    p = add("prune", _prune, parents=[as_json])
    p.add_argument(
        "--older-than", type=seconds, required=True, metavar="S", help="ended over S seconds ago"
    )
    p.add_argument(
        "--status",
        action="append",
        choices=tuple(TERMINAL_JOB),
        help="only jobs that ended so (again for more; default: any)",
    )
    for name, handler in (("pause", _pause), ("unpause", _unpause)):
        p = add(name, handler, parents=[as_json])
        p.add_argument("--caller", type=_text, help="this caller's jobs")
        p.add_argument(
            "--upstream",
            type=_text,
            help="this upstream's targets: a host (every port), host:port, or a URL",
        )
    p = add("explain", _explain, parents=[as_json])
    p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")

    p = add("serve", _serve)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port", type=int, default=8000, help="port to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--allow-cancel", action="store_true", help="let the page cancel jobs (else read-only)"
    )

    p = add("wait", _wait, parents=[as_json])
    p.add_argument("job", metavar="JOB", help="a job id, or a unique prefix of one")
    p.add_argument("--timeout", type=seconds, metavar="S", help="give up after S seconds")
    return parser


def _fetch_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that fetch."""
    p.add_argument("--save", metavar="DIR", help="save each body in DIR (created if missing)")
    p.add_argument("--caller", type=_text, default=_user(), help="whose jobs (default: you)")
    defaults = Config()
    p.add_argument("--workers", type=count, default=defaults.workers, help="fetches at once")
    p.add_argument(
        "--retry-wait",
        type=seconds,
        default=defaults.retry_wait,
        metavar="S",
        help="wait before asking a busy host again (or what its Retry-After says)",
    )
    p.add_argument(
        "--retry-for",
        type=seconds,
        default=defaults.retry_for,
        metavar="S",
        help="give up on a URL still busy after this long",
    )
    p.add_argument(
        "--max-bytes",
        type=bytes_size,
        default=defaults.max_bytes,
        metavar="SIZE",
        help="stored bytes past which the oldest ended jobs are evicted (e.g. 512MiB)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=web.TIMEOUT,
        metavar="S",
        help=f"longest wait to connect, or for more of an answer (default: {web.TIMEOUT:g})",
    )
    pacing = p.add_argument_group(
        "pacing, per host, shared by every runner on the store",
        "A busy answer (429, 503) holds its host for its Retry-After, or a growing backoff.",
    )
    pacing.add_argument(
        "--rate", type=_rate, metavar="N/s", help="most requests a second to one host (e.g. 20/s)"
    )
    pacing.add_argument(
        "--concurrency", type=count, metavar="N", help="most requests at once to one host"
    )
    pacing.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="learn each host's pace from its answers, under --rate and --concurrency if given"
        " (default: on; --no-adaptive keeps to those alone)",
    )


def _rate(text: str) -> float:
    """A rate: ``20/s``, ``20``, ``120/m`` or ``3600/h``, in starts a second."""
    number, _, per = text.strip().partition("/")
    seconds = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}.get(per.strip().lower())
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if seconds is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (say 20/s, 120/m or 3600/h)")
    return value / seconds


def _positive_seconds(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, not {text!r}")
    return value


def _text(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected printable text, not {text!r}")
    return text


def _user() -> str:
    """Who runs this, for ``--caller``: the login name, else ``batch``."""
    try:
        return getpass.getuser() or "batch"
    except (OSError, KeyError):  # no name for this uid (a bare container)
        return "batch"
