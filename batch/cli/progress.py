"""Following jobs to their end: the live view while they run, the table after.

:class:`LiveRun` submits jobs to a :class:`batch.Runner` and follows them
through the store; :class:`Board` draws one line per job; :func:`summary`
sums them up once they ended. The view reads the store, as any reader could:
the counts it shows are what is stored, never the runner's memory.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TextIO

import store
from store.console import SHORT_ID, table

from ..context import Context
from ..errors import RetryLater
from ..hooks import Hooks
from ..model import Config, Target
from ..runner import Fetch, Runner
from ..states import EVICTED, TERMINAL_JOB, JobStatus, TargetState

__all__ = ["Board", "JobCaller", "LiveRun", "summary", "table"]

#: Seconds between two looks at the jobs when nothing wakes the view sooner.
TICK = 0.1
#: The fewest seconds between two reads of the store, however fast targets
#: are stored: the view costs the runner it shares the process with little.
REFRESH = 0.05
#: Seconds between two batches of progress lines when not on a terminal.
PLAIN_EVERY = 1.0
#: Characters in a progress bar.
BAR_WIDTH = 16

#: The statuses a job shown here ends in: its own terminal ones, or
#: ``evicted`` when it ended and ``Config.max_bytes`` evicted it before a look.
ENDED = frozenset({*TERMINAL_JOB, EVICTED})


class JobCaller:
    """The caller object submitted with one job.

    ``id`` is the real caller's: the store keeps only that. The rest belongs to
    this one job, for the view: ``label`` names it, ``job`` is its id once
    submitted, and :class:`LiveRun` counts its busy answers here. A fetch is
    not told which job it serves, but the runner hands it this object.
    """

    __slots__ = ("_lock", "_retries", "_retry_at", "id", "job", "label")

    def __init__(self, caller_id: str, label: str) -> None:
        self.id = caller_id
        self.label = label
        self.job = ""
        # _lock guards _retries and _retry_at: written by the job's fetch (one
        # at a time: a job is serial), read by the view.
        self._lock = threading.Lock()
        self._retries = 0
        self._retry_at = 0.0

    @property
    def retries(self) -> int:
        """Busy answers so far: each one a retry, unless ``retry_for`` ran out."""
        with self._lock:
            return self._retries

    def retry_in(self, now: float) -> float:
        """Seconds until the busy target is tried again; 0 if none waits."""
        with self._lock:
            return max(0.0, self._retry_at - now)

    def _fetching(self) -> None:
        with self._lock:
            self._retry_at = 0.0

    def _busy(self, wait: float) -> None:
        with self._lock:
            self._retries += 1
            self._retry_at = time.monotonic() + wait


class _Changes(Hooks):
    """Sets ``event`` whenever a target is stored or a job ends, so the view
    reads the store when there is something new in it, and only then. The
    runner calls these hooks once the store holds what they report, so a
    read after the event sees it."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        self.event.set()

    def job(self, status: JobStatus) -> None:
        self.event.set()


def _counting(fetch: Fetch[JobCaller], retry_wait: float) -> Fetch[JobCaller]:
    """``fetch``, noting each ``RetryLater`` it raises on the job's caller."""

    def counted(ctx: Context, caller: JobCaller, target: Target) -> object:
        caller._fetching()
        try:
            return fetch(ctx, caller, target)
        except RetryLater as e:
            # The runner waits at least retry_wait, and at least what was asked.
            caller._busy(max(retry_wait, e.after or 0.0))
            raise

    return counted


