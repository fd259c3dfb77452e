"""``Store.gauges``: the counts a scrape reads, kept as jobs change, agree
with the jobs stored whatever happened to them; on both engines."""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import store
from store.ledger import Ledger
from tests.helpers import Clock
from tests.runs_helpers import advertise, step

pytestmark = pytest.mark.timeout(120)

_ids = itertools.count()
LIVE = (store.JobStatus.QUEUED, store.JobStatus.RUNNING)

#: What may happen to the jobs: submit some, cancel one, store a target
#: (ending the job or not), interrupt one, evict every ended job.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 3)),
        st.tuples(st.sampled_from(["cancel", "store", "end", "interrupt"]), st.integers(0, 9)),
        st.tuples(st.just("evict"), st.just(0)),
    ),
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_job_counts_agree_with_the_jobs_stored(db: store.Store, ops: list[tuple[str, int]]) -> None:
    live: list[str] = []
    for op, k in ops:
        if op == "submit":
            new = [(f"j{next(_ids)}", ["a", "b"]) for _ in range(k)]
            Ledger.of(db).create_jobs("alice", new)
            live += [job_id for job_id, _ in new]
        elif op == "evict":
            db.evict(0)
        elif live:
            job_id = live[k % len(live)]
            if op == "cancel":
                db.cancel_job(job_id, "alice")
            elif op == "interrupt":
                Ledger.of(db).interrupt_job(job_id, "stopped")
            else:
                job = db.find_job(job_id)
                assert job is not None
                pending = [t.pos for t in job.targets if t.status == "pending"]
                if pending:
                    Ledger.of(db).store_target(
                        job_id,
                        pending[0],
                        store.TargetState.DONE,
                        result="1",
                        job_status=store.JobStatus.PARTIAL if op == "end" else None,
                    )
            if db.job_status(job_id, "alice") not in LIVE:
                live.remove(job_id)
    stored = collections.Counter(j.status for j in db.list_jobs())
    counted = {s: n for s, n in db.gauges().jobs.items() if n}
    assert counted == dict(stored)


def test_runs_and_nodes_are_gauged(location: str, clock: Clock) -> None:
    """QUEUED runs and how long the oldest has waited, by the store's
    clock; nodes busy and draining."""
    with store.open(location, clock=clock.time) as db:
        assert (db.gauges().queued_runs, db.gauges().oldest_queued) == (0, 0.0)
        advertise(db, "n1", "linux")
        advertise(db, "n2", "linux")
        db.drain("n2")
        db.submit_run([step("s", "linux")], run_id="r1")
        db.submit_run([step("s", "linux")], run_id="r2")
        clock.tick(5.0)
        db.submit_run([step("s", "linux")], run_id="r3")
        g = db.gauges()
        assert (g.nodes, g.busy, g.draining, g.queued_runs) == (2, 1, 1, 2)
        assert g.oldest_queued == pytest.approx(5.0, abs=1e-3)  # created_at may be nudged
