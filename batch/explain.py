"""Why a job is not fetching, as the store has it, and how that reads.

``Runner.explain`` asks its rotation about a job it runs; about any other
job, and ``batch-runner explain`` about every job, they ask
:func:`from_store`: one reading of the store's facts, so that the library
and the command line say the same of a job. :func:`describe` turns either
answer into the sentence the command line prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import store
from store.console import SHORT_ID, duration, moment
from store.jobs.pauses import covering

from .model import Target
from .states import TERMINAL_JOB, TargetState

__all__ = ["describe", "from_store"]


def from_store(
    where: store.Whereabouts, upstream: Callable[[Target], str | None] | None
) -> dict[str, object]:
    """Why the job of ``where`` is not fetching, as a runner that does not
    run it sees it: ``status`` as stored and ``state``, the first of

    - ``ended``;
    - ``later``: it waits for its ``not_before`` (epoch seconds), or for
      ``waits_after`` jobs it waits after to end;
    - ``paused``: its ``caller`` is paused, or the ``upstream`` of its next
      target (as ``upstream`` names it) is, by the name given;
    - ``waiting``: no live runner holds it: it waits for one with room,
      or for one to open the store (``runners``: how many are open;
      ``runner``: the one gone that held it, if any);
    - ``upstream``: its next target's ``upstream`` is held by a busy
      answer until ``held_until`` (epoch seconds);
    - ``elsewhere``: the live ``runner`` that holds it runs it.
    """
    job = where.job
    out: dict[str, object] = {"id": job.id, "status": job.status}
    if job.status in TERMINAL_JOB:
        return {**out, "state": "ended"}
    if job.deferred:
        waits = {"waits_after": job.waits} if job.waits else {}
        return {**out, "state": "later", "not_before": job.not_before, **waits}
    pending = next((t for t in job.targets if t.status == TargetState.PENDING), None)
    name = None if pending is None or upstream is None else upstream(Target(pending.ref))
    if job.owner in where.paused.callers:
        return {**out, "state": "paused", "caller": job.owner}
    paused = None if name is None else covering(sorted(where.paused.upstreams), name)
    if paused is not None:
        return {**out, "state": "paused", "upstream": paused}
    if not where.alive:
        gone = {} if where.holder is None else {"runner": where.holder}
        return {**out, "state": "waiting", "runners": where.runners, **gone}
    view = None if name is None else where.upstreams.get(name)
    if view is not None and view.held_until is not None:
        return {
            **out,
            "state": "upstream",
            "why": "held",
            "upstream": name,
            "held_until": view.held_until,
            "runner": where.holder,
        }
    return {**out, "state": "elsewhere", "runner": where.holder}


def describe(explained: Mapping[str, object]) -> str:
    """What ``Runner.explain`` or :func:`from_store` said, as a sentence."""
    job = f"job {str(explained['id'])[:SHORT_ID]}"
    if explained["state"] == "ended":
        return f"{job} ended {explained['status']}"
    why = _WHY.get(str(explained["state"]), _ready)(explained)
    return f"{job} is {explained['status']}: {why}"


def _later(e: Mapping[str, object]) -> str:
    parts = []
    if e.get("not_before") is not None:
        parts.append(f"not before {moment(_number(e['not_before']))}")
    if e.get("waits_after"):
        parts.append(f"after {e['waits_after']} job(s) it waits for end")
    return "it starts " + " and ".join(parts or ["later"])


def _paused(e: Mapping[str, object]) -> str:
    if "caller" in e:
        return f"its caller {e['caller']} is paused"
    return f"its next target's upstream is paused ({e['upstream']})"


def _waiting(e: Mapping[str, object]) -> str:
    gone = f" (runner {e['runner']}, which held it, is gone)" if e.get("runner") else ""
    if not e["runners"]:
        return f"it waits for a runner to open the store{gone}"
    return f"it waits for one of the {e['runners']} open runner(s) to have room{gone}"


#: What keeps an upstream from starting a target, as ``Pace.why`` says it.
_UPSTREAM = {
    "held": "is held by a busy answer",
    "breaker": "has its breaker open: failures in a row",
    "share": "waits for its share of the store's limits",
    "concurrency": "has as many targets in flight as allowed",
    "rate": "is at its rate",
    "free": "may start one: its turn is coming",
}


def _upstream(e: Mapping[str, object]) -> str:
    why = str(e.get("why"))
    if why == "held" and e.get("held_until") is not None:
        left = duration(max(0.0, _number(e["held_until"]) - time.time()))
        return f"its next target's upstream {e['upstream']} is held for {left} by a busy answer"
    return f"its next target's upstream {e['upstream']} {_UPSTREAM.get(why, 'is busy')}"


def _retry(e: Mapping[str, object]) -> str:
    again = duration(_number(e["retry_in"]))
    return f"its target {e['target']} came back busy: tried again in {again}"


def _ready(e: Mapping[str, object]) -> str:
    return f"target {e['target']} is next: its turn is coming"


#: The sentence of each state (``ready``'s for any other).
_WHY: dict[str, Callable[[Mapping[str, object]], str]] = {
    "later": _later,
    "paused": _paused,
    "waiting": _waiting,
    "upstream": _upstream,
    "elsewhere": lambda e: f"runner {e['runner']} runs it",
    "fetching": lambda e: f"it is fetching target {e['target']}",
    "retry": _retry,
    "stopping": lambda e: "it was cancelled; its target in flight is finishing",
}


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
