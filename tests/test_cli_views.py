"""``python -m batch``'s views of a store (jobs, status, targets, pause,
prune, upstreams, explain) and its answers to bad input, each run as a real
process against a real store file."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import batch
import store
from store.ledger import Ledger
from tests.cli_helpers import WAIT, cli, url_file
from tests.helpers import frozen, within

pytestmark = pytest.mark.timeout(60)


# -- jobs, status, targets -------------------------------------------------------------


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """A store with 17 jobs of one target each (so two of their ids share a
    first character), then one of bob's that ends partial; and their ids."""

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        if target.ref == "bad":
            raise batch.TargetError("no such thing", hint="check the ref")
        return {"ref": target.ref}

    path = tmp_path / "jobs.sqlite3"
    alice, bob = batch.Caller("alice"), batch.Caller("bob")
    with store.open(path) as db, batch.Runner(db, fetch) as runner:
        ids = [runner.submit(alice, [f"doc-{n}"]) for n in range(17)]
        ids.append(runner.submit(bob, ["good", "bad"]))
        for job_id in ids:
            runner.wait(bob if job_id == ids[-1] else alice, job_id, timeout=WAIT)
    return path, ids


def test_jobs_lists_the_store(history: tuple[Path, list[str]]) -> None:
    path, ids = history
    done = cli("jobs", "--db", path, "--json")
    assert (done.returncode, done.stderr) == (0, ""), done
    jobs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [j["id"] for j in jobs] == ids
    assert jobs[-1] == {
        **jobs[-1],
        "caller": "bob",
        "status": "partial",
        "done": 1,
        "failed": 1,
        "pending": 0,
    }
    table = cli("jobs", "--db", path, "--caller", "bob").stdout.splitlines()
    assert table[0].split()[:4] == ["job", "name", "caller", "status"]
    assert [line.split()[:4] for line in table[1:]] == [[ids[-1][:12], "-", "bob", "partial"]]
    assert cli("jobs", "--db", path, "--caller", "carol").stdout == "no jobs\n"
    assert cli("jobs", "--db", path, "--caller", "carol", "--json").stdout == ""


def test_pause_and_unpause_are_stored_and_shown(history: tuple[Path, list[str]]) -> None:
    """``pause`` stores what it is given and shows what is paused (alone:
    only shows it); ``jobs`` and ``status`` say whose caller is paused;
    ``unpause`` lifts it; a runner opened later honours what is stored."""
    path, _ = history
    assert cli("pause", "--db", path).stdout == "nothing is paused\n"
    done = cli("pause", "--caller", "alice", "--db", path, "--json")
    assert done.returncode == 0, done
    assert [json.loads(line)["name"] for line in done.stdout.splitlines()] == ["alice"]
    refused = cli("pause", "--upstream", "example.org", "--db", path)
    assert refused.returncode == 2, refused  # no runner has met it: it would pause nothing
    assert "no upstream 'example.org'" in refused.stderr
    with store.open(path) as db:  # as a runner that meets it tells the store
        Ledger.of(db).sync_upstreams("runner-1", 60, [], ["https://example.org:443"])
    done = cli("pause", "--upstream", "example.org", "--db", path)
    assert [line.split()[:2] for line in done.stdout.splitlines()] == [
        ["paused", "name"],
        ["caller", "alice"],
        ["upstream", "example.org"],
    ]
    jobs = cli("jobs", "--db", path)
    assert jobs.stdout.splitlines()[-1] == "paused: caller alice, upstream example.org"
    listed = [json.loads(line) for line in cli("jobs", "--db", path, "--json").stdout.splitlines()]
    assert [j["paused"] for j in listed] == [True] * 17 + [False]
    with store.open(path) as db, batch.Runner(db, lambda ctx, caller, target: None) as runner:
        job = runner.submit(batch.Caller("alice"), ["x"])
        assert within(WAIT, lambda: runner.explain(batch.Caller("alice"), job)["state"] == "paused")
        status = cli("status", job, "--db", path)
        assert "queued (its caller is paused)" in status.stdout, status
        done = cli("unpause", "--caller", "alice", "--upstream", "example.org", "--db", path)
        assert done.stdout == "nothing is paused\n"
        # This runner learns it at its next beat.
        assert runner.wait(batch.Caller("alice"), job, timeout=WAIT).status == "done"
    assert cli("pause", "--caller", "", "--db", path).returncode == 2