class Board:
    """One line per job: label, caller, status, bar, done / failed / pending.

    The status is the job's, or ``busy 0.8s`` while its target, answered
    busy, waits that long to be tried again.

    ``live`` (the default when ``out`` is a terminal): the lines are redrawn in
    place, with ANSI cursor movement, whenever they change. Otherwise the lines
    of the jobs that changed are printed at most once every
    :data:`PLAIN_EVERY` seconds, each stamped with the seconds since the board
    began; ``final=True`` prints the last changes at once.
    """

    def __init__(self, out: TextIO, jobs: Sequence[JobCaller], live: bool | None = None) -> None:
        self._out = out
        self._jobs = jobs
        self._live = _is_terminal(out) if live is None else live
        self._start = time.monotonic()
        self._next_print = self._start
        self._drawn: list[str] = []  # live: the lines on the screen now
        self._notes: list[str] = []  # live: lines kept below the jobs'
        self._printed: dict[str, tuple[object, ...]] = {}  # plain: each job's last state shown

    def note(self, line: str, err: TextIO) -> None:
        """Say ``line`` to the person watching: on a live board, below the
        jobs' lines, where later redraws keep it; else on ``err``."""
        if not self._live:
            err.write(line + "\n")
            err.flush()
            return
        self._notes.append(line)
        self._redraw(self._drawn[: len(self._drawn) - len(self._notes) + 1], force=True)

    def show(self, rows: Mapping[str, store.JobSummary], *, final: bool = False) -> None:
        """Show the jobs as ``rows`` (by job id) has them."""
        now = time.monotonic()
        lines = self._lines(rows, now)
        if self._live and len(lines) + len(self._notes) < shutil.get_terminal_size().lines:
            self._redraw([text for _, text in lines])
        elif final or now >= self._next_print:
            # More jobs than the terminal has lines cannot be redrawn in place.
            self._next_print = now + PLAIN_EVERY
            for job, (state, text) in zip(self._jobs, lines, strict=True):
                if self._printed.get(job.job) != state:
                    self._printed[job.job] = state
                    self._out.write(f"{now - self._start:5.1f}s  {text}\n")
            self._out.flush()

    def _lines(
        self, rows: Mapping[str, store.JobSummary], now: float
    ) -> list[tuple[tuple[object, ...], str]]:
        """Each job's state (what makes a plain line worth printing again) and line."""
        label_width = max((len(job.label) for job in self._jobs), default=0)
        caller_width = max((len(job.id) for job in self._jobs), default=0)
        n = max((len(str(_total(row))) for row in rows.values()), default=1)
        out: list[tuple[tuple[object, ...], str]] = []
        for job in self._jobs:
            head = f"{job.label:<{label_width}}  {job.id:<{caller_width}}"
            row = rows.get(job.job)
            if row is None:
                out.append(((None,), f"{head}  (evicted)"))
                continue
            wait = job.retry_in(now) if row.status == JobStatus.RUNNING else 0.0
            status = f"busy {wait:.1f}s" if wait >= 0.05 else row.status
            out.append(
                (
                    (row.status, row.done, row.failed, bool(wait)),
                    f"{head}  {status:<9}  [{_bar(row.done, row.failed, _total(row))}]"
                    f"  {row.done:>{n}} done  {row.failed:>{n}} failed  {row.pending:>{n}} pending",
                )
            )
        return out

    def _redraw(self, lines: list[str], *, force: bool = False) -> None:
        """Draw the jobs' ``lines`` and the notes below them, over what was
        drawn before."""
        lines = lines + self._notes
        if lines == self._drawn and not force:
            return
        # A line wider than the terminal would wrap, and moving up by the
        # number of lines drawn would then land in the wrong place.
        width = max(20, shutil.get_terminal_size().columns - 1)
        up = f"\x1b[{len(self._drawn)}F" if self._drawn else ""
        self._out.write(up + "".join(f"\x1b[2K{line[:width]}\n" for line in lines))
        self._out.flush()
        self._drawn = lines


def _is_terminal(out: TextIO) -> bool:
    return out.isatty() and os.environ.get("TERM") != "dumb"


def _total(row: store.JobSummary) -> int:
    return row.done + row.failed + row.pending


def _bar(done: int, failed: int, total: int) -> str:
    """``#`` for done, ``x`` for failed, ``.`` for pending, scaled to BAR_WIDTH."""
    if total == 0:
        return "." * BAR_WIDTH
    ok = done * BAR_WIDTH // total
    bad = (done + failed) * BAR_WIDTH // total - ok
    return "#" * ok + "x" * bad + "." * (BAR_WIDTH - ok - bad)


