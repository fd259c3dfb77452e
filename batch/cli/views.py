"""The commands that read and steer a store: ``jobs``, ``status``,
``targets``, ``wait``, ``cancel``, ``prune``, ``pause``, ``unpause``,
``upstreams``, ``explain``, ``serve``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
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
    duration,
    moment,
    size,
    stopping,
    table,
)
from store.ledger import Ledger

from .. import explain, web
from ..states import LIVE_JOB, JobStatus

#: Seconds ``wait`` waits for an event before it looks whether it was
#: interrupted.
STOP_CHECK = 0.1
#: Seconds between ``wait``'s looks at the job itself, should the events fail.
LOOK = 1.0

#: A job that ended in one of these did not do all it was asked: exit status 1.
SHORT_OF_DONE = (JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED)


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
        job = find_job(db, args.job).summary()
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
        job = find_job(db, args.job)
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
        job = find_job(db, args.job)
        next_look = time.monotonic() + LOOK
        while job.status in LIVE_JOB:
            if (reason := stop()) is not None:
                return Output(None, "", stopped_status(reason))
            if deadline is not None and time.monotonic() >= deadline:
                raise Failure(
                    f"job {job.id[:SHORT_ID]} is still {job.status} after {args.timeout:g}s"
                )
            # Another process runs it: its end comes as an event; and the
            # job is looked at every LOOK seconds, should the events fail.
            event = events.get(timeout=STOP_CHECK)
            ended = event is not None and event.kind == "job.ended" and event.id == job.id
            if ended or time.monotonic() >= next_look:
                job = find_job(db, job.id)
                next_look = time.monotonic() + LOOK
    return _job_output(job.summary())


def _cancel(args: argparse.Namespace) -> Output:
    """Cancel a live job, whichever process runs it; status 1 if it had ended."""
    with store.open(args.db, readonly=True) as db:
        found = find_job(db, args.job)
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
    return Output(None, "", EXIT_OK if reason is None else stopped_status(reason))


def _explain(args: argparse.Namespace) -> Output:
    """Why JOB is not fetching: who holds it, what it waits for."""
    with store.open(args.db, readonly=True) as db:
        where = db.whereabouts(find_job(db, args.job).id)
    if where is None:
        raise Missing(f"no job {args.job!r} in {db.path}")
    explained = explain.from_store(where, web.host_of)
    return Output(explained, explain.describe(explained))


def find_job(db: store.Store, given: str) -> store.JobRow:
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


def stopped_status(reason: str) -> int:
    return EXIT_TERMINATED if reason == "terminated" else EXIT_INTERRUPTED