def test_prune_deletes_what_ended_of_the_statuses_given(history: tuple[Path, list[str]]) -> None:
    path, ids = history
    kept = cli("prune", "--older-than", "3600", "--db", path, "--json")
    assert (kept.returncode, json.loads(kept.stdout)) == (0, {"pruned": 0}), kept
    done = cli("prune", "--older-than", "0", "--status", "partial", "--db", path)
    assert (done.returncode, done.stdout) == (0, "pruned 1 job(s)\n"), done
    with store.open(path) as db:
        assert [j.id for j in db.list_jobs()] == ids[:-1]
    assert cli("prune", "--older-than", "0", "--status", "queued", "--db", path).returncode == 2
    assert cli("prune", "--db", path).returncode == 2


def test_status_shows_when_a_job_starts_and_what_it_waits_after(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    with store.open(path) as db:
        Ledger.of(db).create_job("first-job-00000", "alice", ["a"])
        Ledger.of(db).create_jobs(
            "alice",
            [("later-job-00000", ["b"])],
            later=store.Later(2_000_000_000.0, ("first-job-00000",), after_ok=True),
        )
    shown = cli("status", "later-job", "--db", path, "--json")
    assert shown.returncode == 0, shown
    data = json.loads(shown.stdout)
    assert (data["status"], data["deferred"], data["after"]) == (
        "queued",
        True,
        ["first-job-00000"],
    )
    assert data["not_before"] == 2_000_000_000.0
    text = cli("status", "later-job", "--db", path).stdout
    assert "starts   not before 2033-05-18" in text, text
    assert "after    first-job-00 (1 not ended)" in text, text


def test_views_read_a_store_nobody_may_write(history: tuple[Path, list[str]]) -> None:
    path, ids = history
    with frozen(path.parent, path):
        done = cli("jobs", "--db", path, "--json")
        assert (done.returncode, done.stderr) == (0, ""), done
        assert len(done.stdout.splitlines()) == len(ids)
        assert cli("status", ids[0], "--db", path).returncode == 0
    assert sorted(p.name for p in path.parent.iterdir()) == ["jobs.sqlite3"]


def test_status_and_targets_take_a_unique_prefix(history: tuple[Path, list[str]]) -> None:
    path, ids = history
    prefix = ids[-1][:6]
    status = cli("status", prefix, "--db", path, "--json")
    assert status.returncode == 1, status  # the job ended partial
    assert json.loads(status.stdout)["id"] == ids[-1]
    targets = cli("targets", prefix, "--db", path, "--json")
    assert targets.returncode == 0, targets
    assert [json.loads(line) for line in targets.stdout.splitlines()] == [
        {
            "id": ids[-1],
            "job_id": ids[-1],
            "pos": 0,
            "ref": "good",
            "status": "done",
            "error": None,
            "hint": None,
            "result": {"ref": "good"},
            "result_bytes": len('{"ref":"good"}'),
        },
        {
            "id": ids[-1],
            "job_id": ids[-1],
            "pos": 1,
            "ref": "bad",
            "status": "failed",
            "error": "no such thing",
            "hint": "check the ref",
            "result": None,
            "result_bytes": None,
        },
    ]
    assert "no such thing (check the ref)" in cli("targets", prefix, "--db", path).stdout


def test_an_ambiguous_prefix_is_refused(history: tuple[Path, list[str]]) -> None:
    path, ids = history
    [(first, _)] = Counter(job_id[0] for job_id in ids).most_common(1)
    done = cli("status", first, "--db", path)
    assert done.returncode == 2
    assert re.fullmatch(
        rf"batch: '{first}' is the start of \d+ job ids: give more of it\n", done.stderr
    )


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["fetch", "{tmp}/nowhere.txt"], 1, "cannot read .*nowhere.txt: No such file"),
        (["fetch", "{urls}"], 2, r"urls.txt line 3: not an http, https or file URL: 'ftp://x/'"),
        (["fetch", "{tmp}/empty.txt"], 2, "empty.txt: no URLs in it"),
        (["fetch", "{tmp}/latin1.txt"], 2, "latin1.txt: not UTF-8 text"),
        (["fetch", "{tmp}/spaces.txt"], 2, "spaces.txt line 1: spaces or control characters"),
        (["fetch", "{tmp}/nohost.txt"], 2, "nohost.txt line 1: no host in 'http:///x'"),
        (["fetch", "{ok}", "--save", "{tmp}/empty.txt"], 2, "--save: .* is not a directory"),
        (
            ["fetch", "{ok}", "--workers", "0"],
            2,
            "argument --workers: expected a whole number >= 1, not '0'",
        ),
        (["fetch", "{ok}", "--db", "{tmp}/empty.txt"], 1, "not a store file"),
        (["jobs", "--db", "{tmp}/missing.sqlite3"], 1, "no store file at"),
        (["jobs", "--db", "{tmp}/empty.txt"], 1, "not a store file"),
        (["jobs", "--db", "{db}", "--status", "lost"], 2, "argument --status: invalid choice"),
        (["status", "feed", "--db", "{db}"], 3, "no job 'feed' in"),
        (["targets", "\u00e9t\u00e9", "--db", "{db}"], 3, "no job '\u00e9t\u00e9' in"),
        (["cancel", "feed", "--db", "{db}"], 3, "no job 'feed' in"),
        (["fetch", "{ok}", "--max-bytes", "lots"], 2, "argument --max-bytes: expected a size"),
        (["fetch", "{ok}", "--per-host", "2", "--in-order"], 2, "not allowed with argument"),
        (["fetch", "{ok}", "--rate", "fast"], 2, r"argument --rate: not a rate: 'fast' \(say 20/s"),
        (["fetch", "{ok}", "--rate", "0/s"], 2, "argument --rate: not a rate: '0/s'"),
        (["fetch", "{ok}", "--rate", "5/week"], 2, "argument --rate: not a rate"),
        (["fetch", "{ok}", "--concurrency", "0"], 2, "argument --concurrency: expected a whole"),
        ([], 2, "the following arguments are required"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "empty.txt").write_text("# nothing\n\n")
    (tmp_path / "latin1.txt").write_bytes("http://h/caf\u00e9\n".encode("latin-1"))
    (tmp_path / "spaces.txt").write_text("http://h/a b\n")
    (tmp_path / "nohost.txt").write_text("http:///x\n")
    (tmp_path / "ok.txt").write_text("http://127.0.0.1:9/\n")
    url_file(tmp_path, "http://h/", "# comment", "ftp://x/")
    store.open(tmp_path / "jobs.sqlite3").close()
    paths = {"tmp": tmp_path, "urls": tmp_path / "urls.txt", "ok": tmp_path / "ok.txt"}
    paths["db"] = tmp_path / "jobs.sqlite3"
    done = cli(*(arg.format(**paths) for arg in args))
    assert done.returncode == code, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert re.match(f"batch: .*{message}", done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_upstreams_and_explain_say_why_a_job_waits_on_its_host(tmp_path: Path) -> None:
    """A job whose next URL's host a busy answer holds is explained so, and
    the host is listed with its hold."""
    db_path = tmp_path / "jobs.sqlite3"
    with store.open(db_path) as db:
        Ledger.of(db).create_jobs(
            "me", [("j1", ["http://example.org/a"])], "runner-1", lease_for=60
        )
        Ledger.of(db).sync_upstreams(
            "runner-1", 60, [store.UpstreamWant("http://example.org:80", 1, None, None, 0, 30.0)]
        )
    listed = cli("upstreams", "--db", db_path)
    assert listed.returncode == 0, listed
    assert re.search(r"^http://example\.org:80\s+(29|30)s\s+1\s+1\s", listed.stdout, re.M), listed
    why = cli("explain", "j1", "--db", db_path)
    assert why.returncode == 0, why
    assert "held for" in why.stdout and "http://example.org:80" in why.stdout, why.stdout
