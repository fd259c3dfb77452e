"""The command line: ``python -m batch demo|fetch|jobs|status|targets|cancel|wait|requeue``
(also installed as ``batch-runner``).

- ``demo``: a local server and five jobs of two callers, shown as they run.
- ``fetch FILE|-``: fetch the URLs listed in FILE (one per line; blank lines
  and ``#`` comments skipped). One job per host by default: each host gets
  one request at a time, and the hosts take turns on the workers;
  ``--per-host N`` deals each host's URLs among N jobs (N at once per
  host); ``--in-order`` makes the list one job, fetched in its order.
  Results go to the store; ``--save DIR`` keeps the bodies.
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
import concurrent.futures
import dataclasses
import getpass
import json
import math
import os
import re
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import store
from store.console import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    SHORT_ID,
    BadInput,
    Failure,
    Missing,
    Output,
    Parser,
    about,
    add_db,
    add_version,
    bytes_size,
    count,
    duration,
    moment,
    run,
    seconds,
    size,
    stopping,
    table,
)
from store.ledger import Ledger

from .. import explain, web
from ..errors import InvalidJob, JobNotFound
from ..model import Config, Limit, Target
from ..states import LIVE_JOB, TERMINAL_JOB, JobStatus, TargetState
from . import demo
from .progress import JobCaller, LiveRun, summary

__all__ = ["console_main", "main"]

#: Seconds to wait for a host's ``robots.txt`` before fetching without it,
#: and how many hosts' are read at once.
ROBOTS_TIMEOUT = 5.0
ROBOTS_AT_ONCE = 16

#: Seconds ``wait`` waits for an event before it looks whether it was
#: interrupted.
STOP_CHECK = 0.1
#: Seconds between ``wait``'s looks at the job itself, should the events fail.
LOOK = 1.0

#: A job that ended in one of these did not do all it was asked: exit status 1.
SHORT_OF_DONE = (JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED)


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


# -- running jobs: demo, fetch, requeue --------------------------------------------------


def _demo(args: argparse.Namespace) -> Output:
    """Watch a local demo run (a few seconds)."""
    path = args.db or os.path.join(tempfile.mkdtemp(prefix="batch-demo-"), "jobs.sqlite3")
    site = demo.Site()
    fetch = web.Fetcher(timeout=10.0, proxies={})  # the server is local: never via a proxy
    with stopping() as stop, demo.serving(site) as base, store.open(path) as db:
        with LiveRun(db, fetch, demo.CONFIG, sys.stdout) as live:
            jobs = {
                name: live.submit(caller, name, [base + p for p in paths])
                for caller, name, paths in demo.JOBS
            }
            with demo.cancelling(site, live, jobs[demo.CANCEL_JOB]):
                stopped = _follow(live, stop, args.name)
        print()
        summary(sys.stdout, live)
    print(site.report())
    print(f"store: {path}")
    return Output(None, "", _stopped_status(stopped) if stopped else 0)


def _fetch(args: argparse.Namespace) -> Output:
    """Fetch the URLs listed in FILE."""
    urls = _read_urls(args.file)
    jobs = [(_label(args.file), urls)] if args.in_order else _by_host(urls, args.per_host)
    return _run_urls(args, jobs)


def _requeue(args: argparse.Namespace) -> Output:
    """Fetch again, as a new job, the URLs of JOB that did not end done."""
    with store.open(args.db, readonly=True) as db:
        job = _find(db, args.job)
    # What did not end done: the failures, and what a cancelled or
    # interrupted job left pending.
    again = [t.ref for t in job.targets if t.status != TargetState.DONE]
    if job.status in LIVE_JOB:
        raise Failure(f"job {job.id[:SHORT_ID]} is still {job.status}: requeue it once it ended")
    if not again:
        raise Failure(f"job {job.id[:SHORT_ID]} has nothing to fetch again: every target is done")
    return _run_urls(args, [(f"again: {job.name or job.id[:SHORT_ID]}", again)])


def _run_urls(args: argparse.Namespace, jobs: list[tuple[str, list[str]]]) -> Output:
    """Run ``jobs`` (name, URLs) to their end, showing them; the summary
    after, or each target as a JSON line while they run."""
    limit = Limit(concurrency=args.concurrency, rate=args.rate, adaptive=args.adaptive)
    limits = {"*": limit, **_polite(jobs, limit, args.timeout)}
    config = Config(
        workers=args.workers,
        retry_wait=args.retry_wait,
        retry_for=args.retry_for,
        max_bytes=args.max_bytes,
        max_targets=max(Config().max_targets, *(len(refs) for _, refs in jobs)),
        upstream=web.host_of,
        limits=limits,
    )
    fetch = web.Fetcher(timeout=args.timeout, save_dir=_save_dir(args.save))
    out = sys.stderr if args.json else sys.stdout
    printer = _JsonLines() if args.json else None
    with stopping() as stop, store.open(args.db) as db:
        with LiveRun(db, fetch, config, out, on_target=printer) as live:
            for name, refs in jobs:
                live.submit(args.caller, name, refs)
            stopped = _follow(live, stop, args.name, lambda: printer is not None and printer.gone)
        if not args.json:
            print()
            summary(sys.stdout, live)
            print(f"store: {db.path}")
    if stopped == "gone":
        return Output(None, "")  # the reader went away: it has what it wanted
    if stopped:
        return Output(None, "", _stopped_status(stopped))
    ended_badly = any(live.status(job) in SHORT_OF_DONE for job in live.jobs)
    return Output(None, "", EXIT_FAILED if ended_badly else 0)


class _JsonLines:
    """Prints each stored target as a JSON line; notes a reader gone away."""

    def __init__(self) -> None:
        self.gone = False

    def __call__(self, job: JobCaller, target: store.TargetRow) -> None:
        if self.gone:
            return
        line: dict[str, Any] = {
            "id": job.job,
            "job_id": job.job,
            "name": job.label,
            "pos": target.pos,
            "ref": target.ref,
            "status": target.status,
        }
        if target.result is not None:
            line["result"] = json.loads(target.result)
        else:
            line.update(error=target.error, hint=target.hint)
        try:
            print(json.dumps(line), flush=True)
        except BrokenPipeError:
            self.gone = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _follow(
    live: LiveRun,
    stop: Callable[[], str | None],
    name: str,
    gone: Callable[[], bool] = lambda: False,
) -> str | None:
    """Follow ``live`` to its end; if stopped first (a signal, a reader gone),
    cancel its live jobs, store what is in flight, say so (as ``name``, the
    command), and return why."""

    def why() -> str | None:
        return "gone" if gone() else stop()

    if not live.follow(lambda: why() is not None):
        return None
    reason = why()
    cancelled = live.cancel()
    inflight = live.runner.statistics().inflight
    if reason != "gone":
        # On a terminal, below the board, where its last redraws keep it.
        live.note(
            f"{name}: {reason}: cancelled {cancelled} job(s); storing the {inflight}"
            " target(s) in flight"
        )
    live.close()
    return reason


def _stopped_status(reason: str) -> int:
    return EXIT_TERMINATED if reason == "terminated" else EXIT_INTERRUPTED


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


def _polite(jobs: list[tuple[str, list[str]]], limit: Limit, timeout: float) -> dict[str, Limit]:
    """For each host of ``jobs`` whose ``robots.txt`` asks a ``Crawl-delay``,
    ``limit`` with no more than one request per that delay."""
    hosts = sorted({host for _, refs in jobs for ref in refs if (host := web.host_of(Target(ref)))})
    wait = min(timeout, ROBOTS_TIMEOUT)
    with concurrent.futures.ThreadPoolExecutor(ROBOTS_AT_ONCE) as pool:
        delays = pool.map(lambda host: web.crawl_delay(host, timeout=wait), hosts)
    limits = {}
    for host, delay in zip(hosts, delays, strict=True):
        if delay is not None:
            rate = 1 / delay if limit.rate is None else min(limit.rate, 1 / delay)
            limits[host] = dataclasses.replace(limit, rate=rate, burst=1)
    return limits


def _by_host(urls: list[str], per_host: int) -> list[tuple[str, list[str]]]:
    """The URLs grouped by host name (any port; ``file`` URLs apart), hosts
    in first-seen order; each host's URLs dealt among ``per_host`` jobs,
    in turn, so that as many of its requests run at once."""
    hosts: dict[str, list[str]] = {}
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        hosts.setdefault("file" if parts.scheme == "file" else parts.hostname or "", []).append(url)
    jobs = []
    for host, refs in hosts.items():
        n = min(per_host, len(refs))
        for k in range(n):
            jobs.append((host if n == 1 else f"{host} {k + 1}/{n}", refs[k::n]))
    return jobs


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


# -- reading and steering the store: jobs, status, targets, wait, cancel ----------------


#: What a job that ended is shown with: whether its caller is paused does not matter.
NOTHING_PAUSED = store.Paused()


def _jobs(args: argparse.Namespace) -> Output:
    """List the stored jobs."""
    with store.open(args.db, readonly=True) as db:
        status = None if args.status is None else JobStatus(args.status)
        jobs = db.list_jobs(owner=args.caller, status=status)
        paused = db.paused()
    text = _job_table(jobs)
    if paused.callers or paused.upstreams:
        text += "\npaused: " + ", ".join(_paused_names(paused))
    return Output([_job_json(j, paused) for j in jobs], text)


def _status(args: argparse.Namespace) -> Output:
    """One job's summary; status 1 if it ended failed, partial or cancelled."""
    with store.open(args.db, readonly=True) as db:
        job = _find(db, args.job).summary()
        paused = db.paused()
        after = Ledger.of(db).after_of(job.id)
    out = _job_output(job, paused)
    if not after:
        return out
    text = f"{out.text}\nafter    {', '.join(a[:SHORT_ID] for a in after)}"
    if job.deferred and job.waits:
        text += f" ({job.waits} not ended)"
    return dataclasses.replace(out, data={**out.data, "after": after}, text=text)


