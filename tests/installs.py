"""What a how-to page says to install, and a process that has only that.

A page names its install as a user would type it: ``pip install
'batch-store[otel]' opentelemetry-sdk``, in a ``sh`` block or inline. The
distributions that install brings (the named ones and everything they
require, extras included) are found in this environment's metadata; the
files they hold are what a process of the page's examples may import from
site-packages. Run as ``python -m tests.installs ALLOWED PAGE LINE`` (the
example's code on standard input), it runs the example with an import hook
that refuses every other module of site-packages: an example that needs a
package its page does not name fails here as it would for a user.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import shlex
import sys
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["allowed_files", "named_installs"]

#: The project itself: every page's examples have it.
PROJECT = "batch-store"

#: ``pip install ...`` in a code span of the prose (which may wrap), or as
#: a line of a block (up to a comment).
INLINE = re.compile(r"`pip\s+install\s+([^`]+)`")
LINE = re.compile(r"^\s*pip install ([^#\n]+)", re.MULTILINE)


def named_installs(page: str) -> list[str]:
    """The requirements every ``pip install`` of the page names (flags
    left out), and the project itself."""
    named = [PROJECT]
    for command in INLINE.findall(page) + LINE.findall(page):
        named += [arg for arg in shlex.split(command) if not arg.startswith("-")]
    return named


def allowed_files(requirements: Iterable[str]) -> set[str]:
    """The files (as their distributions' RECORDs list them, relative to
    site-packages) of the distributions ``requirements`` install here."""
    extras: dict[str, set[str]] = {}
    todo = [Requirement(text) for text in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        wanted = set(req.extras)
        if name in extras and wanted <= extras[name]:
            continue
        extras.setdefault(name, set()).update(wanted)
        dist = importlib.metadata.distribution(name)
        for text in dist.requires or []:
            dep = Requirement(text)
            if dep.marker is None or any(
                dep.marker.evaluate({"extra": extra}) for extra in {"", *extras[name]}
            ):
                todo.append(dep)
    return {
        str(path) for name in extras for path in importlib.metadata.distribution(name).files or ()
    }


class OnlyNamed(importlib.abc.MetaPathFinder):
    """Refuses a module of site-packages that no allowed distribution holds."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        paths = sysconfig.get_paths()
        self.roots = sorted({Path(paths["purelib"]), Path(paths["platlib"])})

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        origin = Path(spec.origin)
        for root in self.roots:
            if origin.is_relative_to(root):
                if origin.relative_to(root).as_posix() not in self.allowed:
                    raise ModuleNotFoundError(
                        f"No module named {fullname!r}: the page's install does not bring it",
                        name=fullname,
                    )
                break
        return None  # found as usual


def main(argv: list[str]) -> None:
    allowed_path, page, line = argv
    allowed = set(json.loads(Path(allowed_path).read_text()))
    code = sys.stdin.read()
    sys.meta_path.insert(0, OnlyNamed(allowed))
    module = ModuleType("__main__")
    module.__file__ = page
    sys.modules["__main__"] = module
    exec(compile("\n" * (int(line) - 1) + code, page, "exec"), module.__dict__)


if __name__ == "__main__":
    main(sys.argv[1:])
