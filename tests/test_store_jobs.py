"""The store's batch jobs and targets, and eviction under the byte budget."""

from __future__ import annotations

import pytest

import store
from store.ledger import Ledger
from tests.helpers import Clock
from tests.jobs_helpers import (
    TERMINAL,
    job_of,
    terminal_job,
    utf8_len,
)

# -- jobs and targets -------------------------------------------------------


def test_create_job_is_queued_with_pending_targets_in_order(db: store.Store) -> None:
    """A new job is queued, its targets pending, in the order given."""
    refs = ["zeta", "alpha", "mü", "alpha", ""]
    Ledger.of(db).create_job("j1", "alice", refs)
    job = job_of(db, "j1")
    assert job.id == "j1"
    assert job.owner == "alice"
    assert job.status == "queued"
    assert job.nbytes == 0
    assert job.created_at == job.updated_at == job.touched_at
    assert [t.pos for t in job.targets] == list(range(len(refs)))
    assert [t.ref for t in job.targets] == refs
    for t in job.targets:
        assert (t.status, t.result, t.error, t.hint) == ("pending", None, None, None)


def test_create_job_without_targets(db: store.Store) -> None:
    """A job with no targets is stored with an empty target list."""
    Ledger.of(db).create_job("empty", "alice", [])
    assert job_of(db, "empty").targets == ()


def test_duplicate_job_id_is_refused_and_keeps_the_first(db: store.Store) -> None:
    """Creating a job under an existing id raises StoreError and leaves the
    existing job exactly as it was."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    Ledger.of(db).store_target("j1", 0, "done", result="1")
    before = job_of(db, "j1")
    with pytest.raises(store.StoreError):
        Ledger.of(db).create_job("j1", "bob", ["x", "y"])
    assert job_of(db, "j1") == before
    assert db.get_job("j1", "bob") is None
    assert Ledger.of(db).total_bytes() == 1


def test_foreign_job_reads_like_unknown(db: store.Store) -> None:
    """Another owner's job is indistinguishable from a missing one."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    assert db.get_job("j1", "bob") is None
    assert db.get_job("j1", "bob") == db.get_job("nope", "bob")
    assert db.get_job("j1", "") is None
    assert job_of(db, "j1").owner == "alice"


def test_touch_job_owner_check(db: store.Store, clock: Clock) -> None:
    """touch_job returns True for the owner's job and False for a foreign or
    unknown one, which it leaves untouched."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    created = job_of(db, "j1").touched_at
    clock.tick()
    assert db.touch_job("j1", "bob") is False
    assert db.touch_job("nope", "alice") is False
    assert job_of(db, "j1").touched_at == created
    assert db.touch_job("j1", "alice") is True
    assert job_of(db, "j1").touched_at == clock.now


def test_set_job_status_lifecycle(db: store.Store, clock: Clock) -> None:
    """queued -> running -> done, each move reported True and stamped."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    clock.tick()
    assert Ledger.of(db).set_job_status("j1", "running") is True
    job = job_of(db, "j1")
    assert job.status == "running"
    assert job.updated_at == clock.now
    clock.tick()
    assert Ledger.of(db).set_job_status("j1", "done") is True
    job = job_of(db, "j1")
    assert job.status == "done"
    assert job.updated_at == job.touched_at == clock.now


@pytest.mark.parametrize("final", TERMINAL)
@pytest.mark.parametrize("late", ["queued", "running", *TERMINAL])
def test_terminal_status_is_final(db: store.Store, clock: Clock, final: str, late: str) -> None:
    """Once a job is terminal no later status overwrites it: the call returns
    False and the job is unchanged."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    assert Ledger.of(db).set_job_status("j1", "running")
    assert Ledger.of(db).set_job_status("j1", final)
    before = job_of(db, "j1")
    clock.tick()
    assert Ledger.of(db).set_job_status("j1", late) is False
    assert job_of(db, "j1") == before


def test_set_job_status_unknown_job(db: store.Store) -> None:
    """Moving a job that does not exist returns False."""
    assert Ledger.of(db).set_job_status("nope", "running") is False
    assert Ledger.of(db).set_job_status("nope", "done") is False


@pytest.mark.parametrize("status", ["", "DONE", "pending", "evicted", "Running"])
def test_set_job_status_unknown_status(db: store.Store, status: str) -> None:
    """An unknown status is a ValueError and changes nothing."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    before = job_of(db, "j1")
    with pytest.raises(ValueError, match="status"):
        Ledger.of(db).set_job_status("j1", status)
    assert job_of(db, "j1") == before


