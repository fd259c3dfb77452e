"""``batch-runner serve``: the dashboard's JSON under ``/api/`` and its
event stream, on both engines (the page itself: ``test_dashboard_browser``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.ledger import Ledger

pytest.importorskip("starlette")
from starlette.testclient import TestClient

import store
import store.events
from batch import dashboard
from tests.helpers import Clock
from tests.runs_helpers import advertise, step

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(db: store.Store) -> Iterator[TestClient]:
    with TestClient(dashboard.app(db)) as c:
        yield c


def test_the_page_is_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert "EventSource" in page.text


def test_jobs_newest_first_with_progress_and_filters(db: store.Store, client: TestClient) -> None:
    Ledger.of(db).create_jobs("alice", [("j1", ["a", "b"]), ("j2", ["c"])], names=["first", None])
    Ledger.of(db).create_jobs("bob", [("j3", ["d"])])
    Ledger.of(db).store_target("j1", 0, store.TargetState.DONE, result="1")
    db.cancel_job("j2", "alice")
    jobs = client.get("/api/jobs").json()
    assert [j["id"] for j in jobs] == ["j3", "j2", "j1"]
    assert jobs[2] | {"created_at": 0, "updated_at": 0} == {
        "id": "j1",
        "owner": "alice",
        "status": "queued",
        "name": "first",
        "done": 1,
        "failed": 0,
        "pending": 1,
        "nbytes": jobs[2]["nbytes"],
        "created_at": 0,
        "updated_at": 0,
        "key": None,
        "not_before": None,
        "deferred": False,
        "waits": 0,
        "reason": None,
    }
    assert [j["id"] for j in client.get("/api/jobs?owner=alice").json()] == ["j2", "j1"]
    assert [j["id"] for j in client.get("/api/jobs?status=cancelled").json()] == ["j2"]
    assert [j["id"] for j in client.get("/api/jobs?limit=1").json()] == ["j3"]
    assert client.get("/api/jobs?status=lost").status_code == 400
    assert client.get("/api/jobs?limit=x").status_code == 400


def test_a_job_with_its_targets(db: store.Store, client: TestClient) -> None:
    Ledger.of(db).create_job("j1", "alice", ["a", "b"])
    Ledger.of(db).store_target("j1", 1, store.TargetState.FAILED, error="gone", hint="check it")
    job = client.get("/api/jobs/j1").json()
    assert [(t["ref"], t["status"], t["error"], t["hint"]) for t in job["targets"]] == [
        ("a", "pending", None, None),
        ("b", "failed", "gone", "check it"),
    ]
    assert client.get("/api/jobs/nope").status_code == 404


def test_cancel_only_when_allowed(db: store.Store, client: TestClient) -> None:
    Ledger.of(db).create_job("j1", "alice", ["a"])
    refused = client.post("/api/jobs/j1/cancel")
    assert refused.status_code == 403
    assert db.job_status("j1", "alice") == "queued"
    header = dict([dashboard.CANCEL_HEADER])
    with TestClient(dashboard.app(db, allow_cancel=True)) as allowed:
        # Without the page's header: what another site's form could send.
        assert allowed.post("/api/jobs/j1/cancel").status_code == 403
        assert db.job_status("j1", "alice") == "queued"
        assert allowed.post("/api/jobs/j1/cancel", headers=header).json() == {"cancelled": True}
        assert allowed.post("/api/jobs/j1/cancel", headers=header).json() == {"cancelled": False}
        assert allowed.post("/api/jobs/nope/cancel", headers=header).status_code == 404
    assert db.job_status("j1", "alice") == "cancelled"


def test_a_dashboard_on_this_host_answers_to_its_names_only(db: store.Store) -> None:
    """Served on a loopback address, it refuses a request naming another
    host: another site's page cannot read it by a name that resolves here."""
    app = dashboard.app(db, allowed_hosts=dashboard.LOOPBACK)
    with TestClient(app, base_url="http://127.0.0.1:8000") as ours:
        assert ours.get("/api/jobs").status_code == 200
    with TestClient(app, base_url="http://attacker.example:8000") as theirs:
        assert theirs.get("/api/jobs").status_code == 400


