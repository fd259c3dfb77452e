"""``batch-runner work``'s settings and errors (SPEC §2g, §3): the fetch
named as ``module:function``, flags over a TOML file, a clear error and
exit 2 for what cannot be used; a drain cut short by its grace, and a
second signal that stops at once, each leaving the jobs to other runners."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

import batch
import batch.cli
import store
from batch.cli import work
from tests.helpers import TIMEOUT, eventually
from tests.work_helpers import workers

pytestmark = pytest.mark.timeout(60)

ALICE = batch.Caller("alice")


def _settings(tmp_path: Path, *argv: str) -> work.Settings:
    args = batch.cli.build_parser().parse_args(["work", "--db", str(tmp_path / "s.db"), *argv])
    return work.settings(args)


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = batch.cli.main(["work", *argv])
    return status, capsys.readouterr().err


def test_the_fetch_is_required(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, err = _fails(capsys, "--db", str(tmp_path / "s.db"))
    assert status == 2 and "work needs --fetch MODULE:FUNCTION" in err


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_such_module_here:fetch", "no module 'no_such_module_here'"),
        ("os:no_such_function", "os has no 'no_such_function'"),
        ("os:sep", "sep is not callable"),
        ("fetch_without_colon", "must be MODULE:FUNCTION"),
    ],
)
def test_a_fetch_that_names_nothing_usable_is_bad_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: str, says: str
) -> None:
    status, err = _fails(capsys, "--db", str(tmp_path / "s.db"), "--fetch", spec)
    assert status == 2 and says in err, err
    assert len(err.splitlines()) == 1


def test_a_fetch_module_that_raises_on_import_fails_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_jobs.py").write_text("raise RuntimeError('no config here')\n")
    monkeypatch.chdir(tmp_path)
    status, err = _fails(capsys, "--db", str(tmp_path / "s.db"), "--fetch", "broken_jobs:fetch")
    assert status == 1
    assert "importing broken_jobs raised RuntimeError: no config here" in err


def test_flags_win_over_the_file_and_the_file_over_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "work.toml"
    config.write_text(
        textwrap.dedent(
            """
            fetch = "os:getcwd"
            workers = 3
            timeout = 30
            max-bytes = "1MiB"
            grace = 7
            upstream = "batch.web:host_of"

            [limits."*"]
            rate = 20.0
            [limits."api.example.com"]
            concurrency = 2
            adaptive = false

            [keep]
            done = 3600
            """
        )
    )
    given = _settings(tmp_path, "--config", str(config), "--workers", "5")
    assert (given.fetch, given.grace) == ("os:getcwd", 7.0)
    made = given.config()
    assert (made.workers, made.timeout, made.max_bytes, made.max_live) == (5, 30, 1 << 20, 10)
    assert made.limits == {
        "*": batch.Limit(rate=20.0),
        "api.example.com": batch.Limit(concurrency=2, adaptive=False),
    }
    assert made.keep == {"done": 3600}
    assert made.resume is batch.Caller
    assert made.upstream is batch.web.host_of


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("fetch = 'os:getcwd'\nworkerz = 2\n", "unknown setting(s): workerz"),
        ("fetch = 'os:getcwd'\ndb = 'postgresql://u:secret@h/db'\n", "unknown setting(s): db"),
        ("fetch = = 1\n", "not TOML"),
        ("fetch = 'os:getcwd'\nworkers = 'many'\n", "Config.workers must be an int"),
        ("fetch = 'os:getcwd'\ngrace = -1\n", "grace must be seconds >= 0"),
        ("fetch = 'os:getcwd'\nmetrics-port = 70000\n", "metrics-port must be a port"),
        ("fetch = 'os:getcwd'\n[limits.x]\nrate = 'fast'\n", "Limit.rate"),
    ],
)
def test_a_config_file_it_cannot_use_is_bad_usage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, says: str
) -> None:
    config = tmp_path / "work.toml"
    config.write_text(text)
    status, err = _fails(capsys, "--db", str(tmp_path / "s.db"), "--config", str(config))
    assert status == 2 and says in err, err
    assert "secret" not in err


_HANGS = textwrap.dedent(
    """
    import threading

    def fetch(ctx, caller, target):
        threading.Event().wait()  # ignores its context
    """
)


@pytest.fixture
def hangs(tmp_path: Path) -> Path:
    (tmp_path / "workfetch.py").write_text(_HANGS)
    return tmp_path


def _taken_over(db: store.Store, location: str, job_id: str) -> None:
    """Another runner takes ``job_id`` at once (leases of a minute would
    keep it otherwise) and ends it."""
    with (
        store.open(location) as other_db,
        batch.Runner(
            other_db,
            lambda ctx, caller, t: "again",
            batch.Config(resume=batch.Caller, takeover_after=60),
        ) as other,
    ):
        assert other.wait(ALICE, job_id, TIMEOUT).status == "done"


@pytest.mark.parametrize(
    ("grace", "signals", "status", "says"),
    [
        # The drain past its grace: exit 0, the job released.
        ("0.3", 1, 0, "workers still in a fetch after 0.8s: their jobs are released"),
        # A second signal: at once.
        ("60", 2, 143, "taking nothing new"),
    ],
)
def test_a_worker_stopped_over_a_stuck_fetch_leaves_its_job_to_another(
    db: store.Store, location: str, hangs: Path, grace: str, signals: int, status: int, says: str
) -> None:
    with (
        batch.Client(db) as client,
        workers(hangs, location, 1, "--takeover-after", "60", "--grace", grace) as (w,),
    ):
        job_id = client.submit(ALICE, ["a"])
        _started(client, job_id)
        w.proc.send_signal(signal.SIGTERM)
        assert w.said("taking nothing new")
        if signals == 2:
            w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(TIMEOUT) == status, w.log()
        assert says in w.log()
        _taken_over(db, location, job_id)


def _started(client: batch.Client[batch.Caller], job_id: str) -> None:
    """Wait until a worker has the job running."""
    assert eventually(lambda: client.status(ALICE, job_id).status == "running")
