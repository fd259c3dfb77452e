"""The keeper thread: a beat on time (``beat``: leases renewed, jobs taken
and adopted or ended), ``running`` stored promptly when no batch carries
it, a look for jobs cancelled elsewhere, and the runner's leases released
at the end."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TypeVar

import store

from .beat import PER_LEASE, Resume, beat
from .commit import give_back_starting, take_starting
from .locks import unlocked
from .state import State
from .timeouts import all_hung

__all__ = ["CANCEL_POLL", "keep", "on_notice"]

log = logging.getLogger("batch")

C = TypeVar("C")

#: Seconds a job's ``running`` status waits for a batch of outcomes to carry
#: it before the keeper writes it on its own (the store shows it within 0.1 s).
START_DELAY = 0.02

#: Seconds between looks, while this runner has live jobs, for those
#: cancelled through a runner of another process (one of this process tells
#: it at once, and so does the store's notice on PostgreSQL; the look is for
#: a notice lost), and at what is paused on the store; and, while a runner
#: that resumes any caller's jobs has room, for a job that waits for one.
CANCEL_POLL = 0.1

#: Seconds before a beat the store refused is tried again (at most).
RETRY_BEAT = 0.5

#: Seconds between prunes of the jobs ``Config.keep`` keeps no longer (at
#: once again while a prune finds a full batch).
PRUNE_EVERY = 1.0

#: Seconds between syncs of the upstreams a runner paces with the store
#: (at once when one appears, or a busy answer holds one).
PACE_SYNC = 0.5


def keep(s: State[C], resume: Resume) -> None:
    """The keeper thread, until the runner's workers are joined: beat three
    times per lease (and at once when room frees under ``max_live``), store
    ``running`` for jobs no batch carried within ``START_DELAY``, look for
    jobs cancelled elsewhere and at what is paused, prune what
    ``Config.keep`` keeps no longer; at the end, retire (release every
    lease)."""
    interval = s.config.takeover_after / PER_LEASE
    paces = s.rotation.paces
    keep = s.config.keep
    with s.lock:
        next_beat = s.clock.monotonic() + interval
        next_poll = next_sync = next_prune = 0.0
        shared = False  # the store holds rows of this runner's upstreams
        while not s.stopping and s.outdated is None:
            now = s.clock.monotonic()
            starting = bool(s.starting) and now >= s.starting_since + START_DELAY
            syncing = paces is not None and (paces.fresh or now >= next_sync)
            asked = s.want_room or now >= s.due_at  # a beat wanted before its time
            if now >= next_poll and (len(s.rotation) or looks_for_work(s)):
                # First of the chores, and on a cadence of its own (from
                # when the last look began): how soon a pause or a cancel
                # of another process reaches this runner rests on it. A
                # look slower than half the cadence leaves the others a
                # turn (it is never made twice in a row).
                _look(s)
                next_poll = max(now, s.clock.monotonic() - CANCEL_POLL / 2) + CANCEL_POLL
            elif now >= next_beat or (asked and not (starting or syncing)):
                # On its time the beat comes before the writes below, which
                # a slow store and jobs starting all the time could keep
                # due: the leases are renewed whatever else waits. A beat
                # the store refused is tried again soon: the gap a stall
                # leaves must be seen by the first beat after it.
                if all_hung(s):
                    # Every worker is stuck in a fetch past its time limit:
                    # no beat until one returns (which tells ``chores``),
                    # so the leases lapse and other runners take the jobs.
                    s.wait(s.chores, interval)
                    continue
                again = interval if beat(s, resume) else min(interval, RETRY_BEAT)
                next_beat = s.clock.monotonic() + again
            elif starting:
                _store_starting(s)
            elif syncing:
                shared = _sync_upstreams(s, shared)
                next_sync = s.clock.monotonic() + PACE_SYNC
            elif keep and now >= next_prune:
                next_prune = s.clock.monotonic() + (0.0 if _prune(s, keep) else PRUNE_EVERY)
            else:
                looking = len(s.rotation) or looks_for_work(s)
                due = [next_beat, s.due_at] + ([next_poll] if looking else [])
                if keep:
                    due.append(next_prune)
                if paces is not None:
                    due.append(next_sync)
                if s.starting:
                    due.append(s.starting_since + START_DELAY)
                s.wait(s.chores, min(due) - now)
        with unlocked(s.lock):
            try:
                s.ledger.retire_runner(s.id)
            except Exception:  # whatever the store or its driver raises: the keeper ends well
                log.exception("cannot release the leases of runner %s; they lapse instead", s.id)


def on_notice(s: State[C], notice: str) -> None:
    """A notice of the store's (on PostgreSQL, sent by any process; called
    on the store's thread): a job cancelled, which this runner stops at
    once if it holds it; or jobs waiting for a runner with room, or notices
    lost, either of which calls for a beat now rather than at its time."""
    if notice.startswith(store.CANCELLED):
        s.cancelled_elsewhere(notice.removeprefix(store.CANCELLED))
    elif notice in (store.WORK, store.RESYNC):
        with s.lock:
            if not s.closed and s.room() != 0:
                s.want_room = True
                s.chores.notify()


def _store_starting(s: State[C]) -> None:
    """Store ``running`` for the jobs started since the last batch."""
    starting = take_starting(s)
    trouble = s.trouble("storing jobs running")
    try:
        with unlocked(s.lock):
            s.ledger.store_targets((), starting=starting)
    except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
        trouble.failed("cannot store %d job(s) as running; trying again", len(starting))
        give_back_starting(s, starting)
        return
    trouble.ok()


def _sync_upstreams(s: State[C], shared: bool) -> bool:
    """Tell the store what this runner wants of the upstreams it paces, the
    holds of its busy answers, and the upstreams it met; take its share of
    each. ``shared``: whether the store holds rows of this runner's
    upstreams (an idle runner that wants none, has none there and met none
    makes no call). Returns whether it does now. The shares are taken as of
    the moment the sync began, as a lease is renewed from the moment its
    beat began: a share lasts no longer than its lapse from when the store
    granted it, and a hold told and told back is the one this runner had,
    however long the call took."""
    asked = s.clock.monotonic()
    wants = s.rotation.wants(asked)
    paces = s.rotation.paces
    assert paces is not None
    met, paces.met = paces.met, []
    if not wants and not shared and not met:
        return False
    trouble = s.trouble("sharing upstreams")
    lapse = s.config.takeover_after
    try:
        with unlocked(s.lock):
            shares = s.ledger.sync_upstreams(s.id, lapse, wants, met)
    except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
        trouble.failed("cannot share %d upstream(s) with the store; trying again", len(wants))
        s.rotation.not_shared(wants)
        paces.met = met + paces.met
        return True
    trouble.ok()
    s.rotation.shared(shares, asked, lapse)
    now = s.clock.monotonic()
    s.paced()
    s.pass_on(now)  # jobs parked on them may start now
    s.keep_timer(now)
    return bool(wants)


def _prune(s: State[C], keep: Mapping[str, float]) -> bool:
    """Delete a batch of the jobs of each status in ``keep`` that ended
    longer ago than it keeps them; returns whether a batch was full (more
    may be due)."""
    trouble = s.trouble("pruning ended jobs")
    full = False
    try:
        with unlocked(s.lock):
            for status, seconds in keep.items():
                pruned = s.store.prune(seconds, [status], limit=store.jobs.PRUNE_BATCH)
                full |= pruned == store.jobs.PRUNE_BATCH
    except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
        trouble.failed("cannot prune the jobs that ended; trying again")
        return False
    trouble.ok()
    return full


def looks_for_work(s: State[C]) -> bool:
    """Whether the look also asks if a job waits that no runner holds (lock
    held): for a runner that resumes any caller's jobs and has room. A
    store that cannot tell it of new jobs (SQLite; PostgreSQL through a
    transaction pooler, which cannot listen) would leave such a job
    waiting for its next beat, a third of a lease away."""
    return s.config.resume is not None and s.room() != 0 and not s.closed


def _look(s: State[C]) -> None:
    """Halt the jobs this runner holds that were cancelled through another,
    and pause or unpause as the store says; with room, beat at once if a
    job waits that no runner holds."""
    trouble = s.trouble("looking for cancelled jobs")
    work = looks_for_work(s)
    with s.calls.under_way() as call:
        try:
            with unlocked(s.lock):
                look = s.ledger.look(s.id, work)
        except Exception:  # noqa: BLE001 - whatever the store or its driver raises: logged
            trouble.failed("cannot look for cancelled jobs; trying again")
            return
        trouble.ok()
        for job_id in look.halted:
            job = s.rotation.get(job_id)
            if job is not None:
                s.halt(job)
        s.paused_in_store(look.paused, call)
        if look.work and looks_for_work(s):
            s.want_room = True  # the keeper's next turn is a beat
