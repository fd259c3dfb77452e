"""Prometheus metrics of a runner, from its hooks: ``pip install
'batch-store[metrics]'`` (prometheus-client, the Prometheus project's own
client: its exposition format, registry and HTTP server are kept by the
people who define them).

    metrics = batch.metrics.Metrics()
    with batch.Runner(db, fetch, hooks=metrics):
        metrics.serve(9464)      # http://host:9464/metrics
        ...

Every name, its type and what it counts (``batch_`` for all):

================================  =========  =====================================
name                              type       what
================================  =========  =====================================
``batch_live_jobs``               gauge      live jobs the runner holds
``batch_inflight_targets``        gauge      targets being fetched now
``batch_targets_total``           counter    targets stored, by ``outcome``
                                             (``done``, ``failed``)
``batch_fetch_seconds``           histogram  what each stored target's fetch took
``batch_result_bytes``            histogram  bytes of each stored result (JSON)
``batch_retries_total``           counter    busy answers to be tried again
``batch_jobs_ended_total``        counter    jobs ended, by ``status``
``batch_job_seconds``             histogram  submit to end, of each job ended
                                             ``done``, ``failed`` or ``partial``
``batch_upstreams_held``          gauge      upstreams a busy answer holds now
``batch_upstream_holds_total``    counter    holds begun
================================  =========  =====================================

and, from :class:`StoreCollector`, the store's (every runner's), gauges
read at each scrape: ``batch_store_up`` (1 if the store answered),
``batch_store_jobs`` (by ``status``), ``batch_store_queued_runs``,
``batch_store_oldest_queued_seconds`` (how long the oldest QUEUED run has
waited), ``batch_store_nodes``, ``batch_store_nodes_busy`` (holding a
lease) and ``batch_store_nodes_draining``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily

import store

from .hooks import Hooks
from .states import JobStatus

if TYPE_CHECKING:
    from collections.abc import Iterator
    from wsgiref.simple_server import WSGIServer

__all__ = ["BYTES_BUCKETS", "SECONDS_BUCKETS", "Metrics", "StoreCollector"]

log = logging.getLogger("batch")

#: Buckets of the histograms of seconds: a fetch of a millisecond to a
#: job of an hour.
SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
#: Buckets of the histogram of result bytes: powers of four, 64 B to 16 MiB.
BYTES_BUCKETS = tuple(float(64 * 4**k) for k in range(10))


class Metrics(Hooks):
    """A runner's hooks as Prometheus metrics, in ``registry`` (None: the
    client's default, which its ``start_http_server`` and most
    frameworks' exporters serve). One ``Metrics`` per runner; runners in
    one process each take a registry of their own (a second ``Metrics``
    in one registry raises ``ValueError``: its names are taken)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        r = self.registry
        self._live = Gauge("batch_live_jobs", "Live jobs the runner holds.", registry=r)
        self._inflight = Gauge("batch_inflight_targets", "Targets being fetched now.", registry=r)
        self._abandoned = Gauge(
            "batch_abandoned_fetches",
            "Fetches abandoned at their time limit that have not returned yet.",
            registry=r,
        )
        self._targets = Counter(
            "batch_targets", "Targets stored, by outcome.", ["outcome"], registry=r
        )
        self._done = self._targets.labels(outcome="done")
        self._failed = self._targets.labels(outcome="failed")
        self._fetch = Histogram(
            "batch_fetch_seconds",
            "Seconds each stored target's fetch took.",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self._bytes = Histogram(
            "batch_result_bytes",
            "Bytes of each stored target's result (JSON).",
            buckets=BYTES_BUCKETS,
            registry=r,
        )
        self._retries = Counter(
            "batch_retries", "Busy answers whose target will be tried again.", registry=r
        )
        self._ended = Counter("batch_jobs_ended", "Jobs ended, by status.", ["status"], registry=r)
        for status in (JobStatus.DONE, JobStatus.FAILED, JobStatus.PARTIAL, JobStatus.CANCELLED):
            self._ended.labels(status=status.value)  # shown at 0 before the first
        self._job = Histogram(
            "batch_job_seconds",
            "Seconds from submit to end of each job ended done, failed or partial.",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self._held = Gauge("batch_upstreams_held", "Upstreams a busy answer holds now.", registry=r)
        self._holds = Counter(
            "batch_upstream_holds", "Holds of an upstream begun by busy answers.", registry=r
        )
        # Called with the runner's lock held: no lock of its own needed.
        self._holding: set[str] = set()

    def serve(self, port: int, addr: str = "127.0.0.1") -> WSGIServer:
        """Serve the registry at ``http://addr:port/metrics`` on a thread of
        its own (the client's ``start_http_server``); ``shutdown()`` the
        server returned to stop it. Only this host can read it unless
        ``addr`` says otherwise (``"0.0.0.0"``: every interface, for a
        Prometheus elsewhere), as the dashboard."""
        server, _ = start_http_server(port, addr, registry=self.registry)
        return server

    # -- the hooks --------------------------------------------------------------

    def depth(self, live: int) -> None:
        self._live.set(live)

    def inflight(self, n: int) -> None:
        self._inflight.set(n)

    def abandoned(self, n: int) -> None:
        self._abandoned.set(n)

    def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
        (self._done if err is None else self._failed).inc()
        self._fetch.observe(seconds)
        self._bytes.observe(nbytes)

    def job(self, status: JobStatus) -> None:
        self._ended.labels(status=status.value).inc()

    def job_seconds(self, seconds: float) -> None:
        self._job.observe(seconds)

    def retry(self, err: BaseException, wait: float) -> None:
        self._retries.inc()

    def upstream_held(self, upstream: str, seconds: float) -> None:
        if upstream not in self._holding:
            self._holding.add(upstream)
            self._held.set(len(self._holding))
            self._holds.inc()

    def upstream_released(self, upstream: str) -> None:
        if upstream in self._holding:
            self._holding.discard(upstream)
            self._held.set(len(self._holding))


class StoreCollector:
    """The store's gauges at each scrape (``Store.gauges``: a few rows read,
    however many jobs it holds): ``registry.register(StoreCollector(db))``.
    A store that cannot be read makes ``batch_store_up`` 0, not a failed
    scrape."""

    def __init__(self, db: store.Store) -> None:
        self._db = db

    def describe(self) -> list[GaugeMetricFamily]:
        """Nothing: registering the collector does not read the store."""
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            g = self._db.gauges()
        except store.StoreError as e:
            log.warning("cannot read the store's gauges: %s", e)
            yield GaugeMetricFamily("batch_store_up", "1 if the store answered.", 0)
            return
        yield GaugeMetricFamily("batch_store_up", "1 if the store answered.", 1)
        jobs = GaugeMetricFamily("batch_store_jobs", "Jobs stored, by status.", labels=["status"])
        for status, n in g.jobs.items():
            jobs.add_metric([status.value], n)
        yield jobs
        yield GaugeMetricFamily("batch_store_queued_runs", "Runs waiting QUEUED.", g.queued_runs)
        yield GaugeMetricFamily(
            "batch_store_oldest_queued_seconds",
            "Seconds the oldest QUEUED run has waited.",
            g.oldest_queued,
        )
        yield GaugeMetricFamily("batch_store_nodes", "Nodes advertised.", g.nodes)
        yield GaugeMetricFamily("batch_store_nodes_busy", "Nodes holding a lease.", g.busy)
        yield GaugeMetricFamily("batch_store_nodes_draining", "Nodes draining.", g.draining)
