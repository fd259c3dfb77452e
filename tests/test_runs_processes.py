"""Four processes share one store's run queue: each advertises two nodes,
submits runs, claims and reports its nodes' steps, and wakes the queue,
all at once. What they did is logged; what is left is checked.

The rules, on each engine: no node ever leased to two runs at once, no run
promoted twice (nor promoted once placed at submit), no lease left on an
ended run, and the queue served first in, first out: every run needs the
same one label, and every node has it, so runs that waited in the queue
start in the order they were submitted.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import store
from tests.helpers import Raw
from tests.test_runs_model import check_structure

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 4
SECONDS = 4.0

#: One process: two nodes of its own, then, until the time is up, submit a
#: run now and then (logging whether it was placed or queued), claim a step
#: for each of its nodes and report it, and wake the queue (logging what it
#: promoted). It writes one JSON line per event to its log.
CHILD = textwrap.dedent(
    r"""
    import json, random, sys, time
    import store

    location, name, log_path, seconds, start_at = sys.argv[1:6]
    rng = random.Random(name)
    log = open(log_path, "w", encoding="utf-8")

    def note(**event):
        log.write(json.dumps(event) + "\n")

    db = store.open(location, lease_ttl=30.0, max_leases_per_run=1)
    node = f"{name}-node"
    db.advertise(store.Advert(node, node, {"linux"}))
    while time.time() < float(start_at):
        time.sleep(0.001)  # allow-sleep: every process begins at one moment
    held, turns, submits = None, 0, 0
    deadline = time.time() + float(seconds)
    while time.time() < deadline:
        if submits < 150 and rng.random() < 0.4:
            run = db.submit_run([store.Step("s", "exec", {"linux"})])
            submits += 1
            note(submitted=run.run_id, state=run.state, created_at=run.created_at)
        if held is None:
            claim = db.claim_step(node)
            if claim is not None:
                held, turns = claim.run_id, rng.randint(1, 4)
                note(claimed=held)
        elif turns:
            turns -= 1
        else:
            db.report_step(node, held, 1, ok=True)  # frees the node: wakes the queue
            held = None
        if rng.random() < 0.2:
            note(promoted=db.wake_queued(name))
    if held is not None:
        db.report_step(node, held, 1, ok=True)
    log.close()
    db.close()
    """
)

#: Notes every move of a run to RUNNING after its insert: a promotion.
WATCH = {
    "sqlite": (
        "CREATE TABLE promotions (run_id TEXT, old_state TEXT)",
        "CREATE TRIGGER note_promotion AFTER UPDATE OF state ON runs"
        " WHEN NEW.state = 'RUNNING'"
        " BEGIN INSERT INTO promotions VALUES (NEW.id, OLD.state); END",
    ),
    "postgres": (
        "CREATE TABLE promotions (run_id TEXT, old_state TEXT)",
        "CREATE FUNCTION note_promotion() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO promotions VALUES (NEW.id, OLD.state); RETURN NEW; END $$",
        "CREATE TRIGGER note_promotion AFTER UPDATE OF state ON runs FOR EACH ROW"
        " WHEN (NEW.state = 'RUNNING') EXECUTE FUNCTION note_promotion()",
    ),
}


@pytest.mark.timeout(90)
def test_processes_promoting_and_claiming_keep_the_queue(tmp_path: Path, location: str) -> None:
    store.open(location).close()  # set up before any child opens it
    with contextlib.closing(Raw(location)) as raw:
        for statement in WATCH["postgres" if raw.pg else "sqlite"]:
            raw.rows(statement)
    logs = [tmp_path / f"p{i}.log" for i in range(PROCESSES)]
    start_at = time.time() + 1.5  # every child has opened the store: all begin at once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, location, f"p{i}", str(log), str(SECONDS), str(start_at)],
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            stderr=subprocess.PIPE,
        )
        for i, log in enumerate(logs)
    ]
    try:
        for p in procs:
            _, err = p.communicate(timeout=SECONDS + 30)
            assert p.returncode == 0, err.decode(errors="replace")[-3000:]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    events = [json.loads(line) for log in logs for line in log.read_text().splitlines()]

    submitted = {e["submitted"]: e for e in events if "submitted" in e}
    claims = Counter(e["claimed"] for e in events if "claimed" in e)
    with contextlib.closing(Raw(location)) as raw:
        promotions = raw.rows("SELECT run_id, old_state FROM promotions")
    queued = [r for r, e in submitted.items() if e["state"] == "QUEUED"]
    assert len(queued) > 20, Counter(e["state"] for e in submitted.values())

    # No run promoted twice, nor promoted once it was placed at submit.
    assert [r for r, n in Counter(r for r, _ in promotions).items() if n > 1] == []
    assert {old for _, old in promotions} == {"QUEUED"}
    # Every run was claimed once (its one step, on one node).
    assert [r for r, n in claims.items() if n > 1] == []

    with store.open(location) as db, contextlib.closing(Raw(location)) as raw:
        db.wake_queued("final")
        runs, _ = check_structure(db, raw)  # no node in two leases, none on an ended run
        by_id = {r.run_id: r for r in runs}
        assert set(by_id) == set(submitted)
        assert {r for r, _ in promotions} == {r for r in queued if by_id[r].started_at}
        # First in, first out: the runs that waited started in submit order.
        waited = sorted((by_id[r] for r in queued), key=lambda r: r.created_at)
        started = [r.started_at for r in waited if r.started_at is not None]
        assert started == sorted(started), "a queued run started before an older one"
        assert len(started) > 5, f"only {len(started)} queued runs started"