def test_store_target_stores_outcome_and_counts_utf8_bytes(db: store.Store) -> None:
    """A stored target keeps result, error and hint; the job's size is the UTF-8
    length of all three, and total_bytes agrees."""
    Ledger.of(db).create_job("j1", "alice", ["a", "b", "c"])
    result = '{"text": "naïve café — 日本語 🎉"}'
    error = "fehlgeschlagen: Größe"
    hint = "再試行してください"
    assert Ledger.of(db).store_target("j1", 0, "done", result=result) == []
    assert Ledger.of(db).store_target("j1", 2, "failed", error=error, hint=hint) == []
    job = job_of(db, "j1")
    t0, t1, t2 = job.targets
    assert (t0.status, t0.result, t0.error, t0.hint) == ("done", result, None, None)
    assert (t1.status, t1.result, t1.error, t1.hint) == ("pending", None, None, None)
    assert (t2.status, t2.result, t2.error, t2.hint) == ("failed", None, error, hint)
    expected = utf8_len(result, error, hint)
    assert expected > len(result) + len(error) + len(hint)
    assert job.nbytes == expected
    assert Ledger.of(db).total_bytes() == expected


def test_total_bytes_sums_every_job(db: store.Store) -> None:
    """total_bytes is the sum over all jobs, live and terminal."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    Ledger.of(db).create_job("j2", "bob", ["a", "b"])
    Ledger.of(db).store_target("j1", 0, "done", result="ééé")
    Ledger.of(db).store_target("j2", 0, "failed", error="ñ", hint="h")
    Ledger.of(db).store_target("j2", 1, "done", result="")
    assert Ledger.of(db).set_job_status("j1", "done")
    assert job_of(db, "j1").nbytes == 6
    assert job_of(db, "j2", "bob").nbytes == 3
    assert Ledger.of(db).total_bytes() == 9


def test_store_target_twice_is_a_conflict(db: store.Store) -> None:
    """Storing an already stored target raises Conflict and writes nothing."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    Ledger.of(db).store_target("j1", 0, "done", result='"first"')
    before = job_of(db, "j1")
    total = Ledger.of(db).total_bytes()
    for status in ("done", "failed"):
        with pytest.raises(store.Conflict):
            Ledger.of(db).store_target(
                "j1", 0, status, result='"second, longer"', error="e", hint="h"
            )
    assert job_of(db, "j1") == before
    assert Ledger.of(db).total_bytes() == total


def test_store_target_out_of_range_is_a_conflict(db: store.Store) -> None:
    """A position the job does not have is refused with Conflict, changing nothing."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    before = job_of(db, "j1")
    with pytest.raises(store.Conflict):
        Ledger.of(db).store_target("j1", 5, "done", result="1")
    assert job_of(db, "j1") == before
    assert Ledger.of(db).total_bytes() == 0


def test_store_target_missing_job_is_not_found(db: store.Store) -> None:
    """Storing for a job that does not exist (or was evicted) raises NotFound."""
    with pytest.raises(store.NotFound):
        Ledger.of(db).store_target("nope", 0, "done", result="1")
    terminal_job(db, "gone", 4)
    assert db.evict(0) == ["gone"]
    with pytest.raises(store.NotFound):
        Ledger.of(db).store_target("gone", 0, "done", result="1")
    assert Ledger.of(db).total_bytes() == 0


@pytest.mark.parametrize("status", ["pending", "", "DONE", "cancelled", "partial"])
def test_store_target_bad_status(db: store.Store, status: str) -> None:
    """A target can only end done or failed; anything else is a ValueError
    and writes nothing."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    with pytest.raises(ValueError, match=repr(status)):
        Ledger.of(db).store_target("j1", 0, status, result="1")
    assert job_of(db, "j1").targets[0].status == "pending"
    assert Ledger.of(db).total_bytes() == 0


