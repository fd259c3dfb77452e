"""``python -m batch``: every command run as a real process, against a real
HTTP server on 127.0.0.1 and a real store file, then checked in the store."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import batch
import store
from bench.counting import serving
from store.ledger import Ledger
from tests.helpers import frozen, within

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
WAIT = 30.0
#: The Crawl-delay the test server's robots.txt asks of "localhost".
CRAWL_DELAY = 0.2
#: The columns of the table ``demo`` and ``fetch`` end with.
SUMMARY = ["job", "name", "caller", "status", "done", "failed", "pending", "seconds", "retries"]


class Upstream(ThreadingHTTPServer):
    """A server answering by path: ``/busy/...`` 429 (``Retry-After: 0``) the
    first time, then 200; ``/missing`` 404; ``/broken`` 500; ``/hold`` sets
    ``arrived``, then answers 200 once ``release`` is set; any other path 200,
    with the path as the body."""

    daemon_threads = False  # server_close() joins every handler thread

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.arrived = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._asked: Counter[str] = Counter()
        self.arrivals: list[float] = []  # time.monotonic() of each request

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.server_port}{path}"

    def asked(self, path: str) -> int:
        """How many requests came for ``path``."""
        with self._lock:
            return self._asked[path]

    def note(self, path: str) -> int:
        with self._lock:
            self.arrivals.append(time.monotonic())
            self._asked[path] += 1
            return self._asked[path]


class _Handler(BaseHTTPRequestHandler):
    server: Upstream

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        times = self.server.note(path)
        headers = {}
        if path == "/robots.txt" and self.headers.get("Host", "").startswith("localhost"):
            body = f"User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if path.startswith("/busy/") and times == 1:
            status, headers = 429, {"Retry-After": "0"}
        elif path in ("/missing", "/broken"):
            status = 404 if path == "/missing" else 500
        else:
            status = 200
        if path == "/hold":
            self.server.arrived.set()
            self.server.release.wait(WAIT)
        body = path.encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with serving(Upstream()) as server:
        try:
            yield server
        finally:
            server.release.set()


def environment() -> dict[str, str]:
    """This environment, without a default store or a proxy in the way."""
    env = {k: v for k, v in os.environ.items() if k != "BATCH_DB" and "proxy" not in k.lower()}
    return {**env, "PYTHONPATH": str(REPO), "NO_PROXY": "*"}


def command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "batch", *map(str, args)]


def cli(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batch ARGS`` to its end."""
    return subprocess.run(
        command(*args),
        cwd=REPO,
        env=environment(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def url_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def stored(path: Path) -> list[store.JobRow]:
    """Every job in the store at ``path``, with its targets, oldest first."""
    with store.open(path, readonly=True) as db:
        return [job for s in db.list_jobs() if (job := db.find_job(s.id)) is not None]


def outcome(target: store.TargetRow) -> tuple[str, str, str | None, str | None]:
    return target.ref, target.status, target.error, target.hint


# -- demo ---------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_ends_as_its_summary_says(tmp_path: Path) -> None:
    db = tmp_path / "demo.sqlite3"
    done = cli("demo", "--db", db)
    assert (done.returncode, done.stderr) == (0, ""), done
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("job "))
    assert lines[header].split() == SUMMARY
    end = lines.index("", header)
    rows = [dict(zip(SUMMARY, line.split(), strict=True)) for line in lines[header + 1 : end]]
    jobs = {job.id[:12]: job for job in stored(db)}
    assert sorted(row["job"] for row in rows) == sorted(jobs)
    for row in rows:
        job = jobs[row["job"]]
        counts = Counter(t.status for t in job.targets)
        assert (job.owner, job.status, counts["done"], counts["failed"], counts["pending"]) == (
            row["caller"],
            row["status"],
            int(row["done"]),
            int(row["failed"]),
            int(row["pending"]),
        )
    archive = next(row for row in rows if row["name"] == "archive")
    assert archive["status"] == "cancelled"
    assert int(archive["pending"]) > 0
    assert {row["caller"] for row in rows} == {"alice", "bob"}
    assert sum(int(row["retries"]) for row in rows) > 0
    assert "at most 1 per job at a time" in done.stdout
    assert "no sooner than its Retry-After" in done.stdout
    assert lines[-1] == f"store: {db}"


# -- fetch ---------------------------------------------------------------------------


def test_fetch_stores_every_outcome(tmp_path: Path, upstream: Upstream) -> None:
    urls = [upstream.url(p) for p in ("/ok/a", "/busy/b", "/missing", "/broken")]
    source = url_file(tmp_path, "# four documents", urls[0], "", *urls[1:])
    db = tmp_path / "jobs.sqlite3"
    done = cli("fetch", source, "--db", db, "--caller", "tester", "--retry-wait", "0")
    assert (done.returncode, done.stderr) == (1, ""), done
    [job] = stored(db)
    assert (job.owner, job.status) == ("tester", "partial")
    assert [outcome(t) for t in job.targets] == [
        (urls[0], "done", None, None),
        (urls[1], "done", None, None),
        (urls[2], "failed", "HTTP 404 Not Found", "check the URL"),
        (urls[3], "failed", "HTTP 500 Internal Server Error", "server error; try again later"),
    ]
    result = json.loads(job.targets[1].result or "")
    assert (result["status"], result["bytes"]) == (200, len("/busy/b"))
    assert upstream.asked("/busy/b") == 2
    assert re.search(
        rf"^{job.id[:12]}\s+127\.0\.0\.1\s+tester\s+partial\s+2\s+2\s+0\s+\S+\s+1$",
        done.stdout,
        re.MULTILINE,
    ), done.stdout


def test_fetch_makes_one_job_per_host(tmp_path: Path, upstream: Upstream) -> None:
    """By default each host's URLs are one job (one request at a time per
    host, the hosts side by side), named for the host."""
    here = [upstream.url(f"/ok/{n}") for n in range(3)]
    there = [upstream.url(f"/ok/{n}", host="localhost") for n in range(2)]
    source = url_file(tmp_path, here[0], there[0], here[1], there[1], here[2])
    db = tmp_path / "jobs.sqlite3"
    done = cli("fetch", source, "--db", db)
    assert (done.returncode, done.stderr) == (0, ""), done
    jobs = stored(db)
    assert [[t.ref for t in job.targets] for job in jobs] == [here, there]
    assert [job.name for job in jobs] == ["127.0.0.1", "localhost"]
    assert {job.status for job in jobs} == {"done"}


def test_fetch_per_host_n_deals_each_hosts_urls_among_n_jobs(
    tmp_path: Path, upstream: Upstream
) -> None:
    urls = [upstream.url(f"/ok/{n}") for n in range(5)]
    db = tmp_path / "jobs.sqlite3"
    done = cli("fetch", url_file(tmp_path, *urls), "--db", db, "--per-host", "2")
    assert (done.returncode, done.stderr) == (0, ""), done
    jobs = stored(db)
    assert [[t.ref for t in job.targets] for job in jobs] == [urls[0::2], urls[1::2]]
    assert [job.name for job in jobs] == ["127.0.0.1 1/2", "127.0.0.1 2/2"]


def test_fetch_in_order_makes_the_list_one_job(tmp_path: Path, upstream: Upstream) -> None:
    urls = [upstream.url("/ok/a"), upstream.url("/ok/b", host="localhost"), upstream.url("/ok/c")]
    db = tmp_path / "jobs.sqlite3"
    done = cli("--db", db, "fetch", url_file(tmp_path, *urls), "--in-order")
    assert (done.returncode, done.stderr) == (0, ""), done
    [job] = stored(db)
    assert ([t.ref for t in job.targets], job.name) == (urls, "urls.txt")


def test_fetch_json_prints_one_line_per_target(tmp_path: Path, upstream: Upstream) -> None:
    urls = [upstream.url(p) for p in ("/ok/a", "/missing")]
    db = tmp_path / "jobs.sqlite3"
    done = cli("fetch", "-", "--db", db, "--json", stdin="\n".join(urls))
    assert done.returncode == 1, done
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    [job] = stored(db)
    assert [(line["ref"], line["status"], line["job_id"], line["pos"]) for line in lines] == [
        (urls[0], "done", job.id, 0),
        (urls[1], "failed", job.id, 1),
    ]
    assert lines[0]["result"]["final_url"] == urls[0]
    assert (lines[1]["error"], lines[1]["hint"]) == ("HTTP 404 Not Found", "check the URL")
    assert "Traceback" not in done.stderr
    assert "[" in done.stderr  # the progress went there


def test_fetch_saves_inside_its_directory_whatever_the_url(
    tmp_path: Path, upstream: Upstream
) -> None:
    paths = [
        "/ok/a.txt",
        "/ok/../../escape.txt",
        "/%2e%2e/%2e%2e/escape",
        "/..%2f..%2fx",
        "/" + "a" * 3000,
    ]
    source = url_file(tmp_path, *(upstream.url(p) for p in paths))
    saves = tmp_path / "saves"
    done = cli("fetch", source, "--db", tmp_path / "jobs.sqlite3", "--save", saves)
    assert (done.returncode, done.stderr) == (0, ""), done
    outside = {p.name for p in tmp_path.iterdir()} - {"saves", "urls.txt"}
    assert all(name.startswith("jobs.sqlite3") for name in outside), outside
    saved = sorted(saves.iterdir())
    assert len(saved) == len(paths)
    assert all(p.is_file() and not p.name.startswith(".") for p in saved)
    [job] = stored(tmp_path / "jobs.sqlite3")
    for target in job.targets:
        result = json.loads(target.result or "")
        path = urllib.parse.urlsplit(target.ref).path
        assert (saves / result["file"]).read_bytes() == path.encode()


#: ``python -m batch`` with Ctrl-C as on a terminal: a shell starts its
#: background jobs with SIGINT ignored, and the command keeps an ignored
#: SIGINT ignored (as it should), which would leave this test nothing to see.
INTERRUPTIBLE = (
    "import runpy, signal, sys;"
    " signal.signal(signal.SIGINT, signal.default_int_handler);"
    " sys.argv[0] = 'batch';"
    " runpy.run_module('batch', run_name='__main__', alter_sys=True)"
)


def test_ctrl_c_cancels_and_stores_what_was_in_flight(tmp_path: Path, upstream: Upstream) -> None:
    urls = [upstream.url(p) for p in ("/hold", "/ok/after-1", "/ok/after-2")]
    db = tmp_path / "jobs.sqlite3"
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            INTERRUPTIBLE,
            "fetch",
            str(url_file(tmp_path, *urls)),
            "--db",
            str(db),
        ],
        cwd=REPO,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert upstream.arrived.wait(WAIT)
        proc.send_signal(signal.SIGINT)
        said = proc.stderr.readline() if proc.stderr else ""
        upstream.release.set()
        out, rest = proc.communicate(timeout=WAIT)
    assert said.startswith("batch: interrupted: cancelled 1 job(s)"), said
    assert (proc.returncode, rest) == (130, ""), out
    [job] = stored(db)
    assert job.status == "cancelled"
    assert [t.status for t in job.targets] == ["done", "pending", "pending"]
    assert upstream.asked("/ok/after-1") == 0


