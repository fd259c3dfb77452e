"""The docs stay true to the code.

- docs/api.md is exactly what ``python docs/api.py`` writes now;
- every runnable example in the how-to pages runs as written after the
  install its page names: a fenced ``python`` block whose first line is
  ``# runnable``, each a program of its own that can import only what that
  install brings, in a temporary directory of its own, under a timeout;
- every relative link between the pages of docs/ leads to a file there, and
  an anchor to a heading of that file;
- the module map in index.md names every module of both packages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import installs
from tests.helpers import ROOT

DOCS = Path(__file__).resolve().parent.parent / "docs"

#: The first line of a ``python`` block that the tests run.
RUNNABLE = "# runnable"

#: Seconds one example may take; each is meant to finish well within one.
EXAMPLE_TIMEOUT = 30

FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def howtos() -> list[Path]:
    return sorted(DOCS.glob("howto-*.md"))


def fenced(page: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Each fenced block of a page: the line its body starts on (1-based),
    its language, and its lines."""
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        start = FENCE.match(lines[i])
        if start is None:
            i += 1
            continue
        fence, lang = start.group(1), start.group(2)
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        yield i - len(body) + 1, lang, body
        i += 1


def prose(page: Path) -> Iterator[tuple[int, str]]:
    """The lines of a page outside fenced blocks, numbered from 1."""
    inside = None
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        start = FENCE.match(line)
        if inside is None and start is not None:
            inside = start.group(1)
        elif inside is not None and line.startswith(inside):
            inside = None
        elif inside is None:
            yield n, line


def examples() -> list[tuple[Path, int, str]]:
    found = []
    for page in howtos():
        for line, lang, body in fenced(page):
            if lang == "python" and body and body[0].strip() == RUNNABLE:
                found.append((page, line, "\n".join(body) + "\n"))
    return found


EXAMPLES = examples()


def load_script(name: str) -> types.ModuleType:
    """The script ``docs/<name>.py``, loaded as a module."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_current() -> None:
    api = load_script("api")
    written = (DOCS / "api.md").read_text(encoding="utf-8")
    assert written == api.render(), "docs/api.md is out of date: run python docs/api.py"


@pytest.mark.timeout(60)
def test_the_walk_of_one_outcome_is_the_one_architecture_md_shows() -> None:
    """The modules one outcome goes through, as ``docs/walk.py`` traces them
    on a real runner, are the ones the page says."""
    walk = load_script("walk")
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    shown = page.split("<!-- walk -->\n", 1)[1].split("\n<!-- /walk -->", 1)[0]
    assert shown == walk.render(walk.calls()), "architecture.md's walk is out of date"


def test_every_howto_has_runnable_examples() -> None:
    """A marker mistyped would skip a page's examples silently."""
    assert howtos(), "no how-to pages found"
    with_examples = {page for page, _, _ in EXAMPLES}
    missing = [page.name for page in howtos() if page not in with_examples]
    assert not missing, f"pages without a '{RUNNABLE}' block: {missing}"


@pytest.mark.timeout(EXAMPLE_TIMEOUT + 10)
@pytest.mark.parametrize(
    ("page", "line", "code"),
    EXAMPLES,
    ids=[f"{page.name}:{line}" for page, line, _ in EXAMPLES],
)
def test_example_runs(page: Path, line: int, code: str, tmp_path: Path) -> None:
    """Run the block as a program of its own, in a directory of its own,
    able to import only what the page says to install (``tests.installs``):
    an example that needs a package its page does not name fails. Its line
    numbers in a traceback are those of the page."""
    allowed = tmp_path / "allowed.json"
    named = installs.named_installs(page.read_text(encoding="utf-8"))
    allowed.write_text(json.dumps(sorted(installs.allowed_files(named))))
    ran = subprocess.run(
        [sys.executable, "-m", "tests.installs", str(allowed), str(page), str(line)],
        input=code,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=EXAMPLE_TIMEOUT,
        check=False,
    )
    assert ran.returncode == 0, f"{page.name}:{line} (after pip install {named}):\n{ran.stderr}"


def slug(heading: str) -> str:
    """The anchor a heading gets on GitHub: lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(page):
        if (m := HEADING.match(line)) is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links() -> list[tuple[Path, int, str]]:
    found = []
    for page in pages():
        for n, line in prose(page):
            for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m.group(1)
                if not re.match(r"[a-z][a-z0-9+.-]*:", target):
                    found.append((page, n, target))
    return found


def test_links_between_pages_lead_somewhere() -> None:
    broken = []
    for page, n, target in links():
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{n}: {target}"
        if not dest.is_file():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_link_to_each_other() -> None:
    """The index reaches every page; the link test is not vacuous."""
    linked = {
        (page.parent / target.partition("#")[0]).resolve()
        for page, _, target in links()
        if page.name == "index.md" and target.partition("#")[0]
    }
    unlinked = [p.name for p in pages() if p.name != "index.md" and p.resolve() not in linked]
    assert not unlinked, f"pages index.md does not link to: {unlinked}"


def test_the_module_map_names_every_module_and_no_other() -> None:
    """index.md's table of modules is checked against the packages: a
    module added, renamed or removed fails here until the map says so."""
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    section = text.split("\n## The modules\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`((?:batch|store)/\w+\.py)`", section))
    actual = {
        f"{pkg}/{p.name}" for pkg in ("batch", "store") for p in (DOCS.parent / pkg).glob("*.py")
    }
    assert listed == actual, (
        f"missing from the map: {sorted(actual - listed)}; gone: {sorted(listed - actual)}"
    )