def _prune(args: argparse.Namespace) -> Output:
    """Delete the jobs that ended longer ago than --older-than (of --status)."""
    with store.open(args.db) as db:
        pruned = db.prune(args.older_than, args.status)
    return Output({"pruned": pruned}, f"pruned {pruned} job(s)")


def _pause(args: argparse.Namespace) -> Output:
    """Pause a caller or an upstream on every runner; alone: what is paused."""
    return _pausing(args, paused=True)


def _unpause(args: argparse.Namespace) -> Output:
    """Unpause a caller or an upstream; alone: what is paused."""
    return _pausing(args, paused=False)


def _pausing(args: argparse.Namespace, *, paused: bool) -> Output:
    """Pause (or unpause) what ``args`` names, if anything; show what is paused."""
    change = args.caller is not None or args.upstream is not None
    with store.open(args.db, readonly=not change) as db:
        if change and paused:
            try:
                db.pause(caller=args.caller, upstream=args.upstream)
            except store.UnknownUpstream as e:
                raise BadInput(str(e)) from None
        elif change:
            db.unpause(caller=args.caller, upstream=args.upstream)
        now = db.paused()
    rows = [("caller", name, since) for name, since in now.callers.items()]
    rows += [("upstream", name, since) for name, since in now.upstreams.items()]
    return Output(
        [{"kind": kind, "name": name, "since": since} for kind, name, since in rows],
        table(
            ("paused", "name", "since"),
            ((kind, name, moment(since)) for kind, name, since in rows),
            empty="nothing is paused",
        ),
    )


