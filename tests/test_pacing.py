"""One upstream's pace (SPEC §2d), on its own: the rate, the concurrency,
busy answers that hold the upstream, the breaker and the adaptive limits,
with the time stepped by the test and the jitter seeded."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import batch
from batch import Limit
from batch.pacing import (
    BACKOFF_MAX,
    BELOW,
    CUT,
    FORGET_AFTER,
    HALVE,
    MIN_RATE,
    QUIET_SPELL,
    Answer,
    BreakerState,
    Pace,
)
from store import UpstreamShare

RETRY_WAIT = 1.0


def pace(now: float = 0.0, **limit: object) -> Pace:
    """A pace alone on its store: its share is the whole upstream, for good."""
    p = Pace("https://example.org:443", Limit(**limit), RETRY_WAIT, now)  # type: ignore[arg-type]
    p.shared(UpstreamShare(1, p.limit.concurrency, p.limit.rate, 0.0), now, math.inf)
    return p


def finish(p: Pace, now: float, answer: Answer, seconds: float = 0.01, after: float = 0.0) -> None:
    p.finish(now, answer, seconds, after, random.Random(0))


def answered(p: Pace, now: float, times: int, every: float) -> float:
    """``times`` targets of ``p`` started and answered done, ``every``
    seconds apart from ``now`` on; the time after the last."""
    for _ in range(times):
        p.start(now)
        finish(p, now, Answer.DONE)
        now += every
    return now


def test_no_limit_never_waits() -> None:
    p = pace()
    for _ in range(100):
        assert p.wait(0.0) == 0.0
        p.start(0.0)
    assert p.inflight == 100


def test_a_rate_spaces_the_starts() -> None:
    p = pace(rate=10.0)
    assert p.wait(0.0) == 0.0
    p.start(0.0)
    assert p.wait(0.0) == pytest.approx(0.1)
    assert p.wait(0.05) == pytest.approx(0.05)
    assert p.wait(0.1) == 0.0


def test_a_burst_starts_at_once_after_a_quiet_spell() -> None:
    p = pace(rate=10.0, burst=3)
    for _ in range(3):
        assert p.wait(5.0) == 0.0
        p.start(5.0)
    assert p.wait(5.0) == pytest.approx(0.1)


def test_concurrency_waits_for_a_finish_not_a_time() -> None:
    p = pace(concurrency=2)
    p.start(0.0)
    p.start(0.0)
    assert p.wait(100.0) is None
    finish(p, 1.0, Answer.DONE)
    assert p.wait(1.0) == 0.0


def test_a_busy_answer_with_after_holds_every_target_of_the_upstream() -> None:
    p = pace()
    p.start(0.0)
    p.start(0.0)
    finish(p, 1.0, Answer.BUSY, after=5.0)
    assert p.wait(1.0) == pytest.approx(5.0)
    # A shorter hold after it does not shorten it.
    finish(p, 2.0, Answer.BUSY, after=1.0)
    assert p.wait(2.0) == pytest.approx(4.0)
    assert p.wait(6.0) == 0.0
    assert p.busy == 2


def test_busy_answers_without_after_back_off_doubling_with_jitter_then_are_forgotten() -> None:
    p = pace()
    holds = []
    now = 0.0
    for _ in range(10):
        p.start(now)
        finish(p, now, Answer.BUSY)
        hold = p.wait(now)
        assert hold is not None
        holds.append((hold, p.backoff))
        now += hold  # the next busy answer as soon as the hold ends
    for hold, backoff in holds:
        assert backoff / 2 <= hold <= backoff
    backoffs = [b for _, b in holds]
    assert backoffs[:4] == [RETRY_WAIT, 2 * RETRY_WAIT, 4 * RETRY_WAIT, 8 * RETRY_WAIT]
    assert max(backoffs) == BACKOFF_MAX
    # A quiet spell: the next busy answer starts from retry_wait again.
    now += QUIET_SPELL * BACKOFF_MAX + 1
    p.start(now)
    finish(p, now, Answer.BUSY)
    assert p.backoff == RETRY_WAIT


def test_the_breaker_opens_cools_down_tries_one_and_closes_or_opens_again() -> None:
    p = pace(break_after=3, cool_down=30.0)
    for _ in range(3):
        p.start(0.0)
        finish(p, 1.0, Answer.FAILED)
    assert p.breaker is BreakerState.OPEN
    assert p.wait(1.0) == pytest.approx(30.0)
    p.start(31.0)  # the trial
    assert p.breaker is BreakerState.TRIAL
    assert p.wait(31.0) is None  # nothing beside it
    finish(p, 32.0, Answer.FAILED)
    assert p.breaker is BreakerState.OPEN
    assert p.wait(32.0) == pytest.approx(30.0)  # cools down again, from its answer
    p.start(62.0)
    finish(p, 63.0, Answer.DONE)
    assert p.breaker is BreakerState.CLOSED
    assert p.wait(63.0) == 0.0


def test_a_success_between_failures_keeps_the_breaker_closed() -> None:
    p = pace(break_after=2)
    for answer in (Answer.FAILED, Answer.DONE, Answer.FAILED, Answer.BUSY, Answer.DONE):
        p.start(0.0)
        finish(p, 0.0, answer)
    assert p.breaker is BreakerState.CLOSED


def test_adaptive_learns_a_rate_from_the_busy_answers_and_stays_below_it() -> None:
    p = pace(adaptive=True)
    now = answered(p, 0.0, 50, 0.02)  # 50 starts in the last second, one at a time
    assert p.rate is None
    p.start(now)
    finish(p, now, Answer.BUSY, after=1.0)
    assert p.rate == pytest.approx(50.0 * CUT)
    assert p.ceiling is None  # not the upstream's rate yet: it doubles meanwhile
    now += 1.0
    p.start(now)
    finish(p, now, Answer.DONE)
    assert p.rate == pytest.approx(2 * 50.0 * CUT)
    # The next busy answer sets the ceiling: the rate that drew it.
    p.start(now)
    finish(p, now, Answer.BUSY, after=1.0)
    assert p.ceiling == pytest.approx(2 * 50.0 * CUT)
    # Another answer of the same burst, while held, cuts nothing more.
    finish(p, now, Answer.BUSY, after=1.0)
    assert p.rate == pytest.approx(p.ceiling * CUT)
    # Quiet answers bring it back just under the ceiling, not past it.
    answered(p, now + 0.05, 200, 0.05)
    assert p.rate == pytest.approx(p.ceiling * BELOW, rel=0.01)


def test_adaptive_never_goes_above_what_is_configured() -> None:
    p = pace(adaptive=True, rate=5.0, concurrency=3)
    answered(p, 0.0, 1000, 0.2)
    assert p.rate == 5.0
    assert p.concurrency == 3.0


def test_adaptive_cuts_concurrency_at_a_busy_answer() -> None:
    p = pace(adaptive=True, concurrency=10)
    now = answered(p, 0.0, 200, 1.0)
    assert p.concurrency == 10.0
    for _ in range(8):
        p.start(now)
    finish(p, now, Answer.BUSY)
    assert p.concurrency == pytest.approx(max(1.0, 8 * HALVE))
    assert p.rate is not None and p.rate >= MIN_RATE


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("concurrency", 0, ValueError),
        ("concurrency", 1.5, TypeError),
        ("rate", 0, ValueError),
        ("rate", math.inf, ValueError),
        ("rate", "20/s", TypeError),
        ("burst", 0, ValueError),
        ("adaptive", "yes", TypeError),
        ("break_after", True, TypeError),
        ("cool_down", -1.0, ValueError),
    ],
)
def test_a_bad_limit_is_refused_naming_its_field(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=f"Limit.{field}"):
        Limit(**{field: value})  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.5, 50.0),
    burst=st.integers(1, 5),
    concurrency=st.integers(1, 6),
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 0.5),
            st.sampled_from([None, *Answer]),
        ),
        max_size=200,
    ),
)
def test_starts_never_exceed_the_bucket_nor_the_concurrency(
    rate: float, burst: int, concurrency: int, steps: list[tuple[float, Answer | None]]
) -> None:
    """Whatever the answers and their timing: in any span of T seconds at
    most ``burst + rate * T`` targets start, never more than
    ``concurrency`` are in flight, and none starts while held."""
    p = pace(rate=rate, burst=burst, concurrency=concurrency)
    now, starts = 0.0, []
    for gap, answer in steps:
        now += gap
        if answer is None:
            if p.wait(now) == 0.0:
                assert now >= p.held_until
                p.start(now)
                starts.append(now)
        elif p.inflight:
            finish(p, now, answer, after=gap)
        assert p.inflight <= concurrency
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= burst + rate * (starts[j] - first) + 1e-6


def test_a_limited_upstream_starts_nothing_until_its_share_is_known() -> None:
    p = Pace("u", Limit(rate=10.0), RETRY_WAIT, 0.0)
    assert p.wait(0.0) is None
    p.shared(UpstreamShare(runners=2, slots=None, rate=5.0, held_for=0.0), 0.0, 5.0)
    assert p.wait(0.0) == 0.0
    p.start(0.0)
    assert p.wait(0.0) == pytest.approx(0.2)  # its share: half the rate
    assert p.wait(5.0) is None  # the share went stale: no sync for its lapse


def test_the_slots_granted_bound_the_concurrency() -> None:
    p = Pace("u", Limit(concurrency=4), RETRY_WAIT, 0.0)
    p.shared(UpstreamShare(runners=2, slots=1, rate=None, held_for=3.0), 0.0, 5.0)
    assert p.wait(0.0) == pytest.approx(3.0)  # held by another runner's busy answer
    p.start(3.0)
    assert p.wait(3.0) is None


def test_an_idle_upstream_may_be_forgotten_once_nothing_of_it_is_pending() -> None:
    p = pace(break_after=1)
    p.start(0.0)
    assert not p.idle(1000.0)  # in flight
    finish(p, 1.0, Answer.FAILED)  # the breaker opens
    assert not p.idle(1000.0)
    p.start(100.0)
    finish(p, 100.0, Answer.DONE)
    assert not p.idle(100.0 + FORGET_AFTER)
    assert p.idle(101.0 + FORGET_AFTER)
    p.start(500.0)
    finish(p, 500.0, Answer.BUSY, after=1000.0)
    assert not p.idle(600.0 + FORGET_AFTER)  # held


def test_why_names_what_keeps_a_target_from_starting() -> None:
    p = Pace("u", Limit(concurrency=1, rate=1.0, break_after=1, cool_down=10.0), RETRY_WAIT, 0.0)
    assert p.why(0.0) == "share"
    p.shared(UpstreamShare(runners=1, slots=1, rate=1.0, held_for=0.0), 0.0, math.inf)
    assert p.why(0.0) == "free"
    p.start(0.0)
    assert p.why(0.0) == "concurrency"
    finish(p, 0.1, Answer.DONE)
    assert p.why(0.1) == "rate"  # its one token a second is spent
    assert p.why(1.0) == "free"
    p.start(1.0)
    finish(p, 1.1, Answer.BUSY, after=5.0)
    assert p.why(1.1) == "held"
    p.start(6.2)
    finish(p, 6.3, Answer.FAILED)
    assert p.why(6.3) == "breaker"
    assert p.why(16.4) == "free"


def test_a_bad_pacing_config_is_refused_naming_the_field() -> None:
    with pytest.raises(TypeError, match=r"Config\.upstream must be callable"):
        batch.Config(upstream="host")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Config\.limits must be a mapping"):
        batch.Config(limits=[Limit()])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Config.limits\['h'\] must be a batch.Limit"):
        batch.Config(limits={"h": 20})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"Config\.limits keys are upstreams"):
        batch.Config(limits={"": Limit()})
