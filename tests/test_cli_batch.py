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
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from tests.cli_helpers import (
    CRAWL_DELAY,
    REPO,
    SUMMARY,
    WAIT,
    Upstream,
    cli,
    command,
    environment,
    outcome,
    stored,
    upstream_fixture,  # noqa: F401 (the fixture ``upstream``)
    url_file,
)
from tests.helpers import within

pytestmark = pytest.mark.timeout(60)

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
