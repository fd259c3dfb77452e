"""``batch-runner work``: the worker process a deployment runs, one or many
per store, under systemd or a container platform.

It runs the jobs of the store (those a ``batch.Client`` submits, and any a
runner that is gone left) with the fetch it is given, each caller resumed
as ``batch.Caller`` unless ``--resume`` says otherwise. The settings come
from flags, over a TOML file (``--config``), over the defaults. SIGTERM or
SIGINT drains it: nothing new starts, the fetches in flight have
``--grace`` seconds and are stored, every other job is left to the other
runners at once, and it exits 0; a second signal stops it at once. It
logs one line per event to stderr. ``--metrics-port`` serves ``/metrics``
(Prometheus) and ``/healthz``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import logging
import os
import sys
import threading
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import store
from store.console import BadInput, Failure, Output, bytes_size, stopping

from .. import timeouts
from ..hooks import Hooks
from ..model import Config, Limit
from ..runner import Runner
from ..states import JobStatus

__all__ = ["FORMAT", "Settings", "add_options", "work"]

log = logging.getLogger("batch.work")

#: The log's line: the ``logging`` module's fields, one event a line.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Seconds a worker process drains on a signal unless told (under the 30 s
#: a container platform gives before it kills).
GRACE = 20.0

#: Seconds between looks at whether a signal came or the runner stopped.
POLL = 0.1

#: Seconds a stop "at once" (a second signal, a failure) has to release
#: the runner's jobs to the others.
STOP_AT_ONCE = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
    """What ``work`` runs with: the flags over the file over the defaults."""

    fetch: str
    db: str
    grace: float = GRACE
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    log_level: str = "info"
    resume: str = "batch:Caller"
    upstream: str | None = None
    # The runner's own (batch.Config), None where it keeps its default.
    workers: int | None = None
    max_live: int | None = None
    timeout: float | None = None
    retry_wait: float | None = None
    retry_for: float | None = None
    max_bytes: int | None = None
    max_targets: int | None = None
    takeover_after: float | None = None
    fair: str | None = None
    limits: Mapping[str, Mapping[str, Any]] | None = None
    keep: Mapping[str, float] | None = None

    def config(self) -> Config:
        """The runner's ``Config``; ``BadInput`` for a value it refuses."""
        given = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(Config)
            if f.name in _RUNNER and getattr(self, f.name) is not None
        }
        if given.get("max_live") == 0:
            raise BadInput("max-live must be at least 1: a worker that holds no job runs none")
        workers = given.get("workers", Config().workers)
        # Jobs spread over the worker processes: each holds a few more than
        # it has workers (so that a job waiting on a retry leaves none
        # idle); the rest wait in the store for whichever has room.
        given.setdefault("max_live", 2 * workers)
        try:
            return Config(
                **given,
                resume=_load(self.resume, "resume"),
                upstream=None if self.upstream is None else _load(self.upstream, "upstream"),
                limits=None if self.limits is None else _limits(self.limits),
            )
        except (TypeError, ValueError) as e:
            raise BadInput(str(e)) from None


#: The settings that are ``Config``'s, by the same name.
_RUNNER = frozenset(
    {
        "workers",
        "max_live",
        "timeout",
        "retry_wait",
        "retry_for",
        "max_bytes",
        "max_targets",
        "takeover_after",
        "fair",
        "keep",
    }
)


def add_options(p: argparse.ArgumentParser) -> None:
    """The flags of ``work`` (each also a key of the ``--config`` file)."""
    p.add_argument(
        "--fetch",
        metavar="MODULE:FUNCTION",
        help="what fetches a target: fetch(ctx, caller, target), threaded or async def",
    )
    p.add_argument("--config", metavar="FILE.toml", help="settings (flags win over it)")
    p.add_argument("--workers", type=int, help="fetches at once (default 4)")
    p.add_argument("--max-live", type=int, help="most jobs held at once (default 2 x workers)")
    p.add_argument("--timeout", type=float, metavar="S", help="time limit of one fetch")
    p.add_argument(
        "--grace",
        type=float,
        metavar="S",
        help=f"on SIGTERM, seconds the fetches in flight have to finish (default {GRACE:g})",
    )
    p.add_argument("--retry-wait", type=float, metavar="S", help="wait before a busy retry")
    p.add_argument("--retry-for", type=float, metavar="S", help="give up busy targets after")
    p.add_argument("--max-bytes", type=bytes_size, metavar="SIZE", help="stored bytes to keep")
    p.add_argument("--takeover-after", type=float, metavar="S", help="a job's lease")
    p.add_argument("--fair", choices=("job", "caller"), help="who takes turns (default job)")
    p.add_argument(
        "--resume", metavar="MODULE:FUNCTION", help="caller id -> caller (default batch:Caller)"
    )
    p.add_argument(
        "--upstream",
        metavar="MODULE:FUNCTION",
        help="target -> upstream, for pacing (batch.web:host_of for URLs)",
    )
    p.add_argument("--metrics-port", type=int, metavar="P", help="serve /metrics and /healthz")
    p.add_argument("--metrics-host", metavar="ADDR", help="address to serve them on")
    p.add_argument("--log-level", choices=LEVELS, help="least level logged (default info)")


