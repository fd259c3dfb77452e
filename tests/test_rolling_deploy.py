"""Rolling deploys (SPEC §2g): runners of two releases on one store at once
while the newer steps the schema on, on SQLite and PostgreSQL.

- From this release to the next: the older runner stops cleanly with an
  error that says a newer schema is in place (``batch-runner work`` exits
  1 with it), its jobs go to the newer runners at once, and nothing is
  lost or stored twice. The next release is this code with one more
  schema step, in a process of its own.
- From the previous release (0.2.0, installed from its commit in a venv
  of its own): it has no such check, and after the step it cannot store
  what it fetches (on SQLite the step's triggers call a function its
  connections lack); the deploy stops it as a supervisor does, and its
  jobs are run by the newer runners: nothing is lost or stored twice.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import batch
import store
from store.engines import in_list
from tests import pgserver
from tests.helpers import ROOT, TIMEOUT, eventually, raw
from tests.work_helpers import Worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ALICE = batch.Caller("alice")
BOB = batch.Caller("bob")

#: The previous release: the last commit of 0.2.0 (CHANGELOG.md).
PREVIOUS = "96e204d"

#: The fetch every worker runs: takes a little while, on its context;
#: returns which release fetched what.
FETCH = textwrap.dedent(
    """
    import os

    def fetch(ctx, caller, target):
        ctx.wait(0.02)
        return {"ref": target.ref, "by": os.environ.get("RELEASE", "this")}
    """
)

#: This code with one schema step more, running ``batch-runner work``: the
#: next release, as far as the store can tell.
NEXT = textwrap.dedent(
    """
    import sys
    import batch.cli, store.engines, store.engines.postgres, store.engines.sqlite
    import store.ledger, store.schema
    from store.schema import Step

    probe = ("CREATE TABLE deploy_probe (x INTEGER)",)
    history = (*store.schema.HISTORY, Step(sqlite=probe, postgres=probe))
    for module in (store.schema, store.engines, store.engines.postgres,
                   store.engines.sqlite, store.ledger):
        if hasattr(module, "HISTORY"):
            module.HISTORY = history
        module.VERSION = len(history)
    sys.exit(batch.cli.main(sys.argv[1:], prog="batch-runner"))
    """
)

#: A runner of the previous release: submits ``argv[2]`` jobs of alice
#: (that release had no client), says ``ready``, runs them and others'
#: until its standard input ends, then closes.
OLD_RUNNER = textwrap.dedent(
    """
    import sys, batch, store
    from workfetch import fetch

    config = batch.Config(workers=2, max_live=4, takeover_after=1.0, resume=batch.Caller)
    with store.open(sys.argv[1]) as db, batch.Runner(db, fetch, config) as runner:
        for k in range(int(sys.argv[2])):
            runner.submit(batch.Caller("alice"), [f"old.{k}.{n}" for n in range(3)])
        print("ready", flush=True)
        sys.stdin.read()
    """
)


@pytest.fixture
def deploy_dir(tmp_path: Path) -> Path:
    (tmp_path / "workfetch.py").write_text(FETCH, encoding="utf-8")
    (tmp_path / "next_release.py").write_text(NEXT, encoding="utf-8")
    (tmp_path / "old_runner.py").write_text(OLD_RUNNER, encoding="utf-8")
    return tmp_path


def _stored_once(location: str, ids: list[str]) -> None:
    """Every job ends done, each target's result its own, none stored
    twice (read as any release would: in SQL, not through a library that
    may be older than the store)."""

    def ended() -> bool:
        where, args = in_list("id", ids)
        live = raw(location, f"SELECT count(*) FROM jobs WHERE {where} AND status != 'done'", args)
        return live[0][0] == 0

    assert eventually(ended, timeout=TIMEOUT * 6), raw(
        location, "SELECT status, count(*) FROM jobs GROUP BY status"
    )
    where, args = in_list("job_id", ids)
    rows = raw(location, f"SELECT ref, status, result FROM targets WHERE {where}", args)
    assert len(rows) == 3 * len(ids)
    assert all(s == "done" and json.loads(r)["ref"] == ref for ref, s, r in rows)
    pos = (
        "data::json->>'pos'"
        if location.startswith("postgresql://")
        else "json_extract(data, '$.pos')"
    )
    per_target = raw(
        location,
        f"SELECT id, {pos}, count(*) FROM events WHERE kind = 'target.stored' GROUP BY id, {pos}",
    )
    assert all(n == 1 for _, _, n in per_target), per_target


# -- from this release to the next ---------------------------------------------------


def test_a_runner_of_this_release_stops_cleanly_when_the_next_steps_the_schema(
    location: str, deploy_dir: Path
) -> None:
    with store.open(location) as db, batch.Client(db) as client:
        ids = client.submit_many(ALICE, [[f"a.{k}.{n}" for n in range(3)] for k in range(40)])
        ids += client.submit_many(BOB, [[f"b.{k}.{n}" for n in range(3)] for k in range(10)])
        old = Worker(deploy_dir, location, "old", "--takeover-after", "60")
        try:
            assert old.said(r"job \w+ of alice ended done")
            new = Worker(
                deploy_dir, location, "new", "--takeover-after", "60", program="next_release.py"
            )
            try:
                assert old.proc.wait(TIMEOUT) == 1, old.log()
                assert "newer than this library's" in old.log()
                assert "upgrade batch-store" in old.log().splitlines()[-1]
                # So does this release's client, at its next beat.
                assert eventually(lambda: client.closed_reason is not None)
                with pytest.raises(batch.RunnerClosed, match="newer than this library's"):
                    client.submit(ALICE, ["late"])
                # The old runner's jobs went to the new one at once (leases
                # of a minute would keep them otherwise).
                _stored_once(location, ids)
                new.proc.send_signal(signal.SIGTERM)
                assert new.proc.wait(TIMEOUT) == 0, new.log()
            finally:
                new.stop()
        finally:
            old.stop()


# -- from the previous release --------------------------------------------------------


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the previous release installed from its commit (its
    dependencies those of this environment); its Python."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the previous release comes from this repository's history: no git here")
    root = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone: {archive.stderr.decode()[:200]}")
    source = root / "src"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(source, filter="data")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    (site,) = Path(venv / "lib").glob("python3*/site-packages")
    # Its dependencies (psycopg, setuptools to build it) are this environment's.
    ours = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("\n".join(ours) + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--ignore-installed", str(source)],
        check=True, cwd=root,
    )  # fmt: skip
    version = subprocess.run(
        [str(python), "-c", "import store; print(store.__version__, store.__file__)"],
        capture_output=True, text=True, check=True, cwd=root,
    ).stdout.split()  # fmt: skip
    assert version[0] == "0.2.0" and str(venv) in version[1], version
    return python


@pytest.fixture(params=["sqlite", "postgres"])
def empty_location(
    request: pytest.FixtureRequest, tmp_path: Path, pg_server: pgserver.Server | None
) -> Iterator[str]:
    """Where a store of the previous release is made: a new file, or an
    empty database (0.2.0 held a session lock of the whole store on
    PostgreSQL: it never ran behind a transaction pooler)."""
    if request.param == "sqlite":
        yield str(tmp_path / "jobs.sqlite3")
        return
    if pg_server is None:
        pytest.skip("no PostgreSQL server here")
    with pg_server.database(f"deploy_{os.getpid()}") as url:
        yield url


def test_a_deploy_from_the_previous_release_loses_nothing(
    empty_location: str, deploy_dir: Path, previous_release: Path
) -> None:
    location = empty_location
    with (deploy_dir / "old.err").open("wb") as err:
        old = subprocess.Popen(
            [str(previous_release), "old_runner.py", location, "30"],
            cwd=deploy_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env={**os.environ, "RELEASE": "0.2.0", "PYTHONPATH": str(deploy_dir)},
        )
    try:
        assert old.stdout is not None and old.stdout.readline().strip() == b"ready"
        with store.open(location) as db:  # this release: steps the schema on
            old_ids = [j.id for j in db.list_jobs(owner="alice")]
            assert len(old_ids) == 30
            with batch.Client(db) as client:
                new_ids = client.submit_many(
                    BOB, [[f"n.{k}.{n}" for n in range(3)] for k in range(20)]
                )
            new = Worker(deploy_dir, location, "new", "--takeover-after", "1")
            try:
                # The deploy stops the old runner as a supervisor does: its
                # standard input ends (it closes), and past a timeout a kill.
                assert old.stdin is not None
                old.stdin.close()
                try:
                    old.wait(5)
                except subprocess.TimeoutExpired:
                    old.send_signal(signal.SIGKILL)
                    old.wait(TIMEOUT)
                _stored_once(location, old_ids + new_ids)
                new.proc.send_signal(signal.SIGTERM)
                assert new.proc.wait(TIMEOUT) == 0, new.log()
            finally:
                new.stop()
    finally:
        if old.poll() is None:
            old.kill()
        old.wait(TIMEOUT)
        assert old.stdout is not None
        old.stdout.close()
