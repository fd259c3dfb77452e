"""The operator's command line, ``python -m store``: every command run as a
real process on a store file prepared through the library, as an operator
(or a script) would run it."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import batch.cli
import store
import store.console
import store.runs.cli
from store.store import Store
from tests.helpers import frozen
from tests.runs_helpers import step

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
#: The runs of the ``cluster`` store, in the order they were submitted.
FIFO = ["done", "busy1", "busy2", "q-gpu", "q-linux", "gone", "q-any"]


def cli(*args: str | Path, cwd: Path = REPO, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m store ARGS``, with ``BATCH_DB`` and ``STORE_DB`` unset
    unless given in ``env``."""
    environ = {k: v for k, v in os.environ.items() if k not in ("BATCH_DB", "STORE_DB")}
    environ.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "store", *map(str, args)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def ok(path: Path, *args: str) -> str:
    """The output of a command on ``path`` that must succeed, with nothing on stderr."""
    done = cli("--db", path, *args)
    assert (done.returncode, done.stderr) == (0, ""), done
    return done.stdout


def as_json(path: Path, *args: str) -> Any:
    """The ``--json`` output of a command on ``path`` that must succeed: one
    object per line, as a list."""
    return [json.loads(line) for line in ok(path, *args, "--json").splitlines()]


def as_one(path: Path, *args: str) -> Any:
    """The ``--json`` output of a command on ``path`` about one thing."""
    (one,) = as_json(path, *args)
    return one