def settings(args: argparse.Namespace) -> Settings:
    """The flags given over the ``--config`` file's keys; ``BadInput`` for
    an unknown key, a value of the wrong type, or no fetch at all."""
    merged: dict[str, Any] = {} if args.config is None else _read(args.config)
    for f in dataclasses.fields(Settings):
        value = getattr(args, f.name, None)
        if value is not None and f.name != "db":
            merged[f.name] = value
    merged.setdefault("db", args.db)
    if "fetch" not in merged:
        raise BadInput("work needs --fetch MODULE:FUNCTION (or fetch = ... in --config)")
    _check(merged, "grace", float, lambda v: 0 <= v < float("inf"), "seconds >= 0")
    _check(merged, "metrics_port", int, lambda v: 0 <= v <= 65535, "a port (0-65535)")
    _check(merged, "metrics_host", str, bool, "an address")
    _check(merged, "db", str, bool, "a file or a postgresql:// URL")
    _check(merged, "log_level", str, lambda v: v in LEVELS, " or ".join(LEVELS))
    return Settings(**merged)


#: The levels ``--log-level`` takes.
LEVELS = ("debug", "info", "warning", "error")


def _check(
    merged: dict[str, Any], key: str, kind: type, ok: Callable[[Any], bool], what: str
) -> None:
    """``BadInput`` unless ``merged[key]`` (if set) is a ``kind`` that is ``ok``."""
    if key not in merged:
        return
    value = merged[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = merged[key] = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) or not ok(value):
        raise BadInput(f"{key.replace('_', '-')} must be {what}, not {value!r}")


def work(args: argparse.Namespace) -> Output:
    """Run the store's jobs with FETCH until SIGTERM or Ctrl-C."""
    given = settings(args)
    fetch = _load(given.fetch, "fetch")
    config = given.config()
    with _logs(given.log_level), stopping() as stop, store.open(given.db) as db:
        hooks = _hooks(given, db)
        runner: Runner[Any] = Runner(db, fetch, config, hooks.runner)
        try:
            with contextlib.ExitStack() as serving:
                if hooks.registry is not None:
                    assert given.metrics_port is not None
                    serving.enter_context(
                        _serving(runner, hooks.registry, given.metrics_host, given.metrics_port)
                    )
                log.info(
                    "runner %s works on %s: fetch %s, %d workers, %s jobs at most",
                    runner.id,
                    db.path,
                    given.fetch,
                    config.workers,
                    config.max_live,
                )
                signal = _until_stopped(runner, stop)
                log.info("%s: taking nothing new; fetches in flight have %gs", signal, given.grace)
                _drain(runner, given.grace)
        except BaseException:
            # A second signal, or a failure: stop at once, the jobs of the
            # fetches in flight released to the other runners.
            with contextlib.suppress(TimeoutError):
                runner.close(STOP_AT_ONCE, grace=0)
            raise
    return Output(None, "", 0)


def _until_stopped(runner: Runner[Any], stop: Callable[[], str | None]) -> str:
    """Wait for the first signal; what it was. ``Failure`` if the runner
    closes by itself first (a newer release stepped the schema on)."""
    woken = threading.Event()
    while (signal := stop()) is None:
        woken.wait(POLL)  # a signal's handler only notes it: look again soon
        if runner.closed_reason is not None:
            raise Failure(runner.closed_reason)
    return "terminated (SIGTERM)" if signal == "terminated" else "interrupted (SIGINT)"


def _drain(runner: Runner[Any], grace: float) -> None:
    """Close ``runner``: the fetches in flight have ``grace`` seconds, and
    as long again as a fetch past its time limit has once its context is
    cancelled; then their jobs go to the other runners."""
    try:
        runner.close(grace + timeouts.GRACE, grace=grace)
    except TimeoutError as e:
        log.warning("%s; runner %s stopped", e, runner.id)
    else:
        log.info("runner %s stopped", runner.id)


@dataclasses.dataclass(frozen=True)
class _Hooks:
    runner: Hooks
    registry: Any  # prometheus_client.CollectorRegistry, if serving metrics


class _Logged(Hooks):
    """Logs each job that ends, one line each."""

    def ended(self, job_id: str, owner: str, status: JobStatus) -> None:
        log.info("job %s of %s ended %s", job_id, owner, status)
        super().ended(job_id, owner, status)