def _paused_names(paused: store.Paused) -> list[str]:
    return [f"caller {name}" for name in paused.callers] + [
        f"upstream {name}" for name in paused.upstreams
    ]


def _targets(args: argparse.Namespace) -> Output:
    """One job's targets."""
    with store.open(args.db, readonly=True) as db:
        job = _find(db, args.job)
    data = []
    rows = []
    for t in job.targets:
        result = None if t.result is None else json.loads(t.result)
        nbytes = None if t.result is None else len(t.result.encode())
        data.append(
            {
                "id": job.id,
                "job_id": job.id,
                "pos": t.pos,
                "ref": t.ref,
                "status": t.status,
                "error": t.error,
                "hint": t.hint,
                "result": result,
                "result_bytes": nbytes,
            }
        )
        error = t.error and (f"{t.error} ({t.hint})" if t.hint else t.error)
        rows.append((t.pos, t.status, t.ref, error, None if nbytes is None else size(nbytes)))
    return Output(data, table(("pos", "status", "ref", "error (hint)", "result"), rows))


def _wait(args: argparse.Namespace) -> Output:
    """Wait until JOB ends, whichever process runs it; show it then."""
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    with stopping() as stop, store.open(args.db, readonly=True) as db, db.watch() as events:
        job = _find(db, args.job)
        next_look = time.monotonic() + LOOK
        while job.status in LIVE_JOB:
            if (reason := stop()) is not None:
                return Output(None, "", _stopped_status(reason))
            if deadline is not None and time.monotonic() >= deadline:
                raise Failure(
                    f"job {job.id[:SHORT_ID]} is still {job.status} after {args.timeout:g}s"
                )
            # Another process runs it: its end comes as an event; and the
            # job is looked at every LOOK seconds, should the events fail.
            event = events.get(timeout=STOP_CHECK)
            ended = event is not None and event.kind == "job.ended" and event.id == job.id
            if ended or time.monotonic() >= next_look:
                job = _find(db, job.id)
                next_look = time.monotonic() + LOOK
    return _job_output(job.summary())


def _cancel(args: argparse.Namespace) -> Output:
    """Cancel a live job, whichever process runs it; status 1 if it had ended."""
    with store.open(args.db, readonly=True) as db:
        found = _find(db, args.job)
    with store.open(args.db) as db:
        cancelled = db.cancel_job(found.id, found.owner)
        job = db.find_job(found.id)
    if job is None:
        raise Missing(f"no job {args.job!r} in {args.db}")
    out = _job_output(job.summary())
    if cancelled:
        return Output({**out.data, "cancelled": True}, out.text, 0)
    return Output(
        {**out.data, "cancelled": False},
        f"{out.text}\njob {job.id[:SHORT_ID]} had ended already: nothing cancelled",
        EXIT_FAILED,
    )


