"""Traces of the fetches, on OpenTelemetry's API: ``pip install
'batch-store[otel]'`` (opentelemetry-api; the application configures an
SDK and an exporter, as for any instrumented library).

What it does, whenever ``opentelemetry-api`` is importable and
``Config(tracing=True)`` (the default):

- ``submit`` stores the trace context current then with each job (a W3C
  ``traceparent``), so a runner in any process continues that trace;
- each fetch is a span ``batch.fetch`` (kind CONSUMER) with the attributes
  ``batch.job.id``, ``batch.target.ref``, ``batch.target.pos``,
  ``batch.attempt`` (1 for a target's first try on this runner) and
  ``batch.outcome`` (``done``, ``failed``, or ``busy`` for an answer to be
  tried again); a failure sets the span's status to ERROR with the error
  stored (never the text of what the fetch raised);
- the first try of a target is a child of the submitter's span; a retry is
  a new trace, linked to the first try's span (a trace does not stay open
  for as long as an upstream stays busy);
- the fetch runs with its span current, so spans the fetch makes (an HTTP
  client's) are its children.

Until the application sets a tracer provider, no span is made at all: a
fetch costs what it costs without tracing. Workers look whether one is set
at most once a second (:func:`fetches_recorded`): a provider set while a
runner works has its fetches recorded from within that second on.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .attempt import Outcome
from .states import TargetState

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .rotation import LiveJob

__all__ = ["AVAILABLE", "LOOK_EVERY", "current", "fetches_recorded", "recording", "span"]

#: Whether ``opentelemetry-api`` is importable.
AVAILABLE = trace is not None

_OUTCOMES = {TargetState.DONE: "done", TargetState.FAILED: "failed", TargetState.PENDING: "busy"}


def recording() -> bool:
    """Whether the application has set a tracer provider (the API's own is a
    proxy until then, whose spans record nothing)."""
    return AVAILABLE and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


#: Seconds a worker acts on one look at :func:`recording`: until a provider
#: is set, the API reads the environment at every look (2 us, where the
#: async runner has 50 us per fetch in all).
LOOK_EVERY = 1.0

#: When :func:`fetches_recorded` last looked (``time.monotonic()``), and
#: what it found. Threads race to replace it, each with a true answer.
_looked = (-math.inf, False)


def fetches_recorded() -> bool:
    """:func:`recording`, as workers ask it before each fetch: looked up
    at most once every :data:`LOOK_EVERY` seconds."""
    global _looked  # noqa: PLW0603 - one answer for the process, as the provider is one
    now = time.monotonic()
    at, answer = _looked
    if now - at >= LOOK_EVERY:
        answer = recording()
        _looked = (now, answer)
    return answer


def current() -> str | None:
    """The ``traceparent`` of the span current now, if a provider records
    and there is one: what ``submit`` stores with a job."""
    if not recording():
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def span(job: LiveJob[Any]) -> Iterator[list[Outcome]]:
    """The span of one fetch of ``job``'s next target, current while the
    block runs (a no-op without a recording provider). The block appends
    the fetch's outcome to the list it is given, which the span reports.
    Called by the worker running the job, outside the runner's lock,
    when :func:`recording`."""
    target = job.targets[job.next]
    first = job.attempts <= 1 or job.first_span is None
    if first:
        parent = (
            otel_context.Context()
            if job.trace is None
            else propagate.extract({"traceparent": job.trace})
        )
        links = []
    else:
        parent = otel_context.Context()  # a new trace, linked to the first try
        links = [trace.Link(job.first_span)]
    tracer = trace.get_tracer("batch")
    with tracer.start_as_current_span(
        "batch.fetch",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "batch.job.id": job.id,
            "batch.target.ref": target.ref,
            "batch.target.pos": job.next,
            "batch.attempt": job.attempts,
        },
        record_exception=False,  # what a fetch raised may hold secrets
        set_status_on_exception=False,
    ) as fetching:
        if first:
            job.first_span = fetching.get_span_context()
        outcome: list[Outcome] = []
        yield outcome
        if outcome:
            fetching.set_attribute("batch.outcome", _OUTCOMES[outcome[0].status])
            if outcome[0].status == TargetState.FAILED:
                fetching.set_status(trace.Status(trace.StatusCode.ERROR, outcome[0].error))
