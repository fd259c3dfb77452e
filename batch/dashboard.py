"""``batch-runner serve``: a web dashboard over a store, SQLite or PostgreSQL
(extra ``web``: Starlette, and uvicorn to serve it).

One page (``dashboard.html``, no build step) shows the jobs with their
progress, filtered by status and caller; a job's targets and errors; the
upstreams the runners pace, and what is paused; the QUEUED runs in order, each with why it
waits; the nodes, busy and draining. It refreshes when the store's events
(``Store.watch``) say something changed, as they arrive over server-sent
events. The same data is JSON under ``/api/``:

========================== ===========================================
``GET /api/jobs``          the newest jobs (``?status=``, ``?owner=``, ``?limit=``)
``GET /api/jobs/{id}``     one job and its targets
``POST /api/jobs/{id}/cancel``  cancel it (only with ``allow_cancel``)
``GET /api/upstreams``     the upstreams the store knows
``GET /api/paused``        what is paused: callers and upstreams, since when
``GET /api/runs``          the QUEUED runs in order, each with ``explain``;
                           the RUNNING ones
``GET /api/nodes``         the nodes
``GET /api/gauges``        the store's gauges (``Store.gauges``)
``GET /api/events``        the store's events, as server-sent events
                           (``id`` is the event's ``seq``: a reconnecting
                           browser resumes after it)
``GET /api/config``        what the page may do (``allow_cancel``)
========================== ===========================================

Read-only unless ``allow_cancel``. Every store call runs on a worker thread
(Starlette's, for plain endpoints), never on the event loop.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from enum import Enum
from importlib import resources
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import store

__all__ = ["CANCEL_HEADER", "KEEPALIVE", "MAX_JOBS", "app", "serve"]

#: The header a cancel must carry: the page sends it; another site's page
#: cannot (a custom header asks the server's leave first, never given).
CANCEL_HEADER = ("X-Batch-Dashboard", "cancel")
#: The names of this host: served on one of them, the dashboard answers
#: to them only.
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Event streams open at once, each with a thread waiting on the store.
MAX_STREAMS = 100
#: The most jobs ``/api/jobs`` lists at once (the newest).
MAX_JOBS = 500
#: Seconds the server gives open requests to end when it is stopped.
SHUTDOWN = 3
#: Seconds between an event stream's looks at whether the server stops.
STOP_CHECK = 0.25
#: Seconds an event stream waits for an event before it sends a comment,
#: which keeps proxies from closing it.
KEEPALIVE = 15.0


def _plain(value: Any) -> Any:
    """``value`` as JSON takes it: dataclasses and named tuples as objects,
    enums as their values, sets sorted."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # a NamedTuple: TargetRow
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json(value: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(_plain(value), status_code=status_code)


def app(
    db: store.Store,
    *,
    allow_cancel: bool = False,
    allowed_hosts: Sequence[str] | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> Starlette:
    """The dashboard of ``db`` as an ASGI application. ``allowed_hosts``:
    the names it answers to (None: any), so that another site's page cannot
    read it through a name that resolves to it (DNS rebinding). A cancel
    must carry the page's own header (:data:`CANCEL_HEADER`), which another
    site's page cannot send without the server's leave. ``stopping`` says
    when the server stops: its event streams then end (within
    :data:`STOP_CHECK` seconds), so that it need not cut them."""
    # The threads event streams wait on, apart from the pool that plain
    # endpoints use: many open pages do not starve the JSON.
    limiter: list[anyio.CapacityLimiter] = []

    def page(request: Request) -> HTMLResponse:
        html = resources.files("batch").joinpath("dashboard.html").read_text(encoding="utf-8")
        return HTMLResponse(html)

    def config(request: Request) -> JSONResponse:
        return _json({"allow_cancel": allow_cancel, "store": db.path, "kinds": store.events.KINDS})

    def jobs(request: Request) -> JSONResponse:
        q = request.query_params
        status = q.get("status") or None
        if status is not None and status not in {s.value for s in store.JobStatus}:
            return _json({"error": f"no status {status!r}"}, 400)
        try:
            limit = min(int(q.get("limit", "100")), MAX_JOBS)
        except ValueError:
            return _json({"error": "limit is a number"}, 400)
        found = db.list_jobs(
            owner=q.get("owner") or None,
            status=None if status is None else store.JobStatus(status),
            newest=max(limit, 0),
        )
        return _json(list(reversed(found)))

    def job(request: Request) -> JSONResponse:
        row = db.find_job(request.path_params["job_id"])
        if row is None:
            return _json({"error": "no such job"}, 404)
        return _json(dataclasses.replace(row, trace=None))

    def cancel(request: Request) -> JSONResponse:
        if not allow_cancel:
            return _json({"error": "this dashboard is read-only (serve --allow-cancel)"}, 403)
        if request.headers.get(CANCEL_HEADER[0]) != CANCEL_HEADER[1]:
            return _json({"error": f"a cancel carries the header {CANCEL_HEADER[0]}"}, 403)
        row = db.find_job(request.path_params["job_id"])
        if row is None:
            return _json({"error": "no such job"}, 404)
        return _json({"cancelled": db.cancel_job(row.id, row.owner)})

    def upstreams(request: Request) -> JSONResponse:
        return _json(db.upstreams())

    def paused(request: Request) -> JSONResponse:
        return _json(db.paused())

    def runs(request: Request) -> JSONResponse:
        queued = db.list_runs(store.RunState.QUEUED)
        return _json(
            {
                "queued": [{"run": r, "explain": db.explain(r.run_id)} for r in queued],
                "running": db.list_runs(store.RunState.RUNNING),
            }
        )

    def nodes(request: Request) -> JSONResponse:
        return _json(db.list_nodes())

    def gauges(request: Request) -> JSONResponse:
        return _json(db.gauges())

    async def events(request: Request) -> Response:
        last = request.headers.get("last-event-id") or request.query_params.get("since")
        try:
            since = None if last is None else int(last)
        except ValueError:
            return _json({"error": "since is an event's seq"}, 400)
        if not limiter:
            limiter.append(anyio.CapacityLimiter(MAX_STREAMS))
        stream = _stream(db, since, request, stopping, limiter[0])
        return StreamingResponse(stream, media_type="text/event-stream", headers=_NO_CACHE)

    middleware = (
        []
        if allowed_hosts is None
        else [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    )
    return Starlette(
        middleware=middleware,
        routes=[
            Route("/", page),
            Route("/api/config", config),
            Route("/api/jobs", jobs),
            Route("/api/jobs/{job_id}", job),
            Route("/api/jobs/{job_id}/cancel", cancel, methods=["POST"]),
            Route("/api/upstreams", upstreams),
            Route("/api/paused", paused),
            Route("/api/runs", runs),
            Route("/api/nodes", nodes),
            Route("/api/gauges", gauges),
            Route("/api/events", events),
        ],
    )


#: What tells a page to read everything afresh: events it missed are gone.
RELOAD = "event: reload\ndata: {}\n\n"
_NO_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _stream(
    db: store.Store,
    since: int | None,
    request: Request,
    stopping: Callable[[], bool],
    limiter: anyio.CapacityLimiter,
) -> AsyncIterator[str]:
    """The store's events after ``since`` as server-sent events, until the
    browser goes or the server stops (or the store fails: the browser
    reconnects, and resumes). Events pruned since ``since`` make a
    ``reload`` event, and the stream goes on from now."""
    yield "retry: 1000\n\n"
    try:
        watch = await anyio.to_thread.run_sync(db.watch, since, limiter=limiter)
    except store.EventsPruned:
        # Watching from now before the page is told: it misses nothing after.
        watch = await anyio.to_thread.run_sync(db.watch, None, limiter=limiter)
        yield RELOAD
    except store.StoreError:
        return
    try:
        quiet_since = time.monotonic()
        while not stopping() and not await request.is_disconnected():
            # Abandoned if the browser goes meanwhile: closing the watch
            # (below) wakes the thread.
            try:
                event = await anyio.to_thread.run_sync(
                    watch.get, STOP_CHECK, abandon_on_cancel=True, limiter=limiter
                )
            except store.EventsPruned:
                watch = await anyio.to_thread.run_sync(db.watch, None, limiter=limiter)
                yield RELOAD
                continue
            if event is None:
                if time.monotonic() - quiet_since >= KEEPALIVE:
                    quiet_since = time.monotonic()
                    yield ": keepalive\n\n"
                continue
            quiet_since = time.monotonic()
            data = json.dumps({"kind": event.kind, "id": event.id, "at": event.at, **event.data})
            yield f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"
    except store.StoreError:
        return
    finally:
        watch.close()


def serve(
    location: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    allow_cancel: bool = False,
    opened: Callable[[store.Store], None] = lambda db: None,
) -> None:
    """Open the store at ``location`` and serve its dashboard until
    interrupted (uvicorn: SIGINT or SIGTERM stops it). ``opened`` is
    called with the store once it is open, before the server starts."""
    import uvicorn  # noqa: PLC0415 - only the command needs the server

    with store.open(location, readonly=not allow_cancel) as db:
        opened(db)
        server: uvicorn.Server | None = None
        dashboard = app(
            db,
            allow_cancel=allow_cancel,
            allowed_hosts=LOOPBACK if host in LOOPBACK else None,
            stopping=lambda: server is not None and server.should_exit,
        )
        config = uvicorn.Config(
            dashboard,
            host=host,
            port=port,
            log_level="warning",
            # Event streams end within STOP_CHECK of a stop; one that does
            # not (a thread stuck in the store) is cut after this long.
            timeout_graceful_shutdown=SHUTDOWN,
        )
        server = uvicorn.Server(config)
        server.run()
