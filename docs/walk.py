"""The walk of one outcome through the runner's modules, for
``docs/architecture.md``: ``python docs/walk.py`` prints it.

One job of one target, one worker, a store in a temporary directory: the
calls the worker thread makes into ``batch``'s modules from the moment its
fetch returns to its next pick, then the rooms (modules) they pass through,
leaving out the helpers any room calls (``hooks``, ``clock``, ``locks``,
``trouble``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import tempfile
from types import FrameType
from typing import Any

import batch
import store

#: Modules every room calls: left out of the rooms.
HELPERS = frozenset({"hooks", "clock", "locks", "trouble"})


def calls() -> list[tuple[str, str]]:
    """The (module, function) calls of the worker thread into ``batch``, from
    the fetch's return to the next pick."""
    seen: list[tuple[str, str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and f"{os.sep}batch{os.sep}" in frame.f_code.co_filename:
            seen.append((os.path.basename(frame.f_code.co_filename)[:-3], frame.f_code.co_name))

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        sys.setprofile(profile)  # this worker thread, from here on
        return "ok"

    with (
        tempfile.TemporaryDirectory() as d,
        store.open(os.path.join(d, "s.sqlite3")) as db,
        batch.Runner(db, fetch, batch.Config(workers=1)) as runner,
    ):
        me = batch.Caller("me")
        runner.wait(me, runner.submit(me, ["a"]), timeout=30)
    walk: list[tuple[str, str]] = []
    for module, function in seen:
        walk.append((module, function))
        if (module, function) == ("worker", "pick"):
            break
    return walk


@functools.cache
def _reads(module: str) -> frozenset[str]:
    """The names of the properties of the classes of ``batch.<module>``."""
    classes = inspect.getmembers(importlib.import_module(f"batch.{module}"), inspect.isclass)
    return frozenset(
        name
        for _, cls in classes
        for name, value in vars(cls).items()
        if isinstance(value, property)
    )


def rooms(walk: list[tuple[str, str]]) -> list[str]:
    """The modules ``walk`` passes through in order to do something."""
    out: list[str] = []
    for module, function in walk:
        if module in HELPERS or function.startswith("__") or function in _reads(module):
            continue
        if not out or out[-1] != module:
            out.append(module)
    return out


def render(walk: list[tuple[str, str]]) -> str:
    """The rooms of ``walk`` as ``docs/architecture.md`` shows them."""
    path = rooms(walk)
    return (
        f"{' → '.join(path)} ({len(path) - 1} crossings,"
        f" `state` entered {path.count('state')} times)"
    )


if __name__ == "__main__":
    walk = calls()
    print(" -> ".join(f"{module}.{function}" for module, function in walk))
    print(f"{len(walk)} calls; rooms: {render(walk)}")
