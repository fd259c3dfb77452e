"""Faults injected into the store's engine, on both engines and both kinds
of runner: no runner thread dies of what the store or its driver raises,
no job is lost by guesswork, and the runner's lock never waits on the store.

The faults are made by a wrapper around the store's engine (``Store._db``,
a ``store.engines.Database``): a store call picked to fail hands its function a
transaction whose ``execute``/``executemany`` raises the fault at a chosen
statement (the engine rolls back, and maps a driver's error to
``StoreError`` or tries again), or, when the function runs fewer
statements, raises it after the transaction committed, as a store that
lost the answer to its COMMIT would, unmapped. Every exception class the
driver defines is injected at least once (every ``psycopg.Error`` class of
``psycopg``, ``psycopg.errors`` and ``psycopg_pool``; every
``sqlite3.Error``), and so are plain ``RuntimeError`` and ``OSError``,
spread over the store calls each runner thread makes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import pytest

import batch
import batch.commit
import batch.keeper
import batch.trouble
import store
from store.engines import Cursor, Database, Tx
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, Recorder, Script

T = TypeVar("T")

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")

#: The store calls the runner's threads make, each of which a fault hits.
#: ``create_jobs`` is made by ``submit`` on the test's thread: the faults
#: it gets are those the store documents (driver errors raised inside the
#: transaction, which the engine maps to ``StoreError``; a ``StoreError``
#: after the commit, for a lost answer).
SITES = (
    "create_jobs",
    "store_targets",
    "beat_runner",
    "look",
    "interrupt_job",
    "job_leases",
    "retire_runner",
)
PUBLIC = frozenset({"create_jobs"})


def driver_errors(location: str) -> list[type[Exception]]:
    """Every exception class the engine's driver defines, in a fixed order."""
    if location.startswith("postgresql://"):
        modules: list[Any] = [psycopg, psycopg.errors]
        with contextlib.suppress(ImportError):
            import psycopg_pool  # noqa: PLC0415 - the pool's errors, where it is installed

            modules.append(psycopg_pool)
        base: type[Exception] = psycopg.Error
    else:
        modules, base = [sqlite3], sqlite3.Error
    found = {
        cls
        for module in modules
        for name in dir(module)
        if isinstance(cls := getattr(module, name), type) and issubclass(cls, base)
    }
    return sorted(found, key=lambda cls: (cls.__module__, cls.__qualname__))


class Fault:
    """What one store call picked to fail gets: ``exc``, raised at statement
    ``at`` of its transaction, or after it committed (``at`` None, or a
    function that runs fewer statements). Raised once, however many times
    the engine runs the function."""

    def __init__(self, exc: BaseException, at: int | None, public: bool) -> None:
        self.exc, self.at, self.public = exc, at, public
        self.fired = False