def test_runs_nodes_and_gauges(db: store.Store, client: TestClient) -> None:
    advertise(db, "n1", "linux")
    db.submit_run([step("s", "linux")], run_id="r1")
    db.submit_run([step("s", "linux")], run_id="r2")
    runs = client.get("/api/runs").json()
    assert [r["run_id"] for r in runs["running"]] == ["r1"]
    ((queued),) = runs["queued"]
    assert queued["run"]["run_id"] == "r2"
    assert queued["explain"]["position"] == 1
    assert queued["explain"]["steps"][0]["nodes"][0]["why"] is not None
    (node,) = client.get("/api/nodes").json()
    assert (node["node_id"], node["caps"], node["run_id"]) == ("n1", ["linux"], "r1")
    gauges = client.get("/api/gauges").json()
    assert (gauges["queued_runs"], gauges["busy"]) == (1, 1)
    assert client.get("/api/upstreams").json() == []


def test_what_is_paused_and_jobs_that_start_later(db: store.Store, client: TestClient) -> None:
    assert client.get("/api/paused").json() == {"callers": {}, "upstreams": {}}
    Ledger.of(db).sync_upstreams("runner-1", 60, [], ["https://example.org:443"])  # a runner met it
    db.pause(caller="alice", upstream="example.org")
    paused = client.get("/api/paused").json()
    assert (list(paused["callers"]), list(paused["upstreams"])) == (["alice"], ["example.org"])
    Ledger.of(db).create_jobs("bob", [("j1", ["a"])], later=store.Later(not_before=2e9))
    (job,) = client.get("/api/jobs").json()
    assert (job["deferred"], job["not_before"]) == (True, 2e9)


def test_events_stream_resumes_after_the_last_seen(db: store.Store, client: TestClient) -> None:
    """The stream sends each event with its seq as the id; a browser that
    reconnects with Last-Event-ID gets what came after it."""
    Ledger.of(db).create_job("j1", "alice", ["a"])
    db.cancel_job("j1", "alice")
    frames = _frames(client, {"Last-Event-ID": "0"}, 2)
    assert [(f["event"], f["id"]) for f in frames] == [("job.submitted", "1"), ("job.ended", "2")]
    assert '"status": "cancelled"' in frames[1]["data"]
    (again,) = _frames(client, {"Last-Event-ID": "1"}, 1)
    assert again["event"] == "job.ended"
    assert client.get("/api/events?since=x").status_code == 400


def test_a_stream_from_events_pruned_says_reload_and_goes_on(location: str, clock: Clock) -> None:
    """A page back after the events it last saw were pruned is told to read
    everything afresh, then gets what happens from now on."""
    with store.open(location, clock=clock.time) as db, TestClient(dashboard.app(db)) as c:
        Ledger.of(db).create_job("old", "alice", ["a"])
        clock.tick(store.events.KEPT + 1)
        Ledger.of(db).create_job("newer", "alice", ["a"])
        Ledger.of(db).register_runner("r1")
        Ledger.of(db).beat_runner("r1", 30.0, room=0)  # prunes "old"'s event
        frames: list[dict[str, str]] = []
        frame: dict[str, str] = {}
        with c.stream("GET", "/api/events", headers={"Last-Event-ID": "0"}) as answer:
            for line in answer.iter_lines():
                if line:
                    key, _, value = line.partition(": ")
                    frame[key] = value
                    continue
                if "event" in frame:
                    frames.append(frame)
                    if frame["event"] == "reload":
                        Ledger.of(db).create_job("later", "alice", ["a"])
                    else:
                        break
                frame = {}
    assert [f["event"] for f in frames] == ["reload", "job.submitted"]
    assert '"owner": "alice"' in frames[1]["data"] and '"id": "later"' in frames[1]["data"]


def _frames(client: TestClient, headers: dict[str, str], n: int) -> list[dict[str, str]]:
    """The first ``n`` events of the stream (its comments and retry line skipped)."""
    frames: list[dict[str, str]] = []
    frame: dict[str, str] = {}
    with client.stream("GET", "/api/events", headers=headers) as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        for line in answer.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                frame[key] = value
            elif "event" in frame:
                frames.append(frame)
                if len(frames) == n:
                    break
                frame = {}
            else:
                frame = {}
    return frames
