"""Pacing per upstream (SPEC §2d): how fast, how many at once, and when the
targets of one upstream may start, whatever their job.

:class:`~batch.model.Limit` is what a user configures for an upstream; :class:`Pace` is
what a runner keeps of one upstream while it fetches from it: the tokens of
its rate, its targets in flight, how long a busy answer holds it, its
breaker, and (``adaptive``) the limits its answers have taught. A ``Pace``
is plain state: the runner's lock guards it, and every method takes the
time (the runner's monotonic clock) and a source of jitter, so a test steps
both.

The invariants, whenever no method runs:

1. ``inflight`` is the targets of the upstream started and not finished.
2. ``tokens <= burst``; a start takes one; none starts without one.
3. No target starts before ``held_until``: a busy answer's ``after``, or
   its backoff, holds every target of the upstream, not only its own.
4. An open breaker starts nothing until ``cool_down`` after it opened;
   then one trial, and nothing beside it until that trial's answer.
5. ``concurrency`` and ``rate`` (the ones in force) never exceed the
   configured ones; adaptive ones never go below one target at a time and
   ``MIN_RATE`` starts a second.
6. Across the store's runners: an upstream with a ``concurrency`` or a
   ``rate`` starts nothing without its share from a sync younger than
   ``share_until``; its ``slots`` bound what it has in flight and its
   share of the rate its starts (``store.jobs.upstreams`` grants the shares).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum

from store import UpstreamShare

from .model import Limit, Target, UpstreamState

__all__ = ["Answer", "BreakerState", "Pace", "Paces"]

log = logging.getLogger("batch")

#: How much longer each busy answer without ``after`` holds its upstream
#: than the last, while they come one after another.
BACKOFF_FACTOR = 2.0
#: The longest a busy answer without ``after`` holds its upstream (seconds).
BACKOFF_MAX = 60.0
#: A backoff is forgotten (the next busy answer holds for ``retry_wait``
#: again) once no busy answer came for this many times the last backoff.
QUIET_SPELL = 4.0
#: The least rate an adaptive upstream is cut to (starts a second).
MIN_RATE = 0.1
#: The adaptive rate. At the first busy answer the upstream gets a rate,
#: ``CUT`` of the one it was answered at, which then doubles each second
#: without a busy answer: the upstream's own rate is not known yet. From the
#: next busy answer on, the rate that drew one is the upstream's ``ceiling``
#: (the least of them lately): the rate falls to ``CUT`` of it and climbs back
#: to ``BELOW`` of it (``REGAIN`` of the gap a second); only after
#: ``QUIET_PROBE`` seconds without a busy answer does it probe higher
#: (``PROBE`` of itself a second), lifting the ceiling with it. Every busy
#: answer costs the upstream's whole hold, so the rate stays just under.
CUT = 0.9
BELOW = 0.92
REGAIN = 1.0
QUIET_PROBE = 20.0
PROBE = 0.01
#: A busy answer within this many seconds of the last one lowers the
#: ceiling below the rate that drew it (``CUT`` of it).
AGAIN = 5.0
#: At a busy answer, an adaptive concurrency is cut to this share of what
#: was in flight (at least one).
HALVE = 0.5
#: Seconds after which a runner forgets an upstream it has not used, that
#: is not held and whose breaker is closed (what adaptive pacing learned of
#: it goes too): a crawl of many hosts keeps no pace per host for ever.
FORGET_AFTER = 300.0
#: Seconds of starts an adaptive upstream counts to know the rate it runs at.
WINDOW = 1.0
#: A fetch slower than this many times the fastest of its upstream lately
#: counts as the latency rising: an adaptive concurrency stops growing.
SLOW = 2.0


class BreakerState(StrEnum):
    """An upstream's breaker: ``closed`` (targets start), ``open`` (none
    starts until its cool-down ends), ``trial`` (one has started, the
    rest wait for its answer)."""

    CLOSED = "closed"
    OPEN = "open"
    TRIAL = "trial"


class Answer(StrEnum):
    """What a target's fetch came to, as its upstream's pace learns it."""

    DONE = "done"
    FAILED = "failed"  # for good: counts toward the breaker
    BUSY = "busy"  # to be tried again: holds the upstream


class Pace:
    """What a runner keeps of one upstream: see the module's invariants.

    ``wait(now)`` says whether a target may start; ``start(now)`` and
    ``finish(...)`` report one that did and its answer.
    """

    __slots__ = (
        "backoff",
        "breaker",
        "busy",
        "ceiling",
        "concurrency",
        "done",
        "failed",
        "failures",
        "fastest",
        "filled_at",
        "grown_at",
        "held_said",
        "held_until",
        "inflight",
        "last_busy",
        "limit",
        "name",
        "opened_at",
        "publish",
        "rate",
        "retry_wait",
        "runners",
        "share_rate",
        "share_until",
        "slots",
        "started",
        "steady",
        "tokens",
        "told",
        "used_at",
    )

    def __init__(self, name: str, limit: Limit, retry_wait: float, now: float) -> None:
        self.name = name
        self.limit = limit
        self.retry_wait = retry_wait  # the first backoff of a busy answer without ``after``
        self.inflight = 0
        # In force: the configured ones, or (adaptive) what the answers taught.
        self.concurrency: float | None = limit.concurrency
        self.rate: float | None = limit.rate
        if limit.adaptive and self.concurrency is None:
            self.concurrency = 1.0  # grows from one at a time
        # Adaptive: the least rate that drew a busy answer lately (None: not
        # known yet), and whether it is known (else the rate doubles).
        self.ceiling: float | None = None
        self.steady = False
        self.tokens = float(limit.burst)
        self.filled_at = now
        self.held_until = -math.inf
        self.held_said = False  # the hold in force was told to the hooks
        self.backoff = 0.0  # the last backoff a busy answer gave (0: none to remember)
        self.last_busy = -math.inf
        self.fastest = math.inf  # seconds of the fastest fetch lately
        self.grown_at = now  # when an adaptive rate last grew
        # Adaptive: the start times of the last WINDOW seconds.
        self.started: deque[float] = deque()
        self.breaker = BreakerState.CLOSED
        self.failures = 0  # failed for good, in a row
        self.opened_at = -math.inf
        self.done = self.busy = self.failed = 0
        # Its share among the store's runners, from the last sync: how many
        # want the upstream, the slots it may use and the starts a second
        # (None: no such limit), and until when the share holds; a limited
        # upstream starts nothing without one.
        self.runners = 1
        self.slots: int | None = None
        self.share_rate: float | None = None
        self.share_until = -math.inf
        self.told = 0  # the jobs wanting it, as the last sync told the store
        self.publish = False  # a hold of its own to tell the others at the next sync
        self.used_at = now  # when a target of it last started or came back

    @property
    def limited(self) -> bool:
        """Whether it has a limit the store's runners share."""
        return self.limit.concurrency is not None or self.limit.rate is not None

    def wait(self, now: float) -> float | None:
        """0.0 if a target of the upstream may start at ``now``; else the
        seconds until one may (held, out of tokens, breaker cooling down);
        None if only a finish or a sync can let one start (as many in
        flight as allowed, a breaker's trial in flight, no share of the
        store's limits yet)."""
        if self.breaker is BreakerState.TRIAL:
            return None
        if self.limited and now >= self.share_until:
            return None  # its share is unknown, or stale: the next sync tells
        if self.concurrency is not None and self.inflight >= math.floor(self.concurrency):
            return None
        if self.slots is not None and self.inflight >= self.slots:
            return None
        later = self.held_until - now
        if self.breaker is BreakerState.OPEN:
            later = max(later, self.opened_at + self.limit.cool_down - now)
        rate = self._rate()
        if rate is not None:
            self._refill(now)
            if self.tokens < 1:
                if rate <= 0:
                    return None  # no share of the rate yet: the next sync
                later = max(later, (1 - self.tokens) / rate)
        return max(0.0, later)

    def start(self, now: float) -> None:
        """A target of the upstream starts (``wait(now)`` said 0.0)."""
        self.inflight += 1
        self.used_at = now
        if self.limit.adaptive:
            self.started.append(now)
            while self.started[0] <= now - WINDOW:
                self.started.popleft()
        if self._rate() is not None:
            self._refill(now)
            self.tokens -= 1
        if self.breaker is BreakerState.OPEN:
            self.breaker = BreakerState.TRIAL

    def finish(
        self,
        now: float,
        answer: Answer,
        seconds: float,
        after: float,
        jitter: random.Random,
    ) -> None:
        """A target started by :meth:`start` came back: ``answer``, after
        ``seconds`` of fetch; ``after`` is the least wait a busy answer
        asked for (0: none), ``jitter`` what spreads a backoff."""
        self.inflight -= 1
        self.used_at = now
        if answer is Answer.BUSY:
            self.busy += 1
            self._held(now, after, jitter)
            if self.breaker is BreakerState.TRIAL:
                self.breaker = BreakerState.OPEN  # the trial is tried again after the hold
            return
        if answer is Answer.DONE:
            self.done += 1
            self.failures = 0
            self.breaker = BreakerState.CLOSED
        else:
            self.failed += 1
            self.failures += 1
            tripped = self.limit.break_after is not None and self.failures >= self.limit.break_after
            if self.breaker is BreakerState.TRIAL or tripped:
                self.breaker, self.opened_at = BreakerState.OPEN, now
        if self.limit.adaptive:
            self._learn(now, seconds)

    def starved(self, now: float) -> bool:
        """Whether none of its targets may start at ``now`` until a sync (its
        share is unknown or lapsed, or lets none start: no slot, none of the
        rate) while the store was last told it wants none: then a sync,
        telling the jobs that want it now, may give it one. (The store told
        it wants some and gave none: the next sync rebalances.) An upstream
        met while paused, say, was synced wanting none, and has no share."""
        return (
            self.limited
            and not self.told
            and (now >= self.share_until or self.slots == 0 or self.share_rate == 0)
        )

    def idle(self, now: float) -> bool:
        """Whether it may be forgotten at ``now`` (see ``FORGET_AFTER``)."""
        return (
            not self.inflight
            and not self.publish
            and self.held_until <= now
            and self.breaker is BreakerState.CLOSED
            and now - self.used_at > FORGET_AFTER
        )

    def hold_to_publish(self, now: float) -> float:
        """Seconds from ``now`` of the hold a busy answer of its own put on
        it since the last sync (0: none), for the other runners."""
        publish, self.publish = self.publish, False
        return max(0.0, self.held_until - now) if publish else 0.0

    def shared(self, share: UpstreamShare, now: float, lapse: float) -> None:
        """Its share among the store's runners, as a sync at ``now`` said:
        good for ``lapse`` seconds unless synced again."""
        self.runners = share.runners
        self.slots = share.slots
        self.share_rate = share.rate
        self.held_until = max(self.held_until, now + share.held_for)
        self.share_until = now + lapse

    def why(self, now: float) -> str:
        """What keeps a target of it from starting at ``now``: ``held`` (a
        busy answer), ``breaker``, ``share`` (no share of the store's yet),
        ``concurrency`` (as many in flight as allowed), ``rate``, or
        ``free`` (nothing: its turn is coming)."""
        if self.breaker is not BreakerState.CLOSED and (
            self.breaker is BreakerState.TRIAL or now < self.opened_at + self.limit.cool_down
        ):
            return "breaker"
        if self.held_until > now:
            return "held"
        if self.limited and now >= self.share_until:
            return "share"
        cap = [c for c in (self.concurrency, self.slots) if c is not None]
        if cap and self.inflight >= math.floor(min(cap)):
            return "concurrency"
        return "rate" if self.wait(now) else "free"

    def explain(self, now: float) -> dict[str, object]:
        """Where it stands at ``now``, for ``Runner.explain``."""
        state = self.state(now, 0)
        return {
            "upstream": self.name,
            "held_until": state.held_until,
            "inflight": self.inflight,
            "concurrency": self.slots if self.slots is not None else self.concurrency,
            "rate": self._rate(),
            "breaker": state.breaker,
        }

    def state(self, now: float, waiting: int) -> UpstreamState:
        """What users see of it at ``now``, with ``waiting`` jobs parked on it."""
        return UpstreamState(
            name=self.name,
            limit=self.limit,
            concurrency=self.concurrency,
            rate=self.rate,
            inflight=self.inflight,
            waiting=waiting,
            held_until=time.time() + self.held_until - now if self.held_until > now else None,
            breaker=self.breaker.value,
            done=self.done,
            busy=self.busy,
            failed=self.failed,
        )

    def _rate(self) -> float | None:
        """Starts a second in force: this runner's share of the configured
        rate, or (adaptive) what the answers taught, whichever is less;
        None: no rate."""
        share = None if self.limit.rate is None else self.share_rate or 0.0
        if self.rate is None or not self.limit.adaptive:
            return share
        return self.rate if share is None else min(self.rate, share)

    def _refill(self, now: float) -> None:
        """The tokens the rate has added since they were last counted."""
        rate = self._rate()
        assert rate is not None
        burst = max(1.0, self.limit.burst / self.runners)
        self.tokens = min(burst, self.tokens + (now - self.filled_at) * rate)
        self.filled_at = now

    def _held(self, now: float, after: float, jitter: random.Random) -> None:
        """A busy answer: hold the upstream for ``after``, or for a backoff
        that doubles while busy answers follow each other (with jitter: the
        second half of it drawn at random) and is forgotten after a quiet
        spell; cut the adaptive limits."""
        if after > 0:
            hold = after
        else:
            quiet = now - self.last_busy > QUIET_SPELL * self.backoff
            self.backoff = (
                self.retry_wait
                if quiet or not self.backoff
                else min(self.backoff * BACKOFF_FACTOR, BACKOFF_MAX)
            )
            hold = self.backoff / 2 + jitter.uniform(0, self.backoff / 2)
        quiet_for, self.last_busy = now - self.last_busy, now
        held = self.held_until > now  # by an answer of the same burst: cut once
        if now + hold > self.held_until:
            self.held_until = now + hold
            self.publish = True
        if self.limit.adaptive and not held:
            self._cut(now, quiet_for)

    def _cut(self, now: float, quiet_for: float) -> None:
        """A busy answer to an adaptive upstream: cut its rate and
        concurrency (see ``CUT``)."""
        # The rate that drew it: the one in force, or (none yet) the one the
        # starts of the last WINDOW ran at.
        enforced = self._rate() if self.rate is not None else None
        drew = max(MIN_RATE, len(self.started) / WINDOW if enforced is None else enforced)
        if self.rate is None:
            self.rate = max(MIN_RATE, drew * CUT)
        else:
            if self.steady and self.ceiling is not None:
                drew = min(self.ceiling, drew)
                if quiet_for < AGAIN:
                    drew *= CUT  # busy again soon after: the ceiling is too high
            self.ceiling, self.steady = drew, True
            self.rate = max(MIN_RATE, drew * CUT)
        self.tokens, self.filled_at, self.grown_at = min(self.tokens, 0.0), now, now
        assert self.concurrency is not None
        self.concurrency = max(1.0, (self.inflight + 1) * HALVE)

    def _learn(self, now: float, seconds: float) -> None:
        """An answer that was not busy: an adaptive upstream's limits grow,
        the concurrency by one per window of answers while fetches stay
        fast, the rate as ``CUT`` says."""
        self.fastest = min(self.fastest, seconds)
        assert self.concurrency is not None
        most = self.limit.concurrency
        if seconds <= SLOW * self.fastest:
            grown = self.concurrency + 1 / max(1.0, self.concurrency)
            self.concurrency = grown if most is None else min(float(most), grown)
        elif self.concurrency > 1:
            self.concurrency = max(1.0, self.concurrency - 1 / self.concurrency)
        if self.rate is not None:
            step = min(1.0, now - self.grown_at)
            self.grown_at = now
            if not self.steady or self.ceiling is None:
                grown = self.rate * 2**step
            elif now - self.last_busy < QUIET_PROBE:
                grown = self.rate + max(0.0, self.ceiling * BELOW - self.rate) * REGAIN * step
            else:
                grown = self.rate * (1 + PROBE * step)
                self.ceiling = max(self.ceiling, grown / BELOW)
            self.rate = grown if self.limit.rate is None else min(self.limit.rate, grown)