def test_requeue_fetches_again_only_what_did_not_end_done(
    tmp_path: Path, upstream: Upstream
) -> None:
    db = tmp_path / "jobs.sqlite3"
    urls = [upstream.url(p) for p in ("/ok/a", "/missing", "/broken")]
    first = cli("fetch", url_file(tmp_path, *urls), "--in-order", "--db", db)
    assert first.returncode == 1, first  # partial
    [job] = stored(db)

    again = cli("requeue", job.id[:8], "--db", db)
    assert again.returncode == 1, again  # the same two fail again
    old, new = stored(db)
    assert old == job  # the job requeued is left as it was
    assert new.name == "again: urls.txt"
    assert [t.ref for t in new.targets] == urls[1:]
    assert (upstream.asked("/ok/a"), upstream.asked("/missing")) == (1, 2)

    done = cli("fetch", url_file(tmp_path, upstream.url("/ok/b")), "--db", db)
    assert done.returncode == 0, done
    nothing = cli("requeue", stored(db)[-1].id, "--db", db)
    assert nothing.returncode == 1
    assert nothing.stderr.endswith("has nothing to fetch again: every target is done\n")
    assert len(stored(db)) == 3


def test_wait_and_cancel_reach_a_job_another_process_runs(
    tmp_path: Path, upstream: Upstream
) -> None:
    """``wait`` follows a job run elsewhere to its end; ``cancel`` stops it
    there: the target in flight is stored, the rest are never asked for."""
    db = tmp_path / "jobs.sqlite3"
    urls = [upstream.url("/hold"), upstream.url("/ok/later")]
    with subprocess.Popen(
        command("fetch", url_file(tmp_path, *urls), "--in-order", "--db", db),
        cwd=REPO,
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as fetching:
        assert upstream.arrived.wait(WAIT)
        [job] = stored(db)
        still = cli("wait", job.id, "--db", db, "--timeout", "0.2")
        assert still.returncode == 1
        assert still.stderr.endswith("is still running after 0.2s\n"), still.stderr
        with subprocess.Popen(
            command("wait", job.id, "--db", db, "--json"),
            cwd=REPO,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as waiting:
            cancel = cli("cancel", job.id[:8], "--db", db, "--json")
            assert cancel.returncode == 0, cancel
            shown = json.loads(cancel.stdout)
            assert (shown["status"], shown["cancelled"]) == ("cancelled", True)
            upstream.release.set()
            out, err = waiting.communicate(timeout=WAIT)
        assert fetching.wait(timeout=WAIT) == 1  # its job ended cancelled
    assert (waiting.returncode, err) == (1, "")
    assert json.loads(out)["status"] == "cancelled"
    [job] = stored(db)
    assert [t.status for t in job.targets] == ["done", "pending"]
    assert upstream.asked("/ok/later") == 0

    again = cli("cancel", job.id, "--db", db)
    assert again.returncode == 1
    assert again.stdout.rstrip().endswith("had ended already: nothing cancelled")


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


# -- stopping a fetch: SIGTERM, a reader gone, Ctrl-C on a terminal -----------------------


def test_sigterm_cancels_stores_what_was_in_flight_and_leaves_no_part_file(
    tmp_path: Path, upstream: Upstream
) -> None:
    """SIGTERM is Ctrl-C's twin: the live jobs are cancelled, the target in
    flight is stored, no half-saved file is left, exit 143."""
    urls = [upstream.url(p) for p in ("/hold", "/ok/after-1", "/ok/after-2")]
    db, saves = tmp_path / "jobs.sqlite3", tmp_path / "saves"
    with subprocess.Popen(
        command("fetch", url_file(tmp_path, *urls), "--db", db, "--save", saves),
        cwd=REPO,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert upstream.arrived.wait(WAIT)
        proc.send_signal(signal.SIGTERM)
        said = proc.stderr.readline() if proc.stderr else ""
        upstream.release.set()
        out, rest = proc.communicate(timeout=WAIT)
    assert said.startswith("batch: terminated: cancelled 1 job(s); storing the 1"), said
    assert (proc.returncode, rest) == (143, ""), out
    [job] = stored(db)
    assert job.status == "cancelled"
    assert [t.status for t in job.targets] == ["done", "pending", "pending"]
    assert sorted(p.name for p in saves.iterdir()) == [
        json.loads(job.targets[0].result or "")["file"]
    ]


def test_a_reader_that_goes_away_stops_the_fetch_quietly(
    tmp_path: Path, upstream: Upstream
) -> None:
    """fetch --json | head -1: the fetch stops once head is gone, exits 0
    with nothing on stderr, and leaves no job running in the store."""
    urls = [upstream.url(f"/ok/{n}") for n in range(200)]
    db = tmp_path / "jobs.sqlite3"
    pipeline = " ".join(
        map(shlex.quote, command("fetch", url_file(tmp_path, *urls), "--db", db, "--json"))
    )
    done = subprocess.run(
        ["bash", "-c", f"{pipeline} 2>{tmp_path}/err | head -1; echo ${{PIPESTATUS[0]}}"],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    first, status = done.stdout.splitlines()
    assert json.loads(first)["status"] == "done"
    assert status == "0"
    err = (tmp_path / "err").read_text()  # the progress lines go there; no error does
    assert "batch:" not in err and "Traceback" not in err, err
    assert {job.status for job in stored(db)} <= {"done", "cancelled"}


def test_ctrl_c_on_a_terminal_leaves_the_board_and_the_message_on_screen(
    tmp_path: Path, upstream: Upstream
) -> None:
    """Under a real terminal (tmux), the live board redraws in place; after
    Ctrl-C the board's last state stays, and the line saying what was
    cancelled stays below it, not drawn over."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    urls = [upstream.url(p) for p in ("/hold", "/ok/after-1")]
    db = tmp_path / "jobs.sqlite3"
    env = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in environment().items()
        if k in ("PYTHONPATH", "NO_PROXY", "PATH", "HOME")
    )
    cmd = " ".join(map(shlex.quote, command("fetch", url_file(tmp_path, *urls), "--db", db)))
    socket = f"batch-test-{os.getpid()}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    subprocess.run(
        [
            *tmux,
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "30",
            f"env -i {env} TERM=xterm {cmd}; echo EXIT=$?; cat",
        ],
        cwd=REPO,
        check=True,
        timeout=WAIT,
    )
    try:

        def screen() -> str:
            return subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True
            ).stdout

        assert upstream.arrived.wait(WAIT)
        assert within(WAIT, lambda: "[" in screen()), screen()
        subprocess.run([*tmux, "send-keys", "C-c"], check=True)
        assert within(WAIT, lambda: "cancelled 1 job(s)" in screen()), screen()
        upstream.release.set()
        assert within(WAIT, lambda: "EXIT=" in screen()), screen()
        lines = [line.rstrip() for line in screen().splitlines() if line.strip()]
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    said = next(i for i, line in enumerate(lines) if "cancelled 1 job(s)" in line)
    assert lines[said].startswith("batch: interrupted: cancelled 1 job(s)"), lines
    assert "127.0.0.1" in lines[said - 1] and "cancelled" in lines[said - 1], lines
    assert lines[-1] == "EXIT=130", lines


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


def test_fetch_honours_the_crawl_delay_of_robots_txt(tmp_path: Path, upstream: Upstream) -> None:
    """A host whose robots.txt asks a Crawl-delay gets no more than one
    request per delay, whatever --per-host says; the others are not slowed."""
    urls = [upstream.url(f"/ok/{n}", host="localhost") for n in range(6)]
    source = url_file(tmp_path, *urls)
    done = cli("fetch", source, "--db", tmp_path / "jobs.sqlite3", "--per-host", "3")
    assert done.returncode == 0, done
    arrivals = sorted(upstream.arrivals)[1:]  # robots.txt first, then the pages
    assert len(arrivals) == 6
    assert arrivals[-1] - arrivals[0] >= 5 * CRAWL_DELAY * 0.99
