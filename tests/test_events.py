"""``Store.watch``: what happens on the store, from any handle or process, in
commit order, resumable, pruned by age; on both engines."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

import batch
import store
import store.events as store_events
from store.ledger import Ledger
from tests import pgbouncer
from tests.helpers import TIMEOUT, Clock, MakeRunner, Script, eventually
from tests.runs_helpers import advertise, finish, step

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


def take(watch: store.events.Watch, n: int) -> list[store.Event]:
    """The next ``n`` events of ``watch``, each within TIMEOUT."""
    taken = []
    for _ in range(n):
        event = watch.get(TIMEOUT)
        assert event is not None, f"only {len(taken)} events of {n}"
        taken.append(event)
    return taken


def kinds(events: list[store.Event]) -> list[tuple[str, str]]:
    return [(e.kind, e.id) for e in events]


def test_each_change_of_a_job_is_one_event_in_order(db: store.Store) -> None:
    """A job's life, as a watcher sees it: submitted (with its owner, name
    and size), started, each target stored, ended with its status; a
    cancel ends a job too. Numbers increase by one."""
    with db.watch() as watch:
        Ledger.of(db).create_jobs("alice", [("j1", ["a", "b"])], names=["first"])
        Ledger.of(db).register_runner("r1")
        ((_, token),) = Ledger.of(db).beat_runner("r1", 30.0, room=1, foreign=True).taken
        lease = store.Lease("r1", token)
        Ledger.of(db).store_targets(
            [store.TargetOutcome("j1", 0, store.TargetState.DONE, result="1", lease=lease)]
        )
        Ledger.of(db).store_targets(
            [
                store.TargetOutcome(
                    "j1",
                    1,
                    store.TargetState.FAILED,
                    error="boom",
                    lease=lease,
                    job_status=store.JobStatus.PARTIAL,
                )
            ]
        )
        Ledger.of(db).create_job("j2", "bob", ["x"])
        assert db.cancel_job("j2", "bob")
        seen = take(watch, 7)
        assert watch.get(0.2) is None
    assert kinds(seen) == [
        ("job.submitted", "j1"),
        ("job.started", "j1"),
        ("target.stored", "j1"),
        ("target.stored", "j1"),
        ("job.ended", "j1"),
        ("job.submitted", "j2"),
        ("job.ended", "j2"),
    ]
    assert [e.data for e in seen] == [
        {"owner": "alice", "name": "first", "targets": 2},
        {"owner": "alice", "status": "running"},
        {"pos": 0, "status": "done"},
        {"pos": 1, "status": "failed"},
        {"owner": "alice", "status": "partial"},
        {"owner": "bob", "name": None, "targets": 1},
        {"owner": "bob", "status": "cancelled"},
    ]
    assert [e.seq for e in seen] == list(range(seen[0].seq, seen[0].seq + len(seen)))
    assert watch.seq == seen[-1].seq


def events_of(db: store.Store, job_id: str) -> list[str]:
    """The kinds of a job's events, from the first kept to its end."""
    kinds = []
    with db.watch(since=0) as watch:
        while not kinds or kinds[-1] != "job.ended":
            event = watch.get(TIMEOUT)
            assert event is not None, f"no end of {job_id} after {kinds}"
            if event.id == job_id:
                kinds.append(event.kind)
    return kinds


def test_a_job_a_runner_runs_starts_and_ends(db: store.Store, runner: MakeRunner) -> None:
    """A job of one target, run by a runner (its start and its end stored
    in one batch, one statement on PostgreSQL), has its four events."""
    with runner(db, Script(), workers=1) as r:
        job_id = r.submit(ALICE, ["only"])
        r.wait(ALICE, job_id, TIMEOUT)
    assert events_of(db, job_id) == ["job.submitted", "job.started", "target.stored", "job.ended"]


def test_events_carry_the_stores_clock(location: str, clock: Clock) -> None:
    """An event's ``at`` is its transaction's time on the store's clock."""
    with store.open(location, clock=clock.time) as db, db.watch() as watch:
        clock.tick(10.0)
        Ledger.of(db).create_job("j1", "alice", ["a"])
        (event,) = take(watch, 1)
    assert event.at == clock.time()


