"""What a runner does while a beat's store call is under way with its lock
let go (``batch.calls``): the beat's read may predate it, and it wins.

Each test makes the change from inside the beat's store call, after the
store answered and before the runner applies the answer, so the moment
is the one a busy machine only hits by luck. The runner's clock is
stepped (no look at the store comes between), and what follows the beat
at once tells the test that its answer is applied: a prune, which the
keeper makes right after a beat when both are due, or the hooks."""

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


class HeldBeat:
    """The store's beat for one runner, with ``meanwhile`` called once,
    inside the armed beat's call, after the store answered; ``applied`` is
    set once the runner applied that answer (at its next prune)."""

    def __init__(self, db: store.Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.armed = False
        self.meanwhile: Any = None
        self.beaten = threading.Event()
        self.applied = threading.Event()
        ledger = Ledger.of(db)
        real_beat, real_prune = ledger.beat_runner, db.prune

        def beat_runner(*args: Any, **kwargs: Any) -> store.Beat:
            got = real_beat(*args, **kwargs)
            if self.armed and self.meanwhile(got):
                self.armed = False
                self.beaten.set()
            return got

        def prune(*args: Any, **kwargs: Any) -> int:
            if self.beaten.is_set():
                self.applied.set()
            return real_prune(*args, **kwargs)

        monkeypatch.setattr(ledger, "beat_runner", beat_runner)
        monkeypatch.setattr(db, "prune", prune)


def test_a_pause_made_while_a_beat_reads_the_store_is_not_lifted_by_that_read(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The beat read that nothing is paused; alice was paused meanwhile
    through this runner: her job stays held after the beat, and bob's
    goes on alone until she is unpaused."""
    clock, fetch, held = StepClock(), Script(), HeldBeat(db, monkeypatch)
    fetch.hold("a0")
    config: dict[str, Any] = {"workers": 1, "takeover_after": LAPSE, "keep": {"done": 3600.0}}
    with runner(db, fetch, clock=clock, **config) as r:
        a = r.submit(ALICE, ["a0", "a1"])
        b = r.submit(BOB, ["b0", "b1"])
        fetch.started("a0")

        def pause_alice(got: store.Beat) -> bool:
            assert not got.paused.callers  # read before the pause
            r.pause(ALICE)
            return True

        held.meanwhile, held.armed = pause_alice, True
        clock.tick(LAPSE / 3)
        assert held.applied.wait(TIMEOUT), "the beat was never applied"
        fetch.release("a0")
        assert r.wait(BOB, b, TIMEOUT).status == "done"
        assert fetch.calls == ["a0", "b0", "b1"], "alice's job went on while paused"
        r.unpause(ALICE)
        assert r.wait(ALICE, a, TIMEOUT).status == "done"


def test_a_job_cancelled_while_the_beat_that_takes_it_is_under_way_never_starts(
    db: store.Store, runner: MakeRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``max_live=1`` the second job waits for room; the beat that
    takes it once the first ends is under way when it is cancelled: it
    leaves the runner as it joins (the depth goes 1 and back to 0 at once),
    and none of its targets is fetched."""
    fetch, held, hooks = Script(), HeldBeat(db, monkeypatch), Recorder()
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
        hooks.wait_for(
            lambda h: h.depths[-3:] == [0, 1, 0]
        )  # the first left; the second came and went
        assert held.beaten.is_set()
        assert r.status(ALICE, second).status == "cancelled"
        fetch.release("c0")
    assert fetch.calls == ["a0"]
