"""What a runner does while a beat's or a look's store call is under way
with its lock let go (``batch.calls``): the call's read may predate it, and
it wins.

Each test makes the change from inside the store call, after the
store answered and before the runner applies the answer, so the moment
is the one a busy machine only hits by luck. The runner's clock is
stepped (no other read of the store comes between), and what follows
the call at once tells the test that its answer is applied: a prune,
which the keeper makes right after a beat or a look when both are due,
or the hooks."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import batch
import store
from store.ledger import Ledger
from tests.helpers import TIMEOUT, MakeRunner, Recorder, Script, StepClock

pytestmark = pytest.mark.timeout(30)

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")

#: The runner's lease: it beats every third of it, by the stepped clock.
LAPSE = 30.0


class Held:
    """One of the runner's store calls (the ``Ledger`` method ``name``),
    with ``meanwhile(answer)`` called inside it once armed, after the store
    answered, until it says it acted (``acted`` is set then). What it
    raises is kept, and raised again in the test's thread by
    :meth:`check`: the runner's thread would only log it. ``applied`` is
    set at the runner's next prune after the call acted: its answer is
    applied by then."""

    def __init__(self, db: store.Store, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.armed = False
        self.meanwhile: Any = None
        self.error: BaseException | None = None
        self.acted = threading.Event()
        self.applied = threading.Event()
        ledger = Ledger.of(db)
        real_call, real_prune = getattr(ledger, name), db.prune

        def call(*args: Any, **kwargs: Any) -> Any:
            got = real_call(*args, **kwargs)
            if self.armed:
                try:
                    acted = self.meanwhile(got)
                except BaseException as e:  # the test's thread raises it
                    self.error, acted = e, True
                if acted:
                    self.armed = False
                    self.acted.set()
            return got

        def prune(*args: Any, **kwargs: Any) -> int:
            if self.acted.is_set():
                self.applied.set()
            return real_prune(*args, **kwargs)

        monkeypatch.setattr(ledger, name, call)
        monkeypatch.setattr(db, "prune", prune)

    def check(self, done: threading.Event) -> None:
        """Wait for ``done``; raise what ``meanwhile`` raised, if it did."""
        assert done.wait(TIMEOUT), "the call never came, or never acted"
        if self.error is not None:
            raise self.error


def paused_meanwhile(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch, call: str, tick: float
) -> None:
    """Alice paused through the runner from inside its store ``call`` (which
    read that nothing is paused), made by stepping the clock ``tick``: her
    job stays held after the call is applied, and bob's goes on alone
    until she is unpaused."""
    clock, fetch, held = StepClock(), Script(), Held(db, monkeypatch, call)
    fetch.hold("a0")
    config: dict[str, Any] = {"workers": 1, "takeover_after": LAPSE, "keep": {"done": 3600.0}}
    with runner(db, fetch, clock=clock, **config) as r:
        a = r.submit(ALICE, ["a0", "a1"])
        b = r.submit(BOB, ["b0", "b1"])
        fetch.started("a0")

        def pause_alice(got: store.Beat | store.Look) -> bool:
            assert not got.paused.callers  # read before the pause
            r.pause(ALICE)
            return True

        held.meanwhile, held.armed = pause_alice, True
        clock.tick(tick)
        held.check(held.applied)
        fetch.release("a0")
        assert r.wait(BOB, b, TIMEOUT).status == "done"
        assert fetch.calls == ["a0", "b0", "b1"], "alice's job went on while paused"
        r.unpause(ALICE)
        assert r.wait(ALICE, a, TIMEOUT).status == "done"


def test_a_pause_made_while_a_beat_reads_the_store_is_not_lifted_by_that_read(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beat is due (and the look before it, which reads before the
    pause): the beat's read is the stale one."""
    paused_meanwhile(db, runner, monkeypatch, "beat_runner", LAPSE / 3)


def test_a_pause_made_while_a_look_reads_the_store_is_not_lifted_by_that_read(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look is due, and a prune, not the beat: the look's read is the
    stale one."""
    paused_meanwhile(db, runner, monkeypatch, "look", 1.0)


def test_a_job_cancelled_while_the_beat_that_takes_it_is_under_way_never_starts(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``max_live=1`` the second job waits for room; the beat that
    takes it once the first ends is under way when it is cancelled: it
    leaves the runner as it joins (the depth goes 1 and back to 0 at once),
    and none of its targets is fetched."""
    fetch, held, hooks = Script(), Held(db, monkeypatch, "beat_runner"), Recorder()
    fetch.hold("a0", "c0")  # c0 held: a job that started it would stay live
    config: dict[str, Any] = {"workers": 1, "takeover_after": LAPSE, "max_live": 1}
    with runner(db, fetch, hooks, clock=StepClock(), **config) as r:
        first = r.submit(ALICE, ["a0"])
        second = r.submit(ALICE, ["c0", "c1"])
        fetch.started("a0")

        def cancel_taken(got: store.Beat) -> bool:
            if not got.taken:
                return False
            assert [row.id for row, _ in got.taken] == [second]
            assert r.cancel(ALICE, second)
            return True

        held.meanwhile, held.armed = cancel_taken, True
        fetch.release("a0")  # the first ends: room frees, the keeper beats
        assert r.wait(ALICE, first, TIMEOUT).status == "done"
        held.check(held.acted)
        # The first left; the second came and went at once.
        hooks.wait_for(lambda h: h.depths[-3:] == [0, 1, 0])
        assert r.status(ALICE, second).status == "cancelled"
        fetch.release("c0")
    assert fetch.calls == ["a0"]


def test_the_room_a_submit_held_is_given_back_when_its_store_call_fails(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``max_live=1`` a submit whose store call raises holds no room
    after it: the next submit's job joins at once and runs."""
    ledger = Ledger.of(db)
    real = ledger.create_jobs
    fail = [store.StoreError("disk I/O error")]

    def create_jobs(*args: Any, **kwargs: Any) -> list[str]:
        if fail:
            raise fail.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(ledger, "create_jobs", create_jobs)
    with runner(db, Script(), clock=StepClock(), workers=1, max_live=1) as r:
        with pytest.raises(batch.StoreFailed):
            r.submit(ALICE, ["lost"])
        job_id = r.submit(ALICE, ["kept"])
        assert r.statistics().live == 1, "the job waits for room no one holds"
        assert r.wait(ALICE, job_id, TIMEOUT).status == "done"