def by_id(nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``nodes --json`` list as a dict by node id."""
    return {n["node_id"]: n for n in nodes}


def rows(text: str) -> list[dict[str, str]]:
    """A printed table, one dict per line below the header, each cell cut at
    its header's column: a cell out of line with its header reads wrong."""
    header, *lines = text.splitlines()
    columns = [(m.group(), m.start()) for m in re.finditer(r"\S+", header)]
    ends = [start for _, start in columns[1:]] + [None]
    return [
        {name: line[start:end].strip() for (name, start), end in zip(columns, ends, strict=True)}
        for line in lines
    ]


def finish(db: Store, node_id: str, run_id: str) -> None:
    """Run, successfully and with no output, the one step ``node_id`` holds
    in ``run_id``."""
    claim = db.claim_step(node_id)
    assert claim is not None and claim.run_id == run_id
    db.report_step(node_id, run_id, claim.seq, ok=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A store file (``batch.sqlite3``, the default name) with three nodes and
    runs in every state:

    - n1 (linux) runs ``busy1``, n2 (gpu, linux) runs ``busy2``, n3 (linux)
      drains and is idle;
    - ``done`` SUCCEEDED on n1, ``gone`` was cancelled while QUEUED;
    - QUEUED, in FIFO order: ``q-gpu`` (gpu), ``q-linux`` (two linux steps
      and one that needs nothing), ``q-any`` (needs nothing).
    """
    path = tmp_path / "batch.sqlite3"
    with store.open(path) as db:
        db.advertise(store.Advert("n1", "box-n1", {"linux"}))
        db.advertise(store.Advert("n2", "box-n2", {"gpu", "linux"}))
        db.advertise(store.Advert("n3", "box-n3", {"linux"}))
        db.submit_run([step("a", "linux")], run_id="done")
        finish(db, "n1", "done")
        db.drain("n3")
        db.submit_run([step("s", "linux")], run_id="busy1")
        db.submit_run([step("s", "gpu")], run_id="busy2")
        db.submit_run([step("train", "gpu")], run_id="q-gpu")
        db.submit_run([step("build", "linux"), step("test", "linux"), step("lint")], "q-linux")
        db.submit_run([step("lint")], run_id="gone")
        assert db.cancel_run("gone")
        db.submit_run([step("lint")], run_id="q-any")
        assert [r.run_id for r in db.list_runs("QUEUED")] == ["q-gpu", "q-linux", "q-any"]
    return path


# -- views -------------------------------------------------------------------------


def test_queue_json_lists_queued_runs_in_fifo_order_with_their_wait(cluster: Path) -> None:
    queued = as_json(cluster, "queue")
    assert [r["run_id"] for r in queued] == ["q-gpu", "q-linux", "q-any"]
    waits = [r["waited"] for r in queued]
    assert waits == sorted(waits, reverse=True)
    assert all(w >= 0 for w in waits)
    assert [s["needs"] for s in queued[1]["steps"]] == [["linux"], ["linux"], []]
    assert {r["state"] for r in queued} == {"QUEUED"}


def test_queue_table_shows_position_wait_and_what_each_step_needs(cluster: Path) -> None:
    table = rows(ok(cluster, "queue"))
    assert [(r["#"], r["RUN"], r["STEPS"], r["NEEDS"]) for r in table] == [
        ("1", "q-gpu", "1", "train(gpu)"),
        ("2", "q-linux", "3", "build(linux) test(linux) lint"),
        ("3", "q-any", "1", "lint"),
    ]
    assert all(re.fullmatch(r"\d+s", r["WAITED"]) for r in table)


def test_nodes_show_who_is_busy_with_which_run_and_who_drains(cluster: Path) -> None:
    nodes = by_id(as_json(cluster, "nodes"))
    assert {n: (v["state"], v["run_id"]) for n, v in nodes.items()} == {
        "n1": ("busy", "busy1"),
        "n2": ("busy", "busy2"),
        "n3": ("draining", None),
    }
    assert 0 < nodes["n1"]["expires_in"] <= 30
    assert nodes["n3"]["expires_in"] is None
    assert nodes["n2"]["caps"] == ["gpu", "linux"]

    table = {r["NODE"]: r for r in rows(ok(cluster, "nodes"))}
    n1, n2, n3 = table["n1"], table["n2"], table["n3"]
    assert (n2["NAME"], n2["CAPS"], n2["STATE"], n2["RUN"]) == (
        "box-n2",
        "gpu,linux",
        "busy",
        "busy2",
    )
    assert re.fullmatch(r"\d+s", n1["LEASE"])
    assert re.fullmatch(r"\d+s ago", n1["SEEN"])
    assert (n3["STATE"], n3["RUN"], n3["LEASE"]) == ("draining", "-", "-")


def test_runs_come_in_fifo_order_and_filter_by_state_in_any_case(cluster: Path) -> None:
    everything = as_json(cluster, "runs")
    assert [r["run_id"] for r in everything] == FIFO
    running = as_json(cluster, "runs", "--state", "running")
    assert [r["run_id"] for r in running] == ["busy1", "busy2"]
    (gone,) = as_json(cluster, "runs", "--state", "Failed")
    assert (gone["run_id"], gone["reason"], gone["ran"]) == ("gone", "cancelled", None)

    table = rows(ok(cluster, "runs"))
    assert [r["RUN"] for r in table] == FIFO
    by_run = {r["RUN"]: r for r in table}
    some = ("done", "busy1", "q-gpu", "gone")
    assert [by_run[r]["STATE"] for r in some] == ["SUCCEEDED", "RUNNING", "QUEUED", "FAILED"]
    assert [by_run[r]["TIME"].split()[0] for r in some] == ["took", "running", "waiting", "waited"]
    assert (by_run["q-linux"]["STEPS"], by_run["gone"]["REASON"]) == ("3", "cancelled")


def test_show_gives_the_steps_and_the_sealed_record(cluster: Path) -> None:
    text = ok(cluster, "show", "done")
    summary, steps = text.split("\n\n")
    assert re.search(r"^record +sealed .* sha256:[0-9a-f]{64}$", summary, re.MULTILINE)
    assert rows(steps) == [
        {
            "SEQ": "1",
            "NAME": "a",
            "KIND": "exec",
            "NEEDS": "linux",
            "STATE": "SUCCEEDED",
            "NODE": "n1 (box-n1)",
            "OUTPUT": "-",
        }
    ]
    queued = as_one(cluster, "show", "q-linux")
    assert [s["state"] for s in queued["steps"]] == ["PENDING"] * 3
    assert queued["record"]["sealed_at"] is None
    assert "digest" not in queued["record"]


def test_show_gives_what_each_step_reported(cluster: Path) -> None:
    """``--json`` gives a step's output whole; the table a line of it."""
    with store.open(cluster) as db:
        claim = db.claim_step("n1")
        assert claim is not None and claim.run_id == "busy1"
        db.report_step("n1", "busy1", claim.seq, ok=True, output={"log": "x" * 100, "code": 0})
    shown = as_one(cluster, "show", "busy1")
    assert shown["steps"][0]["output"] == {"log": "x" * 100, "code": 0}
    (row,) = rows(ok(cluster, "show", "busy1").split("\n\n")[1])
    assert row["OUTPUT"] == '{"log":"' + "x" * 31 + "\u2026"


def test_explain_says_why_a_queued_run_waits(cluster: Path) -> None:
    why = as_one(cluster, "explain", "q-linux")
    assert (why["id"], why["position"], why["ahead"]) == ("q-linux", 2, ["q-gpu"])
    build = why["steps"][0]["nodes"]
    assert [(n["node_id"], n["why"], n.get("run_id")) for n in build] == [
        ("n1", "busy", "busy1"),
        ("n2", "busy", "busy2"),
        ("n3", "draining", None),
    ]
    text = ok(cluster, "explain", "q-linux")
    head, steps = text.split("\n\n")
    assert re.search(r"^state +QUEUED, number 2 in the queue \(after q-gpu\)$", head, re.M)
    assert re.search(r"^verdict +it waits for the nodes below$", head, re.M)
    first = rows(steps)[:3]
    assert [(r["SEQ"], r["STEP"], r["NODE"]) for r in first] == [
        ("1", "build", "n1 (box-n1)"),
        ("", "", "n2 (box-n2)"),
        ("", "", "n3 (box-n3)"),
    ]
    assert first[0]["WHY"].startswith("busy with busy1 (lease ends in ")
    assert first[2]["WHY"] == "draining"
    # Not waiting: the head says so and no table follows.
    assert "verdict    not waiting: it is SUCCEEDED" in ok(cluster, "explain", "done")


def test_explain_names_the_run_that_reserves_a_node(cluster: Path) -> None:
    """With ``--reserve-after``, the settings of the service that places runs,
    explain tells which run ahead holds a free node back."""
    with store.open(cluster, lease_ttl=0) as holding:
        finish(holding, "n1", "busy1")  # n1 free, and nothing promoted
    why = as_one(cluster, "explain", "q-any", "--reserve-after", "0")
    assert why["reserving"] is True
    n1 = by_id(why["steps"][0]["nodes"])["n1"]
    assert (n1["why"], n1["run_id"]) == ("reserved", "q-linux")
    text = ok(cluster, "explain", "q-any", "--reserve-after", "0")
    assert re.search(
        r"^reserving +yes: no run behind it is placed on a node it could use$", text, re.M
    )
    (line,) = [r for r in rows(text.split("\n\n")[1]) if r["NODE"] == "n1 (box-n1)"]
    assert line["WHY"] == "reserved for q-linux, which waited longer"

    never = as_one(cluster, "explain", "q-any", "--reserve-after", "never")
    assert never["reserving"] is False
    assert by_id(never["steps"][0]["nodes"])["n1"]["why"] is None
    bad = cli("--db", cluster, "explain", "q-any", "--reserve-after", "soon")
    assert bad.returncode == 2
    assert "expected a number of seconds >= 0, or never, not 'soon'" in bad.stderr


def test_show_exits_1_for_a_run_that_ended_failed(cluster: Path) -> None:
    done = cli("--db", cluster, "show", "gone", "--json")
    assert (done.returncode, done.stderr) == (1, "")
    shown = json.loads(done.stdout)
    assert (shown["state"], shown["record"]["state"]) == ("FAILED", "FAILED")
    assert shown["record"]["digest"].startswith("sha256:")


def test_views_leave_the_store_file_as_it_was(cluster: Path) -> None:
    # n1 is free and q-linux fits it: anything that wakes the queue (opening
    # the store for writing does) would promote it.
    with store.open(cluster, lease_ttl=0) as holding:
        finish(holding, "n1", "busy1")
    wal = cluster.with_name(cluster.name + "-wal")

    def state() -> tuple[bytes, int]:
        return cluster.read_bytes(), wal.stat().st_size if wal.exists() else 0

    before = state()
    for view in (["nodes"], ["runs"], ["show", "q-linux"]):
        ok(cluster, *view)
    assert len(as_json(cluster, "queue")) == 3
    assert state() == before


def test_views_work_where_nobody_may_write_and_leave_nothing_behind(cluster: Path) -> None:
    folder = cluster.parent
    files = sorted(folder.iterdir())
    for view in (["nodes"], ["runs"], ["queue"], ["show", "q-linux"]):
        ok(cluster, *view)
    assert sorted(folder.iterdir()) == files
    with frozen(folder, cluster):
        assert len(as_json(cluster, "queue")) == 3
        assert by_id(as_json(cluster, "nodes"))["n1"]["run_id"] == "busy1"
    assert sorted(folder.iterdir()) == files


def test_the_store_file_is_db_else_batch_db_else_batch_sqlite3_here(cluster: Path) -> None:
    elsewhere = cluster.parent / "elsewhere"
    elsewhere.mkdir()
    missing = str(elsewhere / "missing.sqlite3")

    def node_ids(done: subprocess.CompletedProcess[str]) -> list[str]:
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["node_id"] for line in done.stdout.splitlines()]

    nodes = ["n1", "n2", "n3"]
    assert node_ids(cli("nodes", "--json", cwd=cluster.parent)) == nodes
    assert node_ids(cli("nodes", "--json", cwd=elsewhere, BATCH_DB=str(cluster))) == nodes
    assert node_ids(cli("--db", cluster, "nodes", "--json", BATCH_DB=missing)) == nodes
    # --db after the command's name too, as on python -m batch.
    assert node_ids(cli("nodes", "--db", cluster, "--json", BATCH_DB=missing)) == nodes
    # The name the store had before both commands shared one is still read,
    # after the shared one.
    assert node_ids(cli("nodes", "--json", cwd=elsewhere, STORE_DB=str(cluster))) == nodes
    both = {"BATCH_DB": str(cluster), "STORE_DB": missing}
    assert node_ids(cli("nodes", "--json", cwd=elsewhere, **both)) == nodes


def test_both_command_lines_look_at_one_store_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """What batch-store shows by default is the store batch-runner writes by
    default: one file name, one environment variable."""

    def stores() -> set[str]:
        return {
            batch.cli.build_parser().parse_args(["jobs"]).db,
            store.runs.cli.build_parser().parse_args(["nodes"]).db,
        }

    monkeypatch.delenv("BATCH_DB", raising=False)
    monkeypatch.delenv("STORE_DB", raising=False)
    assert stores() == {"batch.sqlite3"}
    monkeypatch.setenv("BATCH_DB", "postgresql://db.internal/jobs")
    assert stores() == {"postgresql://db.internal/jobs"}


# -- actions ---------------------------------------------------------------------


def test_wake_promotes_the_oldest_run_that_fits_a_freed_node(cluster: Path) -> None:
    # A handle that never places a run frees n1 without waking the queue.
    with store.open(cluster, lease_ttl=0) as holding:
        finish(holding, "n1", "busy1")
    assert len(as_json(cluster, "queue")) == 3

    # q-gpu waits for n2; q-linux, next, fits n1; q-any finds nothing left.
    assert rows(ok(cluster, "wake")) == [{"PROMOTED": "q-linux", "NODES": "n1"}]
    assert by_id(as_json(cluster, "nodes"))["n1"]["run_id"] == "q-linux"
    assert [r["run_id"] for r in as_json(cluster, "queue")] == ["q-gpu", "q-any"]
    assert as_json(cluster, "wake") == []


def test_reap_fails_runs_whose_lease_expired_and_frees_their_node(cluster: Path) -> None:
    # Freeing n1 under a one-microsecond lease promotes q-linux with a lease
    # that has expired by the time the command runs.
    with store.open(cluster, lease_ttl=1e-6) as short:
        finish(short, "n1", "busy1")
        assert short.get_run("q-linux").state == "RUNNING"

    assert rows(ok(cluster, "reap")) == [
        {"RUN": "q-linux", "WHAT": "reaped", "WHY": "lease expired on node 'n1'"},
        {"RUN": "q-any", "WHAT": "promoted", "WHY": "on n1"},
    ]
    assert cli("--db", cluster, "show", "q-linux").returncode == 1
    # The freed node goes to the next run that fits; busy2's lease is intact.
    nodes = by_id(as_json(cluster, "nodes"))
    assert (nodes["n1"]["run_id"], nodes["n2"]["run_id"]) == ("q-any", "busy2")
    assert nodes["n1"]["expires_in"] > 0
    assert as_json(cluster, "reap") == []


def test_cancel_ends_a_running_run_and_its_node_goes_to_the_queue(cluster: Path) -> None:
    cancelled = as_one(cluster, "cancel", "busy1")
    assert (cancelled["state"], cancelled["cancelled"]) == ("FAILED", True)
    assert "cancel" in cancelled["reason"]
    # n1 freed: q-linux, the oldest run that fits it, runs there now.
    assert by_id(as_json(cluster, "nodes"))["n1"]["run_id"] == "q-linux"

    again = cli("--db", cluster, "cancel", "busy1")
    assert (again.returncode, again.stderr) == (1, "")
    assert again.stdout.rstrip().endswith("run busy1 had ended already: nothing cancelled")


def test_drain_and_undrain_change_what_nodes_shows(cluster: Path) -> None:
    drained = as_one(cluster, "drain", "n1")
    assert (drained["state"], drained["run_id"]) == ("busy+draining", "busy1")
    assert by_id(as_json(cluster, "nodes"))["n1"]["draining"] is True

    # Undraining n3 wakes the queue: q-linux, the oldest run that fits, takes it.
    (row,) = rows(ok(cluster, "undrain", "n3"))
    assert (row["NODE"], row["STATE"], row["RUN"]) == ("n3", "busy", "q-linux")

    assert as_one(cluster, "undrain", "n1")["state"] == "busy"
    assert {n["state"] for n in as_json(cluster, "nodes")} == {"busy"}


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        pytest.param(["--db", "{tmp}/missing", "nodes"], 1, "no store file", id="missing"),
        pytest.param(["--db", "{tmp}/missing", "wake"], 1, "no store file", id="act-missing"),
        pytest.param(["--db", "{tmp}", "queue"], 1, "no store file", id="directory"),
        pytest.param(["--db", "{tmp}/notes.txt", "runs"], 1, "not a database", id="text"),
        pytest.param(["--db", "{tmp}/other.db", "nodes"], 1, "not a store file", id="other-db"),
        pytest.param(["--db", "{tmp}/other.db", "reap"], 1, "not a store file", id="act-other"),
        pytest.param(["show", "nope"], 3, "no run 'nope'", id="unknown-run"),
        pytest.param(["cancel", "nope"], 3, "no run 'nope'", id="cancel-unknown"),
        pytest.param(["explain", "nope"], 3, "no run 'nope'", id="explain-unknown"),
        pytest.param(["drain", "nope"], 3, "no node 'nope'", id="unknown-node"),
        pytest.param(["undrain", "nope"], 3, "no node 'nope'", id="undrain-unknown"),
        pytest.param(["runs", "--state", "done"], 2, "invalid choice: 'DONE'", id="bad-state"),
        pytest.param(["wake", "--lease-ttl", "soon"], 2, "--lease-ttl", id="bad-lease-ttl"),
        pytest.param(["show"], 2, "required: RUN", id="no-run"),
        pytest.param([], 2, "required: COMMAND", id="no-command"),
        pytest.param(["promote"], 2, "invalid choice: 'promote'", id="unknown-command"),
    ],
)
def test_bad_input_is_one_line_on_stderr_with_the_right_status(
    cluster: Path, args: list[str], status: int, says: str
) -> None:
    tmp = cluster.parent
    (tmp / "notes.txt").write_text("not a database, only notes\n")
    with contextlib.closing(sqlite3.connect(tmp / "other.db")) as other:
        other.execute("CREATE TABLE t (x)")
        other.commit()
    other_bytes = (tmp / "other.db").read_bytes()

    # BATCH_DB names the good store; a --db in the case overrides it.
    done = cli(*(a.format(tmp=tmp) for a in args), BATCH_DB=str(cluster))

    assert done.returncode == status
    assert done.stdout == ""
    assert done.stderr.startswith("store: ")
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n")
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    # Nothing was created, and another program's database was left alone.
    assert not (tmp / "missing").exists()
    assert (tmp / "other.db").read_bytes() == other_bytes