def test_each_change_of_a_run_is_one_event(db: store.Store) -> None:
    """A run placed at once starts; one that waits is queued, then started
    when capacity frees; each ends with its state."""
    advertise(db, "n1", "linux")
    with db.watch() as watch:
        db.submit_run([step("s", "linux")], run_id="r1")
        db.submit_run([step("s", "linux")], run_id="r2")
        finish(db, "n1", "r1")
        assert db.cancel_run("r2")
        seen = take(watch, 5)
    assert kinds(seen) == [
        ("run.started", "r1"),
        ("run.queued", "r2"),
        ("run.ended", "r1"),
        ("run.started", "r2"),
        ("run.ended", "r2"),
    ]
    assert seen[2].data == {"state": "SUCCEEDED", "reason": None}
    assert seen[4].data == {"state": "FAILED", "reason": "cancelled"}


def test_a_change_that_rolls_back_writes_no_event(db: store.Store) -> None:
    """A submit refused (a duplicate id) leaves no event behind."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    with db.watch() as watch:
        with pytest.raises(store.Conflict):
            Ledger.of(db).create_jobs("alice", [("j9", ["a"]), ("j1", ["b"])])
        Ledger.of(db).create_job("j2", "alice", ["a"])
        assert kinds(take(watch, 1)) == [("job.submitted", "j2")]


def test_a_watch_resumes_after_the_last_event_it_saw(db: store.Store) -> None:
    """Stopping after any event and resuming from its ``seq`` misses none
    and repeats none; a watch from the start sees every event kept."""
    with db.watch(since=0) as everything:
        for k in range(6):
            Ledger.of(db).create_job(f"j{k}", "alice", ["a"])
        seen = take(everything, 6)
    for cut in range(len(seen)):
        with db.watch(since=seen[cut].seq) as rest:
            assert take(rest, len(seen) - cut - 1) == seen[cut + 1 :]
            assert rest.get(0.1) is None


def test_another_handle_sees_what_one_writes(location: str) -> None:
    """A watcher on one handle sees the changes made through another (its
    own connections), within the poll or the notice."""
    with store.open(location) as writer, store.open(location) as reader:
        with reader.watch(timeout=5.0) as watch:
            Ledger.of(writer).create_job("j1", "alice", ["a"])
            event = next(watch)
        assert (event.kind, event.id) == ("job.submitted", "j1")


def test_another_process_sees_what_one_writes(location: str) -> None:
    """Events are written by the store's own statements, so a change made
    by another process is seen as one made here is."""
    with store.open(location) as db, db.watch(timeout=10.0) as watch:
        code = (
            "import store, sys\nfrom store.ledger import Ledger\n"
            "with store.open(sys.argv[1]) as db:\n"
            "    Ledger.of(db).create_job('far', 'alice', ['a'])\n"
            "    db.cancel_job('far', 'alice')\n"
        )
        subprocess.run([sys.executable, "-c", code, location], check=True, timeout=30)
        assert kinds([next(watch), next(watch)]) == [
            ("job.submitted", "far"),
            ("job.ended", "far"),
        ]


@pytest.mark.parametrize(
    "junk", ["event:[not json", "event:[1, 2]", 'event:[[1, "k", "i", 0, "{"]]']
)
def test_a_notice_that_is_not_the_stores_loses_nothing(
    location: str, junk: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On PostgreSQL a notice carries the events it tells of: one on the
    store's channel that does not (sent by anyone who can connect) is
    logged, and the watcher reads the store instead."""
    if not location.startswith("postgresql:") or pgbouncer.fronts(location):
        pytest.skip("notices are PostgreSQL's, and pass no transaction pooler")
    import psycopg  # noqa: PLC0415

    with store.open(location) as db, db.watch(timeout=10.0) as watch:
        # Notices are heard once the store found that they come (until
        # then its watchers read the store).
        assert eventually(lambda: db._db.notifies)  # type: ignore[attr-defined]
        with psycopg.connect(location, autocommit=True) as other:
            other.execute("SELECT pg_notify('batch_store', %s)", (junk,))
        Ledger.of(db).create_job("j1", "alice", ["a"])
        assert kinds([next(watch)]) == [("job.submitted", "j1")]
    assert "a notice that is not events" in caplog.text


