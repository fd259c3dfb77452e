"""The commands that run jobs: ``demo``, ``fetch`` and ``requeue`` (the URLs
read, checked and dealt into jobs by host, the runner run until the jobs
end or a signal stops it)."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import sys
import tempfile
import urllib.parse
from collections.abc import Callable
from typing import Any

import store
from store.console import (
    EXIT_FAILED,
    SHORT_ID,
    BadInput,
    Failure,
    Output,
    stopping,
)

from .. import web
from ..errors import InvalidJob
from ..model import Config, Limit, Target
from ..states import LIVE_JOB, TargetState
from . import demo
from .progress import JobCaller, LiveRun, summary
from .views import SHORT_OF_DONE, find_job, stopped_status

#: Seconds to wait for a host's ``robots.txt`` before fetching without it,
#: and how many hosts' are read at once.
ROBOTS_TIMEOUT = 5.0
ROBOTS_AT_ONCE = 16


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
    return Output(None, "", stopped_status(stopped) if stopped else 0)


def _fetch(args: argparse.Namespace) -> Output:
    """Fetch the URLs listed in FILE."""
    urls = _read_urls(args.file)
    jobs = [(_label(args.file), urls)] if args.in_order else _by_host(urls, args.per_host)
    return _run_urls(args, jobs)


def _requeue(args: argparse.Namespace) -> Output:
    """Fetch again, as a new job, the URLs of JOB that did not end done."""
    with store.open(args.db, readonly=True) as db:
        job = find_job(db, args.job)
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
        return Output(None, "", stopped_status(stopped))
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
