"""The store's gauges, for a scrape: what a few rows say, however many jobs
and runs the store holds (``Store.gauges``)."""

from __future__ import annotations

from .engines import Tx
from .shapes import Gauges
from .states import JobStatus, RunState

__all__ = ["read"]


def read(tx: Tx) -> Gauges:
    """The jobs in each status (the counts triggers keep, ``job_counts``),
    the QUEUED runs and how long the oldest has waited (down the index of
    QUEUED runs), and the nodes: all, busy (holding a lease), draining."""
    jobs = {status: 0 for status in JobStatus}
    for status, n in tx.execute("SELECT status, sum(n) FROM job_counts GROUP BY status"):
        jobs[JobStatus(status)] = int(n)
    queued, oldest = tx.execute(
        "SELECT count(*), min(created_at) FROM runs WHERE state = ?", (RunState.QUEUED,)
    ).fetchone()
    nodes, busy, draining = tx.execute(
        "SELECT (SELECT count(*) FROM nodes), (SELECT count(*) FROM leases),"
        " (SELECT count(*) FROM nodes WHERE draining = 1)"
    ).fetchone()
    return Gauges(
        jobs,
        queued,
        0.0 if oldest is None else max(tx.now - oldest, 0.0),
        nodes,
        busy,
        draining,
    )