class Paces:
    """The paces of the upstreams a runner fetches from, each made at its
    first target. Guarded by the runner's lock.

    ``upstream`` is the user's ``Config.upstream``: it runs under the lock,
    each time a job's turn comes, so it must be quick (``batch.web.host_of``
    is). If it raises, the target goes unpaced, and the error is logged
    with its traceback.
    """

    __slots__ = (
        "_limits",
        "_paces",
        "_upstream",
        "fresh",
        "jitter",
        "met",
        "news",
        "retry_wait",
    )

    def __init__(
        self,
        upstream: Callable[[Target], str | None],
        limits: Mapping[str, Limit],
        retry_wait: float,
        jitter: random.Random,
    ) -> None:
        self._upstream = upstream
        self._limits = limits
        self._paces: dict[str, Pace] = {}
        self.retry_wait = retry_wait
        self.jitter = jitter
        # A pace made, or a hold of its own, since the last sync: sync soon.
        self.fresh = False
        # Upstreams met (a pace made) since the last sync: the store keeps
        # their names, so that a pause may name them (``store.jobs.pauses``).
        self.met: list[str] = []
        # Holds begun and ended, for the hooks, in order: (upstream, seconds
        # held, or None once released).
        self.news: list[tuple[str, float | None]] = []

    def watch(self, pace: Pace, now: float) -> None:
        """``pace`` may have been held, or released, at ``now``: say so once."""
        held = pace.held_until > now
        if held and not pace.held_said:
            self.news.append((pace.name, pace.held_until - now))
        elif not held and pace.held_said and pace.inflight:
            self.news.append((pace.name, None))
        else:
            return
        pace.held_said = held

    def __iter__(self) -> Iterator[Pace]:
        return iter(list(self._paces.values()))

    def forget(self, name: str) -> None:
        """Drop the pace of upstream ``name``: it was idle."""
        del self._paces[name]

    def get(self, name: str) -> Pace | None:
        """The pace of upstream ``name``, if it has one yet."""
        return self._paces.get(name)

    def of(self, target: Target, now: float) -> Pace | None:
        """The pace of ``target``'s upstream (None: it has none)."""
        try:
            name = self._upstream(target)
        except Exception:  # the user's function: a target it cannot name goes unpaced
            log.exception("Config.upstream raised for target %r; it goes unpaced", target.ref)
            return None
        if name is None:
            return None
        pace = self._paces.get(name)
        if pace is None:
            limit = self._limits.get(name) or self._limits.get("*") or Limit()
            pace = self._paces[name] = Pace(name, limit, self.retry_wait, now)
            self.fresh = True
            self.met.append(name)
        return pace
