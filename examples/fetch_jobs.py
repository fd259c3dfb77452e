"""Run a few jobs through a real Runner and print how each ended.

The upstream here is a small in-process library of documents: some fetches
find their document, one is missing (a TargetError with a hint), and one
upstream is busy twice before it answers (RetryLater). Two callers submit
jobs; the workers take the jobs in turn, one target of each at a time.

    python examples/fetch_jobs.py [--db PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from collections import Counter

import batch
import store

DOCUMENTS = {f"doc-{i}": f"text of document {i}" for i in range(1, 9)}


class Upstream:
    """Serves DOCUMENTS; says "busy" the first two times a ``busy-`` ref is asked for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: Counter[str] = Counter()

    def fetch(self, ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> object:
        ref = target.ref.removeprefix("busy-")
        with self._lock:
            self._asked[target.ref] += 1
            asked = self._asked[target.ref]
        if target.ref.startswith("busy-") and asked <= 2:
            raise batch.RetryLater(f"{ref}: upstream busy")
        if ref not in DOCUMENTS:
            raise batch.TargetError(f"no document {ref!r}", hint="ids run from doc-1 to doc-8")
        return {"ref": ref, "words": len(DOCUMENTS[ref].split()), "asked": asked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="store file (default: a new temporary file)")
    args = parser.parse_args()
    path = args.db or os.path.join(tempfile.mkdtemp(prefix="batch-example-"), "jobs.sqlite3")

    alice, bob = batch.Caller("alice"), batch.Caller("bob")
    jobs = [
        (alice, ["doc-1", "doc-2", "doc-3"]),
        (bob, ["doc-4", "busy-doc-5", "doc-6"]),
        (alice, ["doc-7", "doc-404"]),
        (bob, ["doc-99"]),
    ]
    config = batch.Config(workers=2, retry_wait=0.05, retry_for=5.0)
    with store.open(path) as db, batch.Runner(db, Upstream().fetch, config) as runner:
        submitted = [(caller, runner.submit(caller, refs)) for caller, refs in jobs]
        print(f"{'job':<34} {'caller':<6} {'status':<8} targets")
        for caller, job_id in submitted:
            job = runner.wait(caller, job_id, timeout=30)
            outcomes = " ".join(f"{t.target.ref}:{t.status}" for t in job.targets)
            print(f"{job.id:<34} {caller.id:<6} {job.status:<8} {outcomes}")
            for t in job.targets:
                if t.error:
                    print(f"{'':<34} {t.target.ref}: {t.error} (hint: {t.hint})")
    print(f"store: {path}")


if __name__ == "__main__":
    main()
