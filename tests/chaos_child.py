"""One runner in a process of its own, for ``tests/test_pg_chaos.py``.

Run as ``python tests/chaos_child.py '<config JSON>'`` (``PYTHONPATH`` the
project). It opens the store at ``url``, runs one ``batch.Runner`` on it
(``workers`` threads, ``takeover_after``, ``resume`` giving back every
caller) and submits its jobs at once: job ``k`` has ``sizes[k]`` targets
named ``<name>.<k>.<i>``. Its fetch waits ``delay`` seconds (on the
context) and returns ``{"ref": <the target's ref>, "by": <name>}``.

What it leaves for the test, in ``dir``:

- ``<name>.stored``: one line per target this runner stored, written by
  ``Hooks.target`` (called once the outcome is committed):
  ``<time.time()> ok|<error>``;
- ``<name>.report.json``: at ``finish``, what the test checks: the threads
  alive at the start and at the end, every exception that reached
  ``threading.excepthook``, every exception a public call raised (the
  prober's ``Runner.status``, ``Store.get_job`` and ``Runner.statistics``
  every ``probe_every`` seconds, and the final ``Runner.wait`` of each
  job), the statistics, and how many fetches were made and of how many
  distinct targets;
- its stderr (the test sends it to ``<name>.err``): the ``batch`` and
  ``store`` loggers, WARNING and up, each line with its time and thread.

On stdout, one JSON object a line: ``{"ready": runner_id, "pid", "ids"}``
once the jobs are submitted; ``{"stopping": t}`` (see ``arm``);
``{"finished": report}`` at the end. On stdin, one command a line:

- ``submit <size> <size> ...``: submit more jobs, of these sizes (their
  ``k`` going on from the last); says ``{"submitted": ids}``.
- ``arm``: the runner's next beat stops this process with SIGSTOP (every
  thread of it) right after the beat's statement that locks the rows of
  its jobs (the renewal, ``FOR UPDATE``) returns, so the process stops
  *inside* an open write transaction holding its jobs' rows. (A batch of
  outcomes cannot be stopped inside: on PostgreSQL it is one round trip
  with its COMMIT.) The signal goes to the writing thread itself
  (``pthread_kill``), which so stops at once. It wraps
  ``Ledger.beat_runner`` (to know which writes are beats) and
  ``Store._db.write`` (to reach the transaction): the one place this
  script leans on the store's internals.
- ``finish <timeout>``: stop probing, ``Runner.wait`` each job, note the
  threads and statistics, close the runner and the store, write the
  report, say it, exit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import batch
import store
from store.ledger import Ledger


def main() -> None:
    cfg = json.loads(sys.argv[1])
    name: str = cfg["name"]
    out = Path(cfg["dir"])
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="%(created).6f %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    say_lock = threading.Lock()

    def say(**fields: Any) -> None:
        with say_lock:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    # -- what the test checks: exceptions that end a thread, or reach a caller --
    problems_lock = threading.Lock()
    died: list[dict[str, Any]] = []
    api_errors: list[dict[str, Any]] = []

    def excepthook(args: threading.ExceptHookArgs) -> None:
        with problems_lock:
            died.append(
                {
                    "t": time.time(),
                    "thread": args.thread.name if args.thread is not None else None,
                    "error": repr(args.exc_value),
                    "traceback": "".join(
                        traceback.format_exception(
                            args.exc_type, args.exc_value, args.exc_traceback
                        )
                    ),
                }
            )
        sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)  # type: ignore[arg-type]
        sys.stderr.flush()

    threading.excepthook = excepthook

    def api_error(call: str, e: BaseException) -> None:
        with problems_lock:
            api_errors.append(
                {
                    "t": time.time(),
                    "call": call,
                    "error": repr(e),
                    "traceback": traceback.format_exc(),
                }
            )
        logging.getLogger("chaos").error("%s raised %r", call, e, exc_info=True)

    # -- the fetch and the stored-target log -----------------------------------------
    fetched_lock = threading.Lock()
    fetched: dict[str, int] = {}
    delay: float = cfg["delay"]

    def fetch(ctx: batch.Context, caller: batch.Caller, target: batch.Target) -> Any:
        with fetched_lock:
            fetched[target.ref] = fetched.get(target.ref, 0) + 1
        ctx.wait(delay)
        return {"ref": target.ref, "by": name}

    stored_log = (out / f"{name}.stored").open("a", encoding="utf-8", buffering=1)

    class Stored(batch.Hooks):
        def target(self, err: BaseException | None, seconds: float, nbytes: int) -> None:
            stored_log.write(f"{time.time():.6f} {'ok' if err is None else type(err).__name__}\n")

    # -- the store, wrapped for ``arm`` -----------------------------------------------
    db = store.open(cfg["url"])
    armed = threading.Event()
    fired = threading.Event()
    local = threading.local()
    real_beat = Ledger.of(db).beat_runner
    real_write = db._db.write

    def beat_runner(*args: Any, **kwargs: Any) -> Any:
        local.beating = True
        try:
            return real_beat(*args, **kwargs)
        finally:
            local.beating = False

    class StopAfterLocking:
        """The transaction, stopping this process once its first statement
        that locks rows (``FOR UPDATE``) has returned."""

        def __init__(self, tx: Any) -> None:
            self._tx, self._first = tx, True

        def _after(self, sql: str) -> None:
            if self._first and "FOR UPDATE" in sql:
                self._first = False
                t = time.time()
                logging.getLogger("chaos").warning(
                    "SIGSTOP inside a beat, after the statement that locks its jobs' rows"
                )
                sys.stderr.flush()
                say(stopping=t)
                # To this thread: it stops before it runs another instruction
                # (the whole process stops). os.kill would let another thread
                # take the signal, and this one run on a while, even commit.
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
                logging.getLogger("chaos").warning("continued after SIGSTOP")

        def execute(self, sql: str, args: Any = ()) -> Any:
            cur = self._tx.execute(sql, args)
            self._after(sql)
            return cur

        def __getattr__(self, name: str) -> Any:
            # Whatever else the engine's transaction offers, as it is.
            return getattr(self._tx, name)

    def write(fn: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(local, "beating", False) and armed.is_set() and not fired.is_set():
            fired.set()
            # Only the first try of the transaction stops (the engine may run it again).
            first = [True]

            def stopping(tx: Any) -> Any:
                if first[0]:
                    first[0] = False
                    return fn(StopAfterLocking(tx))
                return fn(tx)

            return real_write(stopping, *args, **kwargs)
        return real_write(fn, *args, **kwargs)

    Ledger.of(db).beat_runner = beat_runner  # type: ignore[method-assign]
    db._db.write = write  # type: ignore[method-assign]

    # -- the runner and its jobs ------------------------------------------------------
    config = batch.Config(
        workers=cfg["workers"],
        takeover_after=cfg["takeover_after"],
        retry_wait=0.05,
        resume=batch.Caller,
    )
    runner: batch.Runner[batch.Caller] = batch.Runner(db, fetch, config, Stored())
    caller = batch.Caller(name)
    ids = [
        runner.submit(caller, [f"{name}.{k}.{i}" for i in range(size)])
        for k, size in enumerate(cfg["sizes"])
    ]
    threads_at_start = sorted(t.name for t in threading.enumerate())

    # -- the prober: public calls during the fault ------------------------------------
    stop_probing = threading.Event()
    probes = [0]

    def probe() -> None:
        k = 0
        while not stop_probing.wait(cfg["probe_every"]):
            job_id = ids[k % len(ids)]
            k += 1
            for call, fn in (
                ("Runner.status", lambda j=job_id: runner.status(caller, j)),
                ("Store.get_job", lambda j=job_id: db.get_job(j, name)),
                ("Runner.statistics", runner.statistics),
            ):
                try:
                    fn()
                except Exception as e:
                    api_error(call, e)
            probes[0] += 1

    prober = threading.Thread(target=probe, name="chaos-prober", daemon=True)
    prober.start()
    say(ready=runner.id, pid=os.getpid(), ids=ids)

    # -- commands --------------------------------------------------------------------
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "arm":
            armed.set()
        elif cmd == "submit":
            more: list[str] = []
            try:
                for k, size in enumerate(args, len(ids)):
                    more.append(
                        runner.submit(caller, [f"{name}.{k}.{i}" for i in range(int(size))])
                    )
            except Exception as e:
                api_error("Runner.submit", e)
            ids.extend(more)
            say(submitted=more)
        elif cmd == "finish":
            break
    else:
        args = ["10"]  # stdin closed: the test is gone; finish all the same
    stop_probing.set()
    # A public call stuck in a fault shows here (prober_alive): not waited for long.
    prober.join(15)
    ended: dict[str, str] = {}
    deadline = time.monotonic() + float(args[0])
    for job_id in ids:
        try:
            left = max(0.0, deadline - time.monotonic())
            ended[job_id] = runner.wait(caller, job_id, left).status
        except Exception as e:
            ended[job_id] = repr(e)
            if not isinstance(e, TimeoutError):
                api_error("Runner.wait", e)
    threads_at_end = sorted(t.name for t in threading.enumerate())
    stats = dataclasses.asdict(runner.statistics())
    close_error = None
    try:
        runner.close(10)
        db.close()
    except Exception as e:
        close_error = repr(e)
        api_error("Runner.close", e)
    with fetched_lock:
        fetches, distinct = sum(fetched.values()), len(fetched)
    with problems_lock:
        report = {
            "name": name,
            "runner": runner.id,
            "pid": os.getpid(),
            "ids": ids,
            "ended": ended,
            "threads_at_start": threads_at_start,
            "threads_at_end": threads_at_end,
            "prober_alive": prober.is_alive(),
            "probes": probes[0],
            "statistics": stats,
            "died": list(died),
            "api_errors": list(api_errors),
            "close_error": close_error,
            "fetches": fetches,
            "distinct_fetched": distinct,
            "stopped": fired.is_set(),
        }
    stored_log.close()
    (out / f"{name}.report.json").write_text(json.dumps(report, indent=1))
    say(finished=report)


if __name__ == "__main__":
    main()
