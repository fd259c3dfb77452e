"""The deployment files docs/howto-deploy.md ships stay usable: the
systemd unit passes ``systemd-analyze verify``; the Dockerfile is linted
(and built where a Docker daemon answers); the ``batch-runner work``
command lines in both are ones the command accepts."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import batch.cli

pytestmark = pytest.mark.timeout(120)

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"
UNIT = DEPLOY / "batch-worker@.service"
DOCKERFILE = DEPLOY / "Dockerfile"

#: Dockerfile instructions (the reference's list).
INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER",
}  # fmt: skip


def _accepted(argv: list[str]) -> batch.cli.work.Settings:
    """What ``batch-runner work`` makes of ``argv`` (its flags, the fetch
    left unimported; the ``--config`` file, which is the application's,
    left out): exits 2 through argparse for a flag it lacks."""
    if "--config" in argv:
        at = argv.index("--config")
        argv = argv[:at] + argv[at + 2 :]
    args = batch.cli.build_parser().parse_args(["work", *argv])
    return batch.cli.work.settings(args)


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments
    dropped: (INSTRUCTION, its arguments)."""
    joined, parts = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not parts and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            parts += line.rstrip()[:-1] + " "
            continue
        joined.append(parts + line)
        parts = ""
    assert not parts, "the Dockerfile ends inside a continued line"
    found = []
    for line in joined:
        word, _, rest = line.strip().partition(" ")
        found.append((word.upper(), rest.strip()))
    return found


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze here")
    command = shutil.which("batch-runner") or str(Path(sys.executable).parent / "batch-runner")
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/srv/jobs/venv/bin/batch-runner", command))
    done = subprocess.run(
        [analyze, "verify", str(tmp_path / "batch-worker@1.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done


def test_the_units_command_line_is_one_work_accepts() -> None:
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", UNIT.read_text(), re.MULTILINE)
    argv = shlex.split(exec_start.replace("%i", "1"))
    assert argv[:2] == ["/srv/jobs/venv/bin/batch-runner", "work"]
    given = _accepted(argv[2:])
    assert (given.fetch, given.metrics_port, given.grace) == ("myapp.jobs:fetch", 911, 20.0)
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", UNIT.read_text(), re.MULTILINE)[1])  # type: ignore[index]
    assert stop > given.grace


def test_the_dockerfile_lints() -> None:
    found = _instructions()
    assert found[0][0] == "FROM" and found[0][1].startswith("python:3.11")
    assert {word for word, _ in found} <= INSTRUCTIONS
    args = dict(found)
    # The image's command is the worker, draining on the platform's SIGTERM.
    assert json.loads(args["ENTRYPOINT"]) == ["batch-runner", "work"]
    given = _accepted(json.loads(args["CMD"]))
    assert (given.metrics_host, given.metrics_port) == ("0.0.0.0", 9100)
    assert given.grace < 30  # under the platform's stop timeout
    assert args["STOPSIGNAL"] == "SIGTERM"
    assert args["EXPOSE"] == str(given.metrics_port)
    # The health check asks /healthz on that port.
    check = args["HEALTHCHECK"]
    assert f"127.0.0.1:{given.metrics_port}/healthz" in check
    json.loads(check.split("CMD", 1)[1])
    # The library with the extras a worker uses, and never root.
    assert any("batch-store[postgres,metrics]" in rest for word, rest in found if word == "RUN")
    assert args["USER"] not in ("", "root", "0")
    # No store (a password) baked into the image.
    assert 'BATCH_DB=""' in args["ENV"]


def test_the_dockerfile_builds(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if (
        docker is None
        or subprocess.run([docker, "info"], capture_output=True, check=False).returncode
    ):
        pytest.skip("no Docker daemon here: the Dockerfile is linted only")
    app = tmp_path / "app"
    (app / "myapp").mkdir(parents=True)
    (app / "myapp" / "__init__.py").write_text("")
    (app / "myapp" / "jobs.py").write_text("def fetch(ctx, caller, target):\n    return None\n")
    (app / "pyproject.toml").write_text('[project]\nname = "myapp"\nversion = "0"\n')
    (app / "work.toml").write_text("workers = 2\n")
    shutil.copy(DOCKERFILE, app / "Dockerfile")
    done = subprocess.run(
        [docker, "build", "-q", str(app)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