def test_writers_side_by_side_each_event_is_seen_once_in_order(location: str) -> None:
    """Four handles submitting and ending jobs at once (on PostgreSQL,
    transactions that number events before they commit, and commit in
    any order): a watcher sees every event exactly once, a job's own
    events in the order they happened, and numbers only increasing."""
    writers, jobs_each = 4, 25
    barrier = threading.Barrier(writers)

    def write(k: int) -> None:
        with store.open(location) as db:
            barrier.wait(timeout=30)
            for j in range(jobs_each):
                job_id = f"w{k}-{j}"
                Ledger.of(db).create_job(job_id, "alice", ["a"])
                db.cancel_job(job_id, "alice")

    with store.open(location) as db, db.watch(timeout=5.0) as watch:
        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        seen = []
        for event in watch:
            seen.append(event)
            if len(seen) == 2 * writers * jobs_each:
                break
        for t in threads:
            t.join(timeout=30)
        with db.watch(since=0) as again:
            stored = take(again, len(seen))
    assert sorted(seen) == sorted(stored)
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)
    by_job: dict[str, list[str]] = {}
    for e in seen:
        by_job.setdefault(e.id, []).append(e.kind)
    assert len(by_job) == writers * jobs_each
    assert all(k == ["job.submitted", "job.ended"] for k in by_job.values())


def test_a_watch_ends_after_its_timeout_and_when_closed(db: store.Store) -> None:
    """With a timeout, a watch ends once no event came for that long; a
    closed one ends at once; a store closed under a watch makes it raise."""
    with db.watch(timeout=0.05) as watch:
        assert list(watch) == []
    watch = db.watch()
    watch.close()
    watch.close()
    assert list(watch) == []
    waiting = db.watch()
    got: list[BaseException] = []

    def wait() -> None:
        try:
            next(waiting)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=wait)
    t.start()
    db.close()
    t.join(timeout=10)
    assert len(got) == 1 and isinstance(got[0], store.StoreError)
    with pytest.raises(store.StoreError):
        db.watch()