def _hooks(given: Settings, db: store.Store) -> _Hooks:
    """The runner's hooks: its log, and its metrics if they are served."""
    if given.metrics_port is None:
        return _Hooks(_Logged(), None)
    try:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 - the extra

        from ..metrics import Metrics, StoreCollector  # noqa: PLC0415 - needs the extra
    except ImportError:
        raise BadInput(
            "--metrics-port needs prometheus-client: pip install 'batch-store[metrics]'"
        ) from None

    class Both(_Logged, Metrics):
        """The log's line and the metrics, for each change."""

    registry = CollectorRegistry()
    registry.register(StoreCollector(db))
    return _Hooks(Both(registry), registry)


@contextlib.contextmanager
def _serving(runner: Runner[Any], registry: Any, host: str, port: int) -> Iterator[None]:
    """``/metrics`` and ``/healthz`` at ``http://host:port``, on a thread."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server  # noqa: PLC0415

    from prometheus_client import make_wsgi_app  # noqa: PLC0415 - the extra
    from prometheus_client.exposition import ThreadingWSGIServer  # noqa: PLC0415

    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], respond: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            why = _unhealthy(runner)
            status = "200 OK" if why is None else "503 Service Unavailable"
            respond(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{why or 'ok'}\n".encode()]
        return metrics(environ, respond)  # type: ignore[no-any-return]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """A scrape every few seconds is not news."""

    try:
        server = make_server(host, port, app, ThreadingWSGIServer, handler_class=Quiet)
    except OSError as e:
        raise Failure(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    thread = threading.Thread(target=server.serve_forever, name="batch-metrics", daemon=True)
    thread.start()
    log.info("serving /metrics and /healthz on http://%s:%d", host, server.server_port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _unhealthy(runner: Runner[Any]) -> str | None:
    """Why the runner is not working now; None while it is."""
    st = runner.statistics()
    if st.closed:
        return "stopping"
    if st.workers == 0:  # its keeper then beats no more: say why first
        return "no worker is left (every one is in a fetch past its time limit)"
    if not st.store_ok:
        return "the store does not answer"
    return None


@contextlib.contextmanager
def _logs(level: str) -> Iterator[None]:
    """While inside, the runner's and the store's logs go to stderr, one
    line an event, from ``level`` up (in place of the short lines the other
    commands print)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    loggers = [logging.getLogger(n) for n in ("batch", "store")]
    saved = [(lg.handlers, lg.level) for lg in loggers]
    for logger in loggers:
        logger.handlers = [handler]
        logger.setLevel(level.upper())
    try:
        yield
    finally:
        for logger, (handlers, was) in zip(loggers, saved, strict=True):
            logger.handlers = handlers
            logger.setLevel(was)


def _read(path: str) -> dict[str, Any]:
    """The ``--config`` file's settings, keys as the flags' names (``-`` or
    ``_``); ``BadInput`` for one it cannot read or a key it does not know."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as e:
        raise BadInput(f"--config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"--config {path}: not TOML: {e}") from None
    # Not the store: it comes from --db or $BATCH_DB, so that a password
    # in its URL stays out of a file the deployment copies about.
    known = {f.name for f in dataclasses.fields(Settings)} - {"db"}
    read = {key.replace("-", "_"): value for key, value in raw.items()}
    unknown = sorted(set(read) - known)
    if unknown:
        raise BadInput(f"--config {path}: unknown setting(s): {', '.join(unknown)}")
    if isinstance(read.get("max_bytes"), str):
        read["max_bytes"] = bytes_size(read["max_bytes"])
    return read


def _limits(tables: Mapping[str, Mapping[str, Any]]) -> dict[str, Limit]:
    """``[limits."host"]`` tables as ``Limit``s (``"*"``: every other)."""
    if not isinstance(tables, Mapping):
        raise BadInput('limits must be a table of upstreams: [limits."api.example.com"]')
    limits = {}
    for upstream, table in tables.items():
        if not isinstance(table, Mapping):
            raise BadInput(f"limits.{upstream} must be a table (rate, concurrency, adaptive)")
        try:
            limits[upstream] = Limit(**table)
        except TypeError as e:
            raise BadInput(f"limits.{upstream}: {e}") from None
    return limits


def _load(spec: object, what: str) -> Any:
    """The object ``package.module:name`` names (a dotted name after the
    colon reaches an attribute of one); modules are found from the current
    directory too, as ``python -m`` would. ``BadInput`` if it names nothing
    callable; ``Failure`` if importing its module raised."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise BadInput(f"{what} must be MODULE:FUNCTION (say myapp.jobs:fetch), not {spec!r}")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise BadInput(
                f"{what} {spec}: no module {e.name!r} (installed, or in this directory?)"
            ) from None
        raise Failure(f"{what} {spec}: importing {module_name} failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's module: its error, in one line
        raise Failure(
            f"{what} {spec}: importing {module_name} raised {type(e).__name__}: {e}"
        ) from None
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise BadInput(f"{what} {spec}: {module_name} has no {attr!r}") from None
    if not callable(found):
        raise BadInput(f"{what} {spec}: {attr} is not callable")
    return found
