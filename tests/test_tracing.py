"""``batch.tracing``: a span per fetch in the submitter's trace, a retry a new
trace linked to the first try, continued by whichever runner takes the
job; nothing at all until the application records traces."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from store.ledger import Ledger

trace = pytest.importorskip("opentelemetry.trace")
otel_context = pytest.importorskip("opentelemetry.context")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

import batch  # noqa: E402
import batch.tracing  # noqa: E402
import store  # noqa: E402
from tests.helpers import TIMEOUT, MakeRunner, Script, raising  # noqa: E402

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """What the application does to record traces: a tracer provider with an
    exporter (in memory here), set for the test only."""
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(batch.tracing, "_looked", (-math.inf, False))  # workers look again
    yield exporter
    provider.shutdown()


def fetches(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == "batch.fetch"]


def test_each_fetch_is_a_child_span_of_the_submit(
    db: store.Store, runner: MakeRunner, spans: Any
) -> None:
    tracer = trace.get_tracer("app")
    with runner(db, Script(), workers=1) as r:
        with tracer.start_as_current_span("request") as request:
            job_id = r.submit(ALICE, ["a", "b"])
        r.wait(ALICE, job_id, TIMEOUT)
    got = fetches(spans)
    assert [s.attributes["batch.target.ref"] for s in got] == ["a", "b"]
    parent = request.get_span_context()
    for pos, s in enumerate(got):
        assert s.parent.span_id == parent.span_id
        assert s.context.trace_id == parent.trace_id
        assert s.kind == trace.SpanKind.CONSUMER
        assert dict(s.attributes) == {
            "batch.job.id": job_id,
            "batch.target.ref": "ab"[pos],
            "batch.target.pos": pos,
            "batch.attempt": 1,
            "batch.outcome": "done",
        }


def test_a_retry_is_a_new_trace_linked_to_the_first_try(
    db: store.Store, runner: MakeRunner, spans: Any
) -> None:
    script = Script()

    def busy_once(ctx: batch.Context, n: int) -> object:
        if n == 1:
            raise batch.RetryLater("busy")
        return "ok"

    script.on("x", busy_once)
    tracer = trace.get_tracer("app")
    with runner(db, script, workers=1, retry_wait=0.001) as r:
        with tracer.start_as_current_span("request") as request:
            job_id = r.submit(ALICE, ["x"])
        r.wait(ALICE, job_id, TIMEOUT)
    first, second = fetches(spans)
    assert (first.attributes["batch.attempt"], first.attributes["batch.outcome"]) == (1, "busy")
    assert (second.attributes["batch.attempt"], second.attributes["batch.outcome"]) == (2, "done")
    assert first.context.trace_id == request.get_span_context().trace_id
    assert second.parent is None
    assert second.context.trace_id != first.context.trace_id
    assert [link.context.span_id for link in second.links] == [first.context.span_id]


def test_a_failed_fetch_is_an_error_span_without_what_it_raised(
    db: store.Store, runner: MakeRunner, spans: Any
) -> None:
    script = Script()
    script.on("bad", raising(KeyError("secret-detail")))
    with runner(db, script, workers=1) as r:
        r.wait(ALICE, r.submit(ALICE, ["bad"]), TIMEOUT)
    (span,) = fetches(spans)
    assert span.attributes["batch.outcome"] == "failed"
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.status.description == "internal error"
    assert not span.events  # no exception recorded


def test_a_runner_that_takes_the_job_up_continues_its_trace(db: store.Store, spans: Any) -> None:
    """The trace context is stored with the job (as ``submit`` stores it):
    a runner that takes the job up from the store, in any process,
    fetches in the submitter's trace."""
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("request") as request:
        traceparent = batch.tracing.current()
    assert traceparent is not None
    Ledger.of(db).create_jobs("alice", [("j1", ["a", "b"])], traces=[traceparent])
    assert db.find_job("j1").trace == traceparent  # type: ignore[union-attr]
    config = batch.Config(workers=1, resume=batch.Caller)
    with batch.Runner(db, Script(), config) as r:
        r.wait(ALICE, "j1", TIMEOUT)
    got = fetches(spans)
    assert len(got) == 2
    assert all(s.parent.span_id == request.get_span_context().span_id for s in got)


def test_no_span_without_a_recording_provider_or_with_tracing_off(
    db: store.Store, runner: MakeRunner, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = trace.get_tracer("app")
    with runner(db, Script(), workers=1, tracing=False) as r:
        with tracer.start_as_current_span("request"):
            job_id = r.submit(ALICE, ["a"])
        r.wait(ALICE, job_id, TIMEOUT)
    assert fetches(spans) == []
    assert db.find_job(job_id).trace is None  # type: ignore[union-attr]
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # as before any SDK is set
    monkeypatch.setattr(batch.tracing, "_looked", (-math.inf, False))
    # A trace context current all the same, as one taken from a request's
    # headers is: without a provider, nothing is stored or made of it.
    incoming = trace.SpanContext(
        trace_id=1, span_id=2, is_remote=True, trace_flags=trace.TraceFlags(1)
    )
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(incoming)))
    try:
        with runner(db, Script(), workers=1) as r:
            job_id = r.submit(ALICE, ["a"])
            r.wait(ALICE, job_id, TIMEOUT)
    finally:
        otel_context.detach(token)
    assert db.find_job(job_id).trace is None  # type: ignore[union-attr]
    assert fetches(spans) == []


def test_tracing_is_a_bool() -> None:
    with pytest.raises(TypeError, match="tracing"):
        batch.Config(tracing="yes")  # type: ignore[arg-type]
