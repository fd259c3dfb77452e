"""``batch.metrics.Metrics``: a runner's hooks as Prometheus metrics, served
in the exposition format by the client's own server."""

from __future__ import annotations

import urllib.request

import pytest

from store.ledger import Ledger

prometheus_client = pytest.importorskip("prometheus_client")

import batch  # noqa: E402
import batch.metrics  # noqa: E402
import store  # noqa: E402
from tests.helpers import TIMEOUT, MakeRunner, Script, raising  # noqa: E402

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


def value(registry: object, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)  # type: ignore[attr-defined, no-any-return]


def test_a_runners_work_shows_in_its_metrics(db: store.Store, runner: MakeRunner) -> None:
    """Targets done and failed, a busy answer tried again, a job ended
    partial with its seconds, result bytes, and the gauges back at zero."""
    registry = prometheus_client.CollectorRegistry()
    metrics = batch.metrics.Metrics(registry)
    script = Script()
    script.on("bad", raising(ValueError("no")))

    def busy_once(ctx: batch.Context, n: int) -> object:
        if n == 1:
            raise batch.RetryLater("busy")
        return "x" * 100

    script.on("slow", busy_once)
    with runner(db, script, metrics, workers=2, retry_wait=0.001) as r:
        job = r.wait(ALICE, r.submit(ALICE, ["ok", "bad", "slow"]), TIMEOUT)
    assert job.status == "partial"
    assert value(registry, "batch_targets_total", outcome="done") == 2
    assert value(registry, "batch_targets_total", outcome="failed") == 1
    assert value(registry, "batch_retries_total") == 1
    assert value(registry, "batch_jobs_ended_total", status="partial") == 1
    assert value(registry, "batch_jobs_ended_total", status="done") == 0
    assert value(registry, "batch_job_seconds_count") == 1
    assert value(registry, "batch_fetch_seconds_count") == 3
    assert value(registry, "batch_result_bytes_count") == 3
    assert (value(registry, "batch_result_bytes_sum") or 0) >= 102  # 100 x's, quoted
    assert value(registry, "batch_live_jobs") == 0
    assert value(registry, "batch_inflight_targets") == 0


def test_upstream_holds_are_counted_once_each() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = batch.metrics.Metrics(registry)
    metrics.upstream_held("a", 1.0)
    metrics.upstream_held("a", 2.0)  # the same hold, extended
    metrics.upstream_held("b", 1.0)
    assert value(registry, "batch_upstreams_held") == 2
    metrics.upstream_released("a")
    metrics.upstream_released("a")
    assert value(registry, "batch_upstreams_held") == 1
    assert value(registry, "batch_upstream_holds_total") == 2


def test_metrics_are_served_in_the_exposition_format() -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = batch.metrics.Metrics(registry)
    metrics.target(None, 0.01, 10)
    server = metrics.serve(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'batch_targets_total{outcome="done"} 1.0' in text
    assert "# TYPE batch_fetch_seconds histogram" in text


def test_one_registry_holds_one_runners_metrics() -> None:
    """A second ``Metrics`` in one registry is refused, naming the clash,
    rather than mixing two runners' gauges."""
    registry = prometheus_client.CollectorRegistry()
    batch.metrics.Metrics(registry)
    with pytest.raises(ValueError, match="batch_"):
        batch.metrics.Metrics(registry)


def test_the_store_collector_reads_the_stores_gauges(db: store.Store) -> None:
    """Jobs by status as stored, the store's up gauge, and 0 when it cannot
    be read rather than a failed scrape."""
    registry = prometheus_client.CollectorRegistry()
    registry.register(batch.metrics.StoreCollector(db))
    Ledger.of(db).create_jobs("alice", [("j1", ["a"]), ("j2", ["a"])])
    db.cancel_job("j2", "alice")
    assert value(registry, "batch_store_up") == 1
    assert value(registry, "batch_store_jobs", status="queued") == 1
    assert value(registry, "batch_store_jobs", status="cancelled") == 1
    assert value(registry, "batch_store_jobs", status="done") == 0
    assert value(registry, "batch_store_queued_runs") == 0
    db.close()
    assert value(registry, "batch_store_up") == 0
    assert value(registry, "batch_store_jobs", status="queued") is None