def _upstreams(args: argparse.Namespace) -> Output:
    """The upstreams paced now: held by a busy answer, or wanted by a runner."""
    with store.open(args.db, readonly=True) as db:
        views = db.upstreams()
    rows = [
        (v.name, _held_for(v.held_until), v.runners, v.demand, v.slots, f"{v.rate:g}/s")
        for v in views
    ]
    return Output(
        [dataclasses.asdict(v) for v in views],
        table(("upstream", "held for", "runners", "jobs", "slots", "rate"), rows, empty="none"),
    )


def _held_for(until: float | None) -> str:
    """How much longer a hold lasts, from its end (epoch seconds)."""
    return duration(0.0 if until is None else max(0.0, until - time.time()))


def _serve(args: argparse.Namespace) -> Output:
    """Serve a web dashboard of the store: jobs, upstreams, runs, nodes, live."""
    try:
        from .. import dashboard  # noqa: PLC0415 - the extra is needed by this command only
    except ImportError:
        raise Failure("the dashboard needs its extra: pip install 'batch-store[web]'") from None

    def opened(db: store.Store) -> None:
        # The store's path, as every message shows it: without a password.
        print(f"dashboard of {db.path} on http://{args.host}:{args.port}/", flush=True)

    # The server stops on Ctrl-C or SIGTERM, and tells it again once
    # stopped: the flag says which, for the exit status.
    with stopping() as stop:
        dashboard.serve(
            args.db,
            host=args.host,
            port=args.port,
            allow_cancel=args.allow_cancel,
            opened=opened,
        )
        reason = stop()
    return Output(None, "", EXIT_OK if reason is None else _stopped_status(reason))


def _explain(args: argparse.Namespace) -> Output:
    """Why JOB is not fetching: who holds it, what it waits for."""
    with store.open(args.db, readonly=True) as db:
        where = db.whereabouts(_find(db, args.job).id)
    if where is None:
        raise Missing(f"no job {args.job!r} in {db.path}")
    explained = explain.from_store(where, web.host_of)
    return Output(explained, explain.describe(explained))


def _find(db: store.Store, given: str) -> store.JobRow:
    """The job whose id is ``given``, or the one job whose id starts with it."""
    prefix = given.strip().lower()
    if not prefix or not prefix.isascii():
        raise Missing(f"no job {given!r} in {db.path}")
    job = db.find_job(prefix)
    if job is None:
        ids = [s.id for s in db.list_jobs() if s.id.startswith(prefix)]
        if len(ids) > 1:
            raise BadInput(f"{given!r} is the start of {len(ids)} job ids: give more of it")
        job = db.find_job(ids[0]) if ids else None
    if job is None:
        raise Missing(f"no job {given!r} in {db.path}")
    return job


def _job_output(job: store.JobSummary, paused: store.Paused = NOTHING_PAUSED) -> Output:
    """One job, as ``status`` shows it (with what is ``paused``); status 1
    if it ended short of done."""
    fields = {
        "job": job.id,
        "name": job.name or "-",
        "caller": job.owner,
        "key": job.key or "-",
        "status": f"{job.status} (its caller is paused)"
        if job.owner in paused.callers and job.status in LIVE_JOB
        else job.status,
        "targets": f"{job.done} done, {job.failed} failed, {job.pending} pending",
        "bytes": size(job.nbytes),
        "created": moment(job.created_at),
        "updated": f"{moment(job.updated_at)} ({job.updated_at - job.created_at:.1f}s later)",
    }
    if job.not_before is not None:
        fields["starts"] = f"not before {moment(job.not_before)}"
    if job.reason is not None:
        fields["why"] = job.reason
    text = "\n".join(f"{key:<8} {value}" for key, value in fields.items())
    return Output(_job_json(job, paused), text, EXIT_FAILED if job.status in SHORT_OF_DONE else 0)


def _job_json(job: store.JobSummary, paused: store.Paused = NOTHING_PAUSED) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "caller": job.owner,
        "key": job.key,
        "status": job.status,
        "paused": job.owner in paused.callers,
        "not_before": job.not_before,
        "deferred": job.deferred,
        "reason": job.reason,
        "done": job.done,
        "failed": job.failed,
        "pending": job.pending,
        "bytes": job.nbytes,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


def _job_table(jobs: Sequence[store.JobSummary]) -> str:
    headers = ("job", "name", "caller", "status", "done", "failed", "pending", "bytes")
    return table(
        (*headers, "created", "updated"),
        (
            (
                j.id[:SHORT_ID],
                j.name,
                j.owner,
                j.status,
                j.done,
                j.failed,
                j.pending,
                size(j.nbytes),
                moment(j.created_at),
                moment(j.updated_at),
            )
            for j in jobs
        ),
        empty="no jobs",
    )


# -- parsing ------------------------------------------------------------------------------


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