@pytest.mark.parametrize(
    ("since", "timeout", "error"),
    [("1", None, TypeError), (True, None, TypeError), (None, -1, ValueError)],
)
def test_bad_arguments_are_refused(
    db: store.Store, since: object, timeout: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        db.watch(since=since, timeout=timeout)  # type: ignore[arg-type]


def test_old_events_are_pruned_by_the_beat_and_a_watch_from_them_says_so(
    location: str, clock: Clock
) -> None:
    """A runner's beat prunes events older than ``KEPT``; a watch from a
    number pruned raises ``EventsPruned``; one from a number kept, or from
    now, goes on."""
    with store.open(location, clock=clock.time) as db:
        Ledger.of(db).create_job("old", "alice", ["a"])
        clock.tick(store_events.KEPT + 1)
        Ledger.of(db).create_job("new", "alice", ["a"])
        Ledger.of(db).register_runner("r1")
        Ledger.of(db).beat_runner("r1", 30.0, room=0)
        with pytest.raises(store.EventsPruned), db.watch(since=0, timeout=0.1) as watch:
            list(watch)
        with db.watch(since=1) as watch:
            assert kinds(take(watch, 1)) == [("job.submitted", "new")]
        # Everything old: the newest stays, and numbers go on past it.
        clock.tick(store_events.KEPT + 1)
        Ledger.of(db).beat_runner("r1", 30.0, room=0)
        with db.watch(since=2) as watch:
            Ledger.of(db).create_job("newer", "alice", ["a"])
            (event,) = take(watch, 1)
        assert (event.kind, event.seq) == ("job.submitted", 3)


# -- the gaps of writers side by side -----------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Transactions that begin (take an id), draw a number, and end (commit
    or roll back), interleaved: a list of (step, transaction)."""
    n = draw(st.integers(1, 6))
    steps: list[tuple[str, int]] = []
    pending = {t: ["begin", "draw", draw(st.sampled_from(["commit", "abort"]))] for t in range(n)}
    while pending:
        t = draw(st.sampled_from(sorted(pending)))
        steps.append((pending[t].pop(0), t))
        if not pending[t]:
            del pending[t]
    return steps


@given(histories(), st.lists(st.integers(0, 30), min_size=1, max_size=8))
def test_a_reader_never_passes_over_a_number_that_commits_later(
    history: list[tuple[str, int]], reads_at: list[int]
) -> None:
    """Whatever the order transactions begin, draw and commit in, a reader
    reading at any points settles every committed number exactly once, in
    order, and never a number before all smaller committed ones."""
    xid: dict[int, int] = {}
    number: dict[int, int] = {}
    committed: set[int] = set()
    running: set[int] = set()
    next_xid = next_seq = 1
    seq, gap = 0, None
    out: list[int] = []

    def read() -> None:
        # A read's snapshot: the oldest id in flight; and, as the bound, an
        # id the reader takes, above every one given so far.
        nonlocal seq, gap, next_xid
        visible = sorted(number[t] for t in committed if number[t] > seq)
        xmin = min((xid[t] for t in running), default=next_xid)
        bound, next_xid = next_xid, next_xid + 1
        events = [store.Event(n, "job.submitted", "j", 0.0, {}) for n in visible]
        settled, gap = store_events._settle(seq, events, (xmin, bound), gap, 0.0)
        for e in settled:
            out.append(e.seq)
            seq = e.seq

    reads = sorted(reads_at)
    for i, (what, t) in enumerate(history):
        while reads and reads[0] <= i:
            reads.pop(0)
            read()
        if what == "begin":
            xid[t], next_xid = next_xid, next_xid + 1
            running.add(t)
        elif what == "draw":
            number[t], next_seq = next_seq, next_seq + 1
        else:
            running.discard(t)
            if what == "commit":
                committed.add(t)
    for _ in range(2):
        read()
    assert out == sorted(number[t] for t in committed)


def test_more_events_than_one_read_come_whole_and_in_order(db: store.Store) -> None:
    """A burst of more events than the reader reads at once (a submit of
    many jobs) reaches a watcher whole, in order, from now on or from 0."""
    n = store_events.READ_ROWS + 500
    with db.watch() as live:
        Ledger.of(db).create_jobs("alice", [(f"j{k:05}", []) for k in range(n)])
        seen = [e.id for e in take(live, n)]
    assert seen == [f"j{k:05}" for k in range(n)]
    with db.watch(since=0) as again:
        assert [e.id for e in take(again, n)] == seen


def test_a_number_missing_too_long_is_passed_over(caplog: pytest.LogCaptureFixture) -> None:
    """A transaction in flight for longer than GAP_TIMEOUT (not one of the
    store's) does not stall the watchers for ever: the number is passed
    over, and the log says so."""
    events = [store.Event(3, "job.submitted", "j", 0.0, {})]
    settled, gap = store_events._settle(1, events, (5, 9), None, 0.0)
    assert (settled, gap) == ([], (2, 9, 0.0))
    settled, gap = store_events._settle(1, events, (5, 0), gap, store_events.GAP_TIMEOUT - 1)
    assert (settled, gap) == ([], (2, 9, 0.0))
    settled, gap = store_events._settle(1, events, (5, 0), gap, store_events.GAP_TIMEOUT)
    assert (settled, gap) == (events, None)
    assert "number 2 still missing" in caplog.text


def test_watches_at_their_own_pace_each_get_every_event_and_read_ones_are_let_go(
    db: store.Store,
) -> None:
    """One watch keeps up, one reads nothing until the end, one starts from
    0: each gets every event once, in order. What every open watch has
    been given is not kept in memory (a runner that waited on a job once
    watches for good; 2,000 events held are more than a MiB)."""
    n = 2_000
    tracemalloc.start(10)
    try:
        with db.watch() as keen, db.watch() as late:
            made = [f"j{k:05}" for k in range(n)]
            for first in range(0, n, 500):
                Ledger.of(db).create_jobs(
                    "alice", [(job_id, []) for job_id in made[first : first + 500]]
                )
                assert [e.id for e in take(keen, 500)] == made[first : first + 500]
            assert [e.id for e in take(late, n)] == made
            with db.watch(since=0) as again:
                assert [e.id for e in take(again, n)] == made
            Ledger.of(db).create_job(
                "last", "alice", []
            )  # the next read lets go of those all three read
            assert take(keen, 1)[0].id == take(late, 1)[0].id == "last"
            gc.collect()
            held = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, store_events.__file__, all_frames=True)]
            )
            kept = sum(stat.size for stat in held.statistics("filename"))
            assert kept < 128 * 1024, f"{kept:,} bytes of events kept"
    finally:
        tracemalloc.stop()