class LiveRun:
    """Jobs submitted to one runner, followed to their end through the store.

    ``with LiveRun(db, fetch, config, out) as run:`` then :meth:`submit` each
    job and :meth:`follow` them; leaving the block closes the runner (a target
    in flight is stored first) and shows the jobs as they ended. ``rows`` holds
    each job's summary as last read (by job id); an evicted job has none.

    ``on_target(job, target)`` is called, in the thread that follows, once for
    every target stored, in each job's order.
    """

    def __init__(
        self,
        db: store.Store,
        fetch: Fetch[JobCaller],
        config: Config,
        out: TextIO,
        *,
        on_target: Callable[[JobCaller, store.TargetRow], None] | None = None,
    ) -> None:
        self._db = db
        self.jobs: list[JobCaller] = []
        self.rows: dict[str, store.JobSummary] = {}
        self._board = Board(out, self.jobs)
        self._on_target = on_target
        self._reported: dict[str, int] = {}  # per job: targets handed to on_target
        self._changes = _Changes()
        self.runner: Runner[JobCaller] = Runner(
            db, _counting(fetch, config.retry_wait), config, hooks=self._changes
        )

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def submit(self, caller_id: str, label: str, refs: Iterable[str]) -> JobCaller:
        """Submit one job of ``caller_id``'s, shown as ``label``."""
        job = JobCaller(caller_id, label)
        job.job = self.runner.submit(job, refs, name=label)
        self.jobs.append(job)
        return job

    def follow(self, interrupted: Callable[[], bool]) -> bool:
        """Show the jobs until every one has ended (False), or until
        ``interrupted()`` (True), looked at every :data:`TICK` seconds, and
        the store read again once something was stored (at most every
        :data:`REFRESH` seconds)."""
        self._refresh()
        last = time.monotonic()
        while not self.ended():
            if interrupted():
                return True
            self._board.show(self.rows)
            if self._changes.event.wait(TICK):
                time.sleep(max(0.0, last + REFRESH - time.monotonic()))
                self._changes.event.clear()
                self._refresh()
                last = time.monotonic()
        return False

    def note(self, line: str) -> None:
        """Say ``line`` to the person watching (see :meth:`Board.note`)."""
        self._board.note(line, sys.stderr)

    def ended(self) -> bool:
        """Whether every job has ended, as last read."""
        return all(self.status(job) in ENDED for job in self.jobs)

    def status(self, job: JobCaller) -> str:
        """The job's status as last read, or ``evicted``."""
        row = self.rows.get(job.job)
        return EVICTED if row is None else row.status

    def cancel(self) -> int:
        """Cancel every job still live; return how many were."""
        return sum(self.runner.cancel(job, job.job) for job in self.jobs)

    def close(self) -> None:
        """Close the runner (storing what is in flight), then show the jobs as
        they ended. Idempotent."""
        self.runner.close()
        self._refresh()
        self._board.show(self.rows, final=True)

    def failures(self) -> list[tuple[JobCaller, store.TargetRow]]:
        """Every failed target, job by job."""
        found: list[tuple[JobCaller, store.TargetRow]] = []
        for job in self.jobs:
            row = self.rows.get(job.job)
            if row is not None and row.failed:
                found += [(job, t) for t in self._targets(job) if t.status == TargetState.FAILED]
        return found

    def _targets(self, job: JobCaller) -> tuple[store.TargetRow, ...]:
        row = self._db.find_job(job.job)
        return () if row is None else row.targets

    def _refresh(self) -> None:
        """Read the jobs' summaries (one row each, whatever else the store
        holds); hand the targets stored since the last look to ``on_target``."""
        self.rows = {s.id: s for s in self._db.list_jobs(ids=[job.job for job in self.jobs])}
        if self._on_target is None:
            return
        for job in self.jobs:
            row = self.rows.get(job.job)
            seen = self._reported.get(job.job, 0)
            if row is None or row.done + row.failed <= seen:
                continue
            # A job's targets are stored in order, one at a time: those stored
            # since the last look follow the ones already handed on.
            fresh = self._db.find_targets(job.job, start=seen, limit=row.done + row.failed - seen)
            self._reported[job.job] = seen + len(fresh)
            for target in fresh:
                self._on_target(job, target)


def summary(out: TextIO, run: LiveRun) -> None:
    """The table of how each job ended, then every failed target with its error."""
    rows = []
    for job in run.jobs:
        row = run.rows.get(job.job)
        counts = ("?", "?", "?", "?") if row is None else _counts(row)
        rows.append((job.job[:SHORT_ID], job.label, job.id, run.status(job), *counts, job.retries))
    headers = ("job", "name", "caller", "status", "done", "failed", "pending", "seconds")
    out.write(table((*headers, "retries"), rows) + "\n")
    failures = run.failures()
    if failures:
        out.write("\nfailed targets:\n")
    for job, target in failures:
        hint = f" ({target.hint})" if target.hint else ""
        out.write(f"  {job.label}  {target.ref}: {target.error}{hint}\n")
    out.flush()


def _counts(row: store.JobSummary) -> tuple[int, int, int, float]:
    return row.done, row.failed, row.pending, row.updated_at - row.created_at