def test_store_target_on_terminal_job_is_kept(db: store.Store) -> None:
    """A result that lands after the job ended (a fetch in flight at cancel)
    is stored and counted; the job stays terminal."""
    Ledger.of(db).create_job("j1", "alice", ["a", "b"])
    assert Ledger.of(db).set_job_status("j1", "cancelled")
    Ledger.of(db).store_target("j1", 0, "done", result="ok")
    job = job_of(db, "j1")
    assert job.status == "cancelled"
    assert job.targets[0].result == "ok"
    assert job.nbytes == Ledger.of(db).total_bytes() == 2


# -- eviction ---------------------------------------------------------------


def test_evict_under_budget_does_nothing(db: store.Store) -> None:
    """Within budget no job is evicted, terminal or not."""
    terminal_job(db, "a", 5)
    terminal_job(db, "b", 5)
    assert db.evict(10) == []
    assert db.evict(1 << 40) == []
    assert Ledger.of(db).total_bytes() == 10
    job_of(db, "a")
    job_of(db, "b")


def test_evict_least_recently_touched_first(db: store.Store, clock: Clock) -> None:
    """Eviction takes the terminal job touched longest ago first; ending a job
    touches it, so it is the end time that counts, not the creation time."""
    for name in ("a", "b", "c"):
        Ledger.of(db).create_job(name, "alice", ["t"])
        Ledger.of(db).store_target(name, 0, "done", result="x" * 10)
        clock.tick()
    for name in ("c", "a", "b"):
        assert Ledger.of(db).set_job_status(name, "done")
        clock.tick()
    assert Ledger.of(db).total_bytes() == 30
    assert db.evict(15) == ["c", "a"]
    assert Ledger.of(db).total_bytes() == 10
    assert db.get_job("c", "alice") is None
    assert db.get_job("a", "alice") is None
    job_of(db, "b")


def test_evict_ties_broken_by_creation_order(db: store.Store, clock: Clock) -> None:
    """With equal touch times, the job created first goes first, whatever
    order the jobs ended in or their ids sort in."""
    names = ["m", "z", "a", "q"]
    for name in names:
        Ledger.of(db).create_job(name, "alice", ["t"])
        Ledger.of(db).store_target(name, 0, "done", result="x" * 3)
    for name in reversed(names):
        assert Ledger.of(db).set_job_status(name, "failed")
    assert len({job_of(db, n).touched_at for n in names}) == 1
    assert db.evict(0) == names
    assert Ledger.of(db).total_bytes() == 0


def test_touch_moves_job_to_the_back(db: store.Store, clock: Clock) -> None:
    """touch_job makes a job the last candidate for eviction."""
    for name in ("a", "b", "c"):
        terminal_job(db, name, 10)
    clock.tick()
    assert db.touch_job("a", "alice")
    assert db.evict(10) == ["b", "c"]
    job_of(db, "a")
    clock.tick()
    terminal_job(db, "d", 10)
    clock.tick()
    assert db.touch_job("a", "alice")
    assert db.evict(0) == ["d", "a"]


def test_an_outcome_a_runner_stores_makes_its_job_running(db: store.Store) -> None:
    """A runner's outcome (stored under its lease) of a queued job makes the
    job running in the same commit, whether or not a write naming it
    starting has landed: a job with a target stored by its runner is never
    seen queued."""
    Ledger.of(db).register_runner("r", 30.0)
    Ledger.of(db).create_jobs("alice", [("j", ["a", "b"])], "r", lease_for=30.0)
    lease = store.Lease("r", 1)
    stored = Ledger.of(db).store_targets(
        [store.TargetOutcome("j", 0, "done", result="1", lease=lease)]
    )
    assert stored.refused == {}
    assert job_of(db, "j").status == "running"