def test_an_interrupt_exits_130_with_one_line(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(path: str) -> Store:
        raise KeyboardInterrupt

    monkeypatch.setattr(store.runs.cli, "_open_view", interrupted)
    assert store.runs.cli.main(["--db", str(cluster), "nodes"]) == 130
    assert capsys.readouterr() == ("", "store: interrupted\n")


def test_a_wake_that_fails_after_an_action_is_a_warning_line_not_a_traceback(
    cluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def locked(self: Store, why: str = "") -> list[str]:
        raise store.StoreError("database is locked")

    monkeypatch.setattr(Store, "wake_queued", locked)
    assert store.runs.cli.main(["--db", str(cluster), "undrain", "n3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["state"] == "idle"
    assert err
    for line in err.splitlines():
        assert line.startswith("store: wake (") and line.endswith("database is locked)")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (12.9, "12s"), (184, "3m04s"), (7260, "2h01m"), (273_600, "3d04h"), (-5, "0s")],
)
def test_durations_read_the_way_people_write_them(seconds: float, shown: str) -> None:
    assert store.runs.cli.duration(seconds) == shown


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1048576", 1_048_576),
        ("512KiB", 512 * 1024),
        ("1MiB", 1024**2),
        ("1 mib", 1024**2),
        ("2.5GB", 2_500_000_000),
        ("10M", 10_000_000),
        ("0", 0),
    ],
)
def test_sizes_read_the_way_people_write_them(text: str, nbytes: int) -> None:
    assert store.console.bytes_size(text) == nbytes


@pytest.mark.parametrize("text", ["lots", "-1", "1XB", "1.5.2MiB", "", "MiB"])
def test_a_size_that_is_not_one_is_refused_saying_what_is_expected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as"):
        store.console.bytes_size(text)