class Faults:
    """Which store calls fail, and how; what was injected where.

    While ``on``, every other call of each site fails (a failure, then a
    success: the backoffs stay short), at statement 0, 1 or 2 or after the
    commit, in turn; the exception classes are taken in turn, those not
    injected yet first. A site in ``held`` waits until its gate opens."""

    def __init__(self, classes: Sequence[type[Exception]]) -> None:
        self.classes = list(classes)
        self.on = False
        self.injected: Counter[type[BaseException]] = Counter()
        self.by_site: Counter[str] = Counter()
        # Every class injected, and a fault at every site but retire_runner
        # (the runner's last call: its fault comes at close).
        self.everywhere = threading.Event()
        # By site: (entered, gate, after): its calls set ``entered`` and wait
        # for ``gate``, before their transaction or (``after``) once it
        # committed.
        self.held: dict[str, tuple[threading.Event, threading.Event, bool]] = {}
        self.force: set[str] = set()  # sites whose next call fails, on or off
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._turn = 0  # the next class to inject, once each was

    def pick(self, site: str | None) -> Fault | None:
        """The fault this call of ``site`` gets, if any."""
        with self._lock:
            if site in self.force:
                self.force.discard(site)
                return Fault(RuntimeError(f"injected into {site}"), 0, False)
            if not self.on or site not in SITES:
                return None
            self._calls[site] += 1
            n = self._calls[site]
            if n % 2:
                return None
            at = (0, 1, 2, None)[(n // 2) % 4]
            if site in PUBLIC:
                if at is None:
                    return Fault(
                        store.StoreError("injected: the answer to COMMIT was lost"), None, True
                    )
                # create_jobs' first statement runs on every engine (on
                # PostgreSQL it is its only one): raised inside, mapped.
                cls = self._next(lambda c: not issubclass(c, RuntimeError | OSError))
                return Fault(cls(f"injected into {site}"), 0, True)
            cls = self._next(lambda c: True)
            return Fault(cls(f"injected into {site}"), at, False)

    def _next(self, fits: Callable[[type[Exception]], bool]) -> type[Exception]:
        """The next class that ``fits``: one not injected yet if any (a fault
        picked may not be raised: its transaction failed first), else the
        next in turn."""
        todo = [c for c in self.classes if not self.injected[c] and fits(c)]
        self._turn += 1
        if todo:
            return todo[self._turn % len(todo)]
        while not fits(cls := self.classes[self._turn % len(self.classes)]):
            self._turn += 1
        return cls

    def fire(self, site: str, fault: Fault) -> BaseException:
        """Note that ``fault`` is raised now, and give its exception."""
        fault.fired = True
        with self._lock:
            self.injected[type(fault.exc)] += 1
            self.by_site[site] += 1
            if all(self.injected[cls] for cls in self.classes) and all(
                self.by_site[site] for site in SITES if site != "retire_runner"
            ):
                self.everywhere.set()
        return fault.exc


_site = threading.local()


class FaultyTx:
    """A transaction whose statement ``fault.at`` raises ``fault.exc``."""

    def __init__(self, tx: Tx, site: str, fault: Fault | None, faults: Faults) -> None:
        self.tx, self.site, self.fault, self.faults = tx, site, fault, faults
        self.statements = 0

    @property
    def now(self) -> float:
        return self.tx.now

    def _statement(self) -> None:
        fault = self.fault
        if fault is not None and not fault.fired and fault.at == self.statements:
            raise self.faults.fire(self.site, fault)
        self.statements += 1

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        self._statement()
        return self.tx.execute(sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        self._statement()
        return self.tx.executemany(sql, rows)

    def finish(self, sql: str, args: Sequence[Any] = ()) -> Cursor:
        self._statement()
        return self.tx.finish(sql, args)

    def __getattr__(self, name: str) -> Any:
        # What else the engine's transactions offer (Tx.locking, ...), as is.
        return getattr(self.tx, name)


class FaultyDatabase(Database):
    """The store's engine, with the faults of ``faults`` injected into the
    transactions of the store calls (named by :func:`inject`)."""

    def __init__(self, inner: Database, faults: Faults) -> None:
        self.inner, self.faults = inner, faults
        self.path, self.readonly = inner.path, inner.readonly
        self.one_writer, self.functions = inner.one_writer, inner.functions  # type: ignore[misc]

    def _run(self, run: Callable[..., T], fn: Callable[[Tx], T], **kwargs: Any) -> T:
        site = getattr(_site, "name", None)
        held = self.faults.held.get(site or "")
        if held is not None and not held[2]:
            self._hold(site, held)
        fault = self.faults.pick(site)
        result = run(lambda tx: fn(FaultyTx(tx, site or "", fault, self.faults)), **kwargs)
        if held is not None and held[2]:
            self._hold(site, held)
        if fault is not None and not fault.fired:
            # Committed, and reported failed: the answer to COMMIT was lost.
            raise self.faults.fire(site or "", fault)
        return result

    @staticmethod
    def _hold(site: str | None, held: tuple[threading.Event, threading.Event, bool]) -> None:
        entered, gate, _ = held
        entered.set()
        assert gate.wait(TIMEOUT), f"{site} was never let go"

    def write(self, fn: Callable[[Tx], T], **kwargs: Any) -> T:  # type: ignore[override]
        return self._run(self.inner.write, fn, **kwargs)

    def read(self, fn: Callable[[Tx], T]) -> T:
        return self._run(self.inner.read, fn)

    def read_version(self, tx: Tx) -> int:
        return self.inner.read_version(tx)

    def close(self) -> None:
        self.inner.close()

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        return self.inner.subscribe(callback)

    def __getattr__(self, name: str) -> Any:
        # What else the engine offers, as is.
        return getattr(self.inner, name)


def inject(db: store.Store, faults: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap ``db``'s engine in a :class:`FaultyDatabase`, and its methods so
    that the engine knows which store call each transaction is for."""

    def named(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(_site, "name", None)
            _site.name = name
            try:
                return method(*args, **kwargs)
            finally:
                _site.name = outer

        return call

    monkeypatch.setattr(db, "_db", FaultyDatabase(db._db, faults))
    for name in SITES:
        monkeypatch.setattr(Ledger.of(db), name, named(name, getattr(Ledger.of(db), name)))
    monkeypatch.setattr(db, "cancel_job", named("cancel_job", db.cancel_job))


class Ended(batch.Hooks):
    """Counts the ``ended`` hook per job, and the targets stored fine."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ends: Counter[str] = Counter()
        self.stored = 0

    def ended(self, job_id: str, owner: str, status: str) -> None:
        with self.lock:
            self.ends[job_id] += 1

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        if err is None:
            with self.lock:
                self.stored += 1


@contextlib.contextmanager
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the threads that end on an exception in the block."""
    died: list[str] = []
    hook = threading.excepthook

    def note(args: threading.ExceptHookArgs) -> None:
        died.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}")
        hook(args)

    monkeypatch.setattr(threading, "excepthook", note)
    yield died


def runner_threads(async_fetch: bool, workers: int) -> set[str]:
    """The names ``batch.Runner`` gives its threads."""
    if async_fetch:
        return {"batch-keeper", "batch-loop", "batch-writer"}
    return {"batch-keeper", *(f"batch-worker-{i}" for i in range(workers))}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_runner_thread_dies_of_what_the_store_raises(
    location: str,
    runner: MakeRunner,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Every exception class of the driver, RuntimeError and OSError are
    injected into the store calls of submit, the group commit, the beat, the
    cancel poll, the keeper's interrupts, its reads of the jobs it holds and
    its retirement. Once the faults stop: every job ended ``done`` with each
    target fetched once and stored once (its counts and bytes agree with
    its results; its hooks were called once), every ``bob`` job no runner
    could go on with ended ``interrupted``, every thread of the runner is
    alive, and no call of the test's got anything but a ``StoreError``."""
    classes = [*driver_errors(location), RuntimeError, OSError]
    faults = Faults(classes)
    monkeypatch.setattr(batch.keeper, "RETRY_BEAT", 0.02)
    monkeypatch.setattr(batch.commit, "BACKOFF_MAX", 0.05)
    workers = 4
    async_fetch = request.node.callspec.params["runner"] == "async"
    with (
        thread_errors(monkeypatch) as died,
        store.open(location) as db,
        store.open(location) as other,
    ):
        inject(db, faults, monkeypatch)
        script, hooks = Script(), Ended()
        r = runner(
            db,
            script,
            hooks,
            workers=workers,
            takeover_after=1.5,
            resume=lambda cid: ALICE if cid == ALICE.id else None,
        )
        refused: list[BaseException] = []  # what the test's own calls raised
        try:
            faults.on = True
            deadline = time.monotonic() + 60
            serial = itertools.count()
            while not faults.everywhere.is_set() and time.monotonic() < deadline:
                # Jobs no runner holds, of a caller resume gives nothing for:
                # the runner takes them, and ends them interrupted.
                Ledger.of(other).create_jobs(BOB.id, [(f"bob-{next(serial)}", ["b"])])
                ids = []
                for _ in range(6):
                    refs = [f"t{next(serial)}" for _ in range(3)]
                    try:
                        ids.append(r.submit(ALICE, refs))
                    except store.StoreError:
                        pass  # documented; stored or not, the runner deals with it
                    except Exception as e:
                        refused.append(e)
                for job_id in ids:
                    try:
                        r.wait(ALICE, job_id, TIMEOUT)
                    except Exception as e:
                        refused.append(e)
            faults.on = False
            assert faults.everywhere.is_set(), (
                f"not injected: {[c.__name__ for c in classes if not faults.injected[c]]};"
                f" by site: {faults.by_site}"
            )
            assert not refused, refused

            # Every job ends, those whose submit raised included.
            for summary in db.list_jobs():
                caller = ALICE if summary.owner == ALICE.id else BOB
                r.wait(caller, summary.id, TIMEOUT)
            assert r.statistics().workers == workers
            alive = {t.name for t in threading.enumerate() if t.is_alive()}
            assert runner_threads(async_fetch, workers) <= alive
        finally:
            faults.on = False
            # The retirement fails too: the keeper ends all the same.
            faults.force.add("retire_runner")
            r.close(timeout=TIMEOUT)
        check_every_job(db, script, hooks)
    assert not died, died
    assert all(faults.by_site[site] for site in SITES), faults.by_site


def check_every_job(db: store.Store, script: Script, hooks: Ended) -> None:
    """Every ``alice`` job is done, each target fetched once and stored once;
    every ``bob`` job ended interrupted."""
    fetched = Counter(script.calls)
    jobs = db.list_jobs()
    total = 0
    for summary in jobs:
        job = db.find_job(summary.id)
        assert job is not None
        total += job.nbytes
        if summary.owner == BOB.id:
            assert summary.status == "failed", summary
            assert [t.error for t in job.targets] == ["interrupted"]
            continue
        assert (summary.status, summary.done, summary.failed, summary.pending) == (
            "done",
            len(job.targets),
            0,
            0,
        ), summary
        # Counted once each: the bytes of the job are those of its results.
        assert job.nbytes == sum(len(t.result or "") for t in job.targets), summary
        for t in job.targets:
            assert t.result is not None and t.result.replace(" ", "") == f'{{"ref":"{t.ref}"}}'
            assert fetched[t.ref] == 1, f"{t.ref} fetched {fetched[t.ref]} times"
        assert hooks.ends[job.id] == 1, f"job {job.id}: ended hook {hooks.ends[job.id]} times"
    assert Ledger.of(db).total_bytes() == total
    alice = sum(len(db.find_targets(s.id)) for s in jobs if s.owner == ALICE.id)
    assert hooks.stored == alice


# -- a batch the store refused is not a lost lease by guesswork ---------------


def test_an_outcome_stored_by_a_commit_reported_failed_goes_on(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that did commit, reported failed (the answer to its COMMIT
    lost), is written again and refused: its targets are stored already.
    The runner reads the job back, finds it still holds it, and goes on
    from there: the job that had more targets runs them, the one that
    ended ends; each target fetched once, each hook called once."""
    real = Ledger.of(db).store_targets
    lose = {"x0", "y0"}  # the first commit of these outcomes is lost

    def lossy(outcomes: Sequence[store.TargetOutcome], **kwargs: Any) -> store.Stored:
        stored = real(outcomes, **kwargs)
        refs = {json.loads(o.result)["ref"] for o in outcomes if o.result is not None}
        if refs & lose:
            lose.difference_update(refs)
            raise store.StoreError("connection lost while committing")  # committed all the same
        return stored

    monkeypatch.setattr(Ledger.of(db), "store_targets", lossy)
    script, hooks = Script(), Recorder()
    with runner(db, script, hooks, workers=1) as r:
        longer = r.submit(ALICE, ["x0", "x1", "x2"])  # goes on after its first target
        single = r.submit(ALICE, ["y0"])  # ended by the commit that was lost
        for job_id in (longer, single):
            assert r.wait(ALICE, job_id, TIMEOUT).status == "done"
        hooks.wait_for(lambda h: len(h.jobs) == 2)
        assert r.statistics().live == 0
    assert not lose
    assert sorted(script.calls) == ["x0", "x1", "x2", "y0"]
    assert hooks.jobs == ["done", "done"]
    assert len(hooks.targets) == 4


@pytest.mark.parametrize("resume", [True, False])
def test_a_job_stored_by_a_submit_that_raised_is_taken_up(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch, resume: bool
) -> None:
    """A submit whose job was stored, reported failed, leaves the job leased
    to the runner and in no rotation. The next beat takes it up: with
    ``resume``, it runs; without, it ends ``interrupted``. Its lease is not
    renewed for ever with the job live."""
    real = Ledger.of(db).create_jobs

    def lossy(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise store.StoreError("connection lost while committing")  # committed all the same

    script = Script()
    config: dict[str, Any] = {"resume": lambda cid: ALICE} if resume else {}
    with runner(db, script, workers=1, takeover_after=0.3, **config) as r:
        monkeypatch.setattr(Ledger.of(db), "create_jobs", lossy)
        with pytest.raises(store.StoreError):
            r.submit(ALICE, ["a", "b"])
        monkeypatch.setattr(Ledger.of(db), "create_jobs", real)
        (summary,) = db.list_jobs(owner=ALICE.id)
        job = r.wait(ALICE, summary.id, TIMEOUT)
    if resume:
        assert job.status == "done"
        assert script.calls == ["a", "b"]
    else:
        assert job.status == "failed"
        assert [t.error for t in job.targets] == ["interrupted", "interrupted"]
        assert script.calls == []


# -- the runner's lock never waits on the store ----------------------------


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
def test_cancel_waits_for_the_store_without_the_runners_lock(
    location: str, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """A cancel whose store write is held up (before its transaction, or
    after it committed and before the cancel takes the runner's lock) holds
    up nothing else: another job's targets go on being fetched and stored,
    their hooks called. Once the store lets the cancel go, it returns True
    and the job is cancelled: its target in flight is stored (meanwhile, in
    the second case: the store keeps the job cancelled), none starts after,
    and it has one terminal status and one ``job`` hook."""
    faults = Faults([])
    entered, gate = threading.Event(), threading.Event()
    faults.held["cancel_job"] = (entered, gate, committed)
    with store.open(location) as db:
        inject(db, faults, monkeypatch)
        script, hooks = Script(), Recorder()
        # o30 held: the other job is still live when the victim leaves.
        script.hold("v1", "o0", "o30")
        with runner(db, script, hooks, workers=2) as r:
            victim = r.submit(ALICE, ["v0", "v1", "v2", "v3"])
            script.started("v1")
            r.submit(ALICE, [f"o{i}" for i in range(100)])
            script.started("o0")
            answers: list[bool] = []
            cancel = threading.Thread(target=lambda: answers.append(r.cancel(ALICE, victim)))
            cancel.start()
            try:
                assert entered.wait(TIMEOUT)
                if committed:
                    # The outcome in flight commits after the cancel did: the
                    # job leaves, cancelled.
                    script.release("v1")
                    hooks.wait_for(lambda h: h.depths[-1] == 1)
                # The other job goes on, only now: while the cancel waits.
                before = len(hooks.targets)
                script.release("o0")
                hooks.wait_for(lambda h: len(h.targets) >= before + 20)
            finally:
                gate.set()
                cancel.join(TIMEOUT)
            try:
                assert answers == [True]
                assert r.status(ALICE, victim).status == "cancelled"
                script.release("v1")
                hooks.wait_for(lambda h: h.depths[-1] == 1)  # stored, the victim left
                job = r.status(ALICE, victim)
                assert hooks.jobs == ["cancelled"]
            finally:
                script.release("o30")
        assert [t.status for t in job.targets] == ["done", "done", "pending", "pending"]
        assert "v2" not in script.calls


# -- a run of failures is logged once -----------------------------------------


def test_a_run_of_failures_is_logged_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first failure is a warning of one line (the error's class and
    first line; its traceback at debug level, as for every failure); the
    next ones within ``REMIND`` are logged at debug level only, and counted
    in the next warning; the first success after a warned failure says how
    many tries failed in a row."""
    caplog.set_level(logging.DEBUG, logger="batch")
    trouble = batch.trouble.Trouble("the beat")

    def fail() -> None:
        try:
            raise store.StoreError("database is locked\nwhile renewing")
        except store.StoreError:
            trouble.failed("cannot renew; trying again")

    for _ in range(3):
        fail()
    trouble.ok()
    fail()  # within REMIND of the first warning
    monkeypatch.setattr(batch.trouble, "REMIND", 0.0)
    fail()
    logged = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    traced = (logging.DEBUG, "cannot renew; trying again", True)
    assert logged == [
        traced,
        (logging.WARNING, "cannot renew; trying again: StoreError: database is locked", False),
        traced,
        traced,
        (logging.WARNING, "the beat: the store answers again, after 3 failed tries", False),
        traced,
        traced,
        (
            logging.WARNING,
            "cannot renew; trying again (3 more failure(s) logged at debug level since the"
            " last warning): StoreError: database is locked",
            False,
        ),
    ]