def test_live_jobs_are_never_evicted(db: store.Store) -> None:
    """Queued and running jobs stay, even when they alone exceed the budget;
    only terminal jobs go, and eviction stops when none is left."""
    Ledger.of(db).create_job("queued", "alice", ["t"])
    Ledger.of(db).store_target("queued", 0, "done", result="q" * 50)
    Ledger.of(db).create_job("running", "alice", ["t"])
    Ledger.of(db).store_target("running", 0, "failed", error="r" * 50)
    assert Ledger.of(db).set_job_status("running", "running")
    terminal_job(db, "old", 7)
    assert Ledger.of(db).total_bytes() == 107
    assert db.evict(10) == ["old"]
    assert Ledger.of(db).total_bytes() == 100
    assert db.evict(0) == []
    assert Ledger.of(db).total_bytes() == 100
    assert job_of(db, "queued").status == "queued"
    assert job_of(db, "running").status == "running"


@pytest.mark.parametrize("status", TERMINAL)
def test_every_terminal_status_is_evictable(db: store.Store, status: str) -> None:
    """done, failed, partial and cancelled jobs are all evictable."""
    terminal_job(db, "j", 3, status=status)
    assert db.evict(0) == ["j"]
    assert db.get_job("j", "alice") is None


def test_evict_drops_total_by_exactly_the_evicted_bytes(db: store.Store, clock: Clock) -> None:
    """total_bytes falls by exactly the sizes of the evicted jobs (UTF-8 bytes,
    not characters) and eviction stops as soon as the total is within budget."""
    sizes = {"a": "ä" * 5, "b": "🎉" * 2, "c": "c" * 4, "d": "日" * 3}
    for name, text in sizes.items():
        Ledger.of(db).create_job(name, "alice", ["t"])
        Ledger.of(db).store_target(name, 0, "done", result=text)
        assert Ledger.of(db).set_job_status(name, "done")
        clock.tick()
    nbytes = {name: job_of(db, name).nbytes for name in sizes}
    assert nbytes == {"a": 10, "b": 8, "c": 4, "d": 9}
    total = Ledger.of(db).total_bytes()
    assert total == 31
    evicted = db.evict(total - 11)
    assert evicted == ["a", "b"]
    assert Ledger.of(db).total_bytes() == total - nbytes["a"] - nbytes["b"]
    assert db.evict(Ledger.of(db).total_bytes() - 1) == ["c"]
    assert Ledger.of(db).total_bytes() == nbytes["d"]


def test_store_target_evicts_past_max_bytes(db: store.Store, clock: Clock) -> None:
    """store_target(max_bytes=...) evicts terminal jobs past the budget in the
    same call and returns their ids in eviction order; the live job the
    target belongs to stays."""
    terminal_job(db, "old1", 10)
    clock.tick()
    terminal_job(db, "old2", 10)
    clock.tick()
    terminal_job(db, "old3", 10)
    clock.tick()
    Ledger.of(db).create_job("live", "alice", ["a", "b"])
    assert Ledger.of(db).store_target("live", 0, "done", result="x" * 5, max_bytes=100) == []
    assert Ledger.of(db).total_bytes() == 35
    assert Ledger.of(db).store_target("live", 1, "done", result="y" * 10, max_bytes=25) == [
        "old1",
        "old2",
    ]
    assert Ledger.of(db).total_bytes() == 25
    job_of(db, "old3")
    live = job_of(db, "live")
    assert live.nbytes == 15
    assert [t.status for t in live.targets] == ["done", "done"]


def test_store_target_max_bytes_never_evicts_live(db: store.Store) -> None:
    """A live job larger than the whole budget is kept; store_target evicts nothing."""
    Ledger.of(db).create_job("big", "alice", ["a", "b"])
    assert Ledger.of(db).store_target("big", 0, "done", result="x" * 100, max_bytes=10) == []
    assert Ledger.of(db).store_target("big", 1, "failed", error="y" * 100, max_bytes=0) == []
    assert job_of(db, "big").nbytes == Ledger.of(db).total_bytes() == 200


def test_failed_store_target_evicts_nothing(db: store.Store) -> None:
    """A store_target that fails (Conflict) does not run eviction either."""
    terminal_job(db, "old", 10)
    Ledger.of(db).create_job("live", "alice", ["a"])
    Ledger.of(db).store_target("live", 0, "done", result="1")
    with pytest.raises(store.Conflict):
        Ledger.of(db).store_target("live", 0, "done", result="1", max_bytes=0)
    job_of(db, "old")
    assert Ledger.of(db).total_bytes() == 11
