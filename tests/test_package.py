"""The package as a person installs it: ``pip install .`` into a new
virtual environment, then the commands it installs."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import batch
import store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent


def test_pip_install_then_the_commands_run(tmp_path: Path) -> None:
    """A wheel built from the source installs batch-runner and batch-store;
    the demo runs to its end, and both say their version."""
    venv.create(tmp_path / "env", with_pip=True)
    bin_ = tmp_path / "env" / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run(
        [bin_ / "pip", "install", "-q", str(REPO)], check=True, env=env, timeout=540, cwd=tmp_path
    )
    for command in ("batch-runner", "batch-store"):
        done = subprocess.run(
            [bin_ / command, "--version"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, f"batch-store {store.__version__}\n"), done
    demo = subprocess.run(
        [bin_ / "batch-runner", "demo", "--db", str(tmp_path / "demo.sqlite3")],
        capture_output=True,
        text=True,
        env={**env, "NO_PROXY": "*"},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert (demo.returncode, demo.stderr) == (0, ""), demo
    assert demo.stdout.splitlines()[-1] == f"store: {tmp_path / 'demo.sqlite3'}"
    # The installed library is the one the tests run on, and it is typed.
    found = subprocess.run(
        [
            bin_ / "python",
            "-c",
            "import batch, store, pathlib; print(batch.__version__);"
            " print(pathlib.Path(store.__file__).with_name('py.typed').exists())",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    ).stdout.split()
    assert found == [batch.__version__, "True"]


def test_the_version_is_one_for_both_packages() -> None:
    assert batch.__version__ == store.__version__
    done = subprocess.run(
        [sys.executable, "-m", "batch", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.stdout == f"batch-store {store.__version__}\n"
