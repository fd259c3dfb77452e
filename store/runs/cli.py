"""The operator's command line for the run scheduler::

    python -m store [--db PATH|URL] nodes|runs|show|queue|explain|cancel|wake|reap|drain|undrain

(also installed as ``batch-store``). Views (``nodes``, ``runs``, ``show``,
``queue``, ``explain``) open the store read-only and never change it.
Actions (``cancel``, ``wake``, ``reap``, ``drain``, ``undrain``) open it
for writing, but only once it is known to hold a store: they never create
one. Every command prints an aligned table, or JSON with ``--json`` (see
``store.console``: a listing one object per line).

Exit status: 0 on success; 1 when the run shown ended FAILED or the
operation failed (one line on stderr says why); 2 on bad usage; 3 when the
run or node is not found; 130 when interrupted; 143 on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..console import (
    EMPTY,
    EXIT_FAILED,
    Output,
    Parser,
    about,
    add_db,
    add_version,
    count,
    duration,
    moment,
    run,
    seconds,
    seconds_or_never,
    table,
)
from ..shapes import NodeView, RunView
from ..states import RunState
from ..store import LEASE_TTL, MAX_LEASES_PER_RUN, RESERVE_AFTER, Store
from ..store import open as open_store

__all__ = ["main"]

#: What named the store before both command lines shared ``$BATCH_DB``: still
#: read when that is not set.
STORE_DB = "STORE_DB"
# -- opening the store -----------------------------------------------------------


def _open_view(path: str) -> Store:
    """The store at ``path``, read-only: nothing is created, migrated or written."""
    return open_store(path, readonly=True)


def _open_to_act(args: argparse.Namespace) -> Store:
    """The store at ``args.db``, open for changes. A path that does not hold a
    store already is refused (``StoreError``): an action never creates a store,
    nor turns another SQLite file into one."""
    _open_view(args.db).close()
    return open_store(
        args.db,
        lease_ttl=args.lease_ttl,
        max_leases_per_run=args.max_leases_per_run,
        reserve_after=args.reserve_after,
    )


# -- formatting --------------------------------------------------------------------


def _fields(pairs: Sequence[tuple[str, str]]) -> str:
    """Named values, a line each, the names in a column."""
    width = max(len(name) for name, _ in pairs)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in pairs)


def _labels(values: Iterable[str]) -> str:
    """Capability labels, sorted and comma-separated."""
    return ",".join(sorted(values))


def _millis(secs: float | None) -> float | None:
    """Seconds rounded to the millisecond, for JSON a person may read too."""
    return None if secs is None else round(secs, 3)


# -- nodes ------------------------------------------------------------------------

NODE_HEADER = ("NODE", "NAME", "CAPS", "STATE", "RUN", "LEASE", "SEEN")


def _node_state(node: NodeView) -> str:
    """``idle``, ``busy`` (it holds a lease), ``draining``, or ``busy+draining``."""
    if node.run_id is None:
        return "draining" if node.draining else "idle"
    return "busy+draining" if node.draining else "busy"


def _node_json(node: NodeView, now: float) -> dict[str, Any]:
    """A node for scripts; ``expires_in`` is the seconds its lease has left."""
    return {
        "id": node.node_id,
        "node_id": node.node_id,
        "name": node.name,
        "caps": sorted(node.caps),
        "state": _node_state(node),
        "busy": node.run_id is not None,
        "draining": node.draining,
        "run_id": node.run_id,
        "not_after": node.not_after,
        "expires_in": _millis(None if node.not_after is None else node.not_after - now),
        "last_seen": node.last_seen,
    }


def _lease_left(node: NodeView, now: float) -> str:
    """How long the node's lease has left, or how long ago it expired."""
    if node.not_after is None:
        return EMPTY
    left = node.not_after - now
    return duration(left) if left > 0 else f"expired {duration(-left)} ago"


def _node_table(nodes: Iterable[NodeView], now: float) -> str:
    """Nodes as a table: one line each."""
    return table(
        NODE_HEADER,
        (
            (
                n.node_id,
                n.name,
                _labels(n.caps) or EMPTY,
                _node_state(n),
                n.run_id or EMPTY,
                _lease_left(n, now),
                f"{duration(now - n.last_seen)} ago",
            )
            for n in nodes
        ),
        empty="no nodes",
    )


# -- runs -----------------------------------------------------------------------

RUN_HEADER = ("RUN", "STATE", "REASON", "STEPS", "CREATED", "TIME")
QUEUE_HEADER = ("#", "RUN", "WAITED", "STEPS", "NEEDS")
STEP_HEADER = ("SEQ", "NAME", "KIND", "NEEDS", "STATE", "NODE", "OUTPUT")
WHY_HEADER = ("SEQ", "STEP", "NEEDS", "NODE", "WHY")
#: How much of a step's output the ``show`` table gives; ``--json`` gives it all.
OUTPUT_WIDTH = 40


def _waited(run: RunView, now: float) -> float:
    """Seconds the run spent QUEUED: from its submit until it started, ended, or now."""
    until = next(t for t in (run.started_at, run.ended_at, now) if t is not None)
    return until - run.created_at


def _ran(run: RunView, now: float) -> float | None:
    """Seconds the run has been placed: from its start until it ended, or now;
    None if it never started."""
    if run.started_at is None:
        return None
    return (now if run.ended_at is None else run.ended_at) - run.started_at


def _run_time(run: RunView, now: float) -> str:
    """How long the run has waited (QUEUED), run (RUNNING) or took (ended)."""
    placed = _ran(run, now)
    if placed is None:
        word = "waiting" if run.state == RunState.QUEUED else "waited"
        return f"{word} {duration(_waited(run, now))}"
    return f"{'running' if run.state == RunState.RUNNING else 'took'} {duration(placed)}"


def _run_json(run: RunView, now: float) -> dict[str, Any]:
    """The run's wire view (``RunView.to_dict()``), with each step's kind and
    needs, the run's reason and times, and the seconds it ``waited`` QUEUED
    and ``ran`` (None if it never started)."""
    out = {"id": run.run_id, **run.to_dict()}
    for step, view in zip(out["steps"], run.steps, strict=True):
        step.update(kind=view.kind, needs=sorted(view.needs))
    out.update(
        reason=run.reason,
        created_at=run.created_at,
        started_at=run.started_at,
        ended_at=run.ended_at,
        waited=_millis(_waited(run, now)),
        ran=_millis(_ran(run, now)),
    )
    return out


def _step_needs(run: RunView) -> str:
    """What each step needs, in order: ``build(linux) test(gpu,linux) lint``."""
    return " ".join(f"{s.name}({_labels(s.needs)})" if s.needs else s.name for s in run.steps)


def _step_nodes(run: RunView) -> str:
    """The nodes the run's steps are placed on, sorted; ``-`` if none."""
    return _labels({s.node for s in run.steps if s.node}) or EMPTY


def _run_table(runs: Iterable[RunView], now: float) -> str:
    """Runs as a table: one line each."""
    return table(
        RUN_HEADER,
        (
            (
                r.run_id,
                r.state,
                r.reason or EMPTY,
                str(len(r.steps)),
                moment(r.created_at),
                _run_time(r, now),
            )
            for r in runs
        ),
        empty="no runs",
    )


def _run_summary(run: RunView, record: dict[str, Any], now: float) -> str:
    """One run, a field a line, its Record last."""
    sealed = record["sealed_at"]
    return _fields(
        [
            ("run", run.run_id),
            ("state", f"{run.state}: {run.reason}" if run.reason else run.state),
            ("created", moment(run.created_at)),
            ("started", moment(run.started_at)),
            ("ended", moment(run.ended_at)),
            ("time", _run_time(run, now)),
            ("warnings", "; ".join(run.warnings) or EMPTY),
            ("record", "open" if sealed is None else f"sealed {moment(sealed)} {record['digest']}"),
        ]
    )


def _clip(text: str) -> str:
    """``text`` on one line of at most ``OUTPUT_WIDTH`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= OUTPUT_WIDTH else text[: OUTPUT_WIDTH - 1] + "\u2026"


def _step_table(run: RunView) -> str:
    """The run's steps as a table, each node by id and human name."""
    names = {a.seq: a.node_name for a in run.assigned}
    return table(
        STEP_HEADER,
        (
            (
                str(s.seq),
                s.name,
                s.kind,
                _labels(s.needs) or EMPTY,
                s.state,
                f"{s.node} ({names[s.seq]})" if s.seq in names else s.node or EMPTY,
                EMPTY if s.output is None else _clip(json.dumps(s.output, separators=(",", ":"))),
            )
            for s in run.steps
        ),
    )


# -- the commands ------------------------------------------------------------------


def _nodes(args: argparse.Namespace) -> Output:
    """Every node: caps, state, the lease it holds, when it was last seen."""
    with _open_view(args.db) as db:
        nodes = db.list_nodes()
    now = time.time()
    return Output([_node_json(n, now) for n in nodes], _node_table(nodes, now))


def _runs(args: argparse.Namespace) -> Output:
    """Runs in FIFO order, all or of one state."""
    with _open_view(args.db) as db:
        runs = db.list_runs(state=None if args.state is None else RunState(args.state))
    now = time.time()
    return Output([_run_json(r, now) for r in runs], _run_table(runs, now))


def _show(args: argparse.Namespace) -> Output:
    """One run, its steps (with their output) and its Record; status 1 if it
    ended FAILED."""
    with _open_view(args.db) as db:
        run = db.get_run(args.run_id)
        record = db.record(args.run_id)
    now = time.time()
    return Output(
        {**_run_json(run, now), "record": record},
        f"{_run_summary(run, record, now)}\n\n{_step_table(run)}",
        EXIT_FAILED if run.state == RunState.FAILED else 0,
    )


def _queue(args: argparse.Namespace) -> Output:
    """The QUEUED runs in the order they will be promoted, what they wait for."""
    with _open_view(args.db) as db:
        runs = db.list_runs(state=RunState.QUEUED)
    now = time.time()
    rows = (
        (str(i), r.run_id, duration(_waited(r, now)), str(len(r.steps)), _step_needs(r))
        for i, r in enumerate(runs, 1)
    )
    return Output(
        [_run_json(r, now) for r in runs], table(QUEUE_HEADER, rows, empty="no runs queued")
    )


def _explain(args: argparse.Namespace) -> Output:
    """Why a run waits: its place in the queue, and why no node takes each step."""
    with open_store(
        args.db,
        readonly=True,
        max_leases_per_run=args.max_leases_per_run,
        reserve_after=args.reserve_after,
    ) as db:
        why = db.explain(args.run_id)
    now = time.time()
    return Output({"id": why["run_id"], **why}, _explanation(why, now))


def _explanation(why: dict[str, Any], now: float) -> str:
    """``explain``'s dict for people: where the run stands, then a line per
    node that could take a step, with why it does not now."""
    where = why["state"]
    if why["position"] is not None:
        where += f", number {why['position']} in the queue"
        if why["ahead"]:
            shown = ", ".join(why["ahead"][:3]) + (", ..." if len(why["ahead"]) > 3 else "")
            where += f" (after {shown})"
    rows = []
    for step in why["steps"]:
        first = (str(step["seq"]), step["name"], _labels(step["needs"]) or EMPTY)
        candidates = step["nodes"] or [None]
        for i, node in enumerate(candidates):
            cells = first if i == 0 else ("", "", "")
            rows.append((*cells, *_why_not(node, now)))
    if why["state"] != RunState.QUEUED:
        verdict = f"not waiting: it is {why['state']}"
    elif all(any(n["why"] is None for n in s["nodes"]) for s in why["steps"]):
        verdict = "it fits now: the next wake promotes it"
    else:
        verdict = "it waits for the nodes below"
    head = _fields(
        [
            ("run", why["run_id"]),
            ("state", where),
            ("waited", duration(why["waited"])),
            ("reserving", RESERVING if why["reserving"] else "no"),
            ("verdict", verdict),
        ]
    )
    return head if why["state"] != RunState.QUEUED else f"{head}\n\n{table(WHY_HEADER, rows)}"


#: What ``reserving`` means, where a run reserves.
RESERVING = "yes: no run behind it is placed on a node it could use"


def _why_not(node: dict[str, Any] | None, now: float) -> tuple[str, str]:
    if node is None:
        return EMPTY, "no node has these caps"
    name = f"{node['node_id']} ({node['name']})" if node["name"] else node["node_id"]
    why = node["why"]
    if why is None:
        return name, "free"
    if why == "busy":
        left = duration(node["lease_until"] - now)
        return name, f"busy with {node['run_id']} (lease ends in {left})"
    if why == "reserved":
        return name, f"reserved for {node['run_id']}, which waited longer"
    return name, why


def _cancel(args: argparse.Namespace) -> Output:
    """Cancel a QUEUED or RUNNING run (it ends FAILED, reason cancelled);
    print it. Status 1 if it had ended already."""
    with _open_to_act(args) as db:
        cancelled = db.cancel_run(args.run_id)
        run = db.get_run(args.run_id)
    now = time.time()
    text = _run_table([run], now)
    if not cancelled:
        text += f"\nrun {run.run_id} had ended already: nothing cancelled"
    return Output(
        {**_run_json(run, now), "cancelled": cancelled}, text, 0 if cancelled else EXIT_FAILED
    )


def _wake(args: argparse.Namespace) -> Output:
    """Promote every QUEUED run that fits now, in FIFO order; print them.

    Opening a store for writing wakes the queue already, and the ids that wake
    promotes are not returned; so the runs QUEUED beforehand are read first,
    and those that have started since count as promoted too."""
    with _open_view(args.db) as db:
        queued = [r.run_id for r in db.list_runs(state=RunState.QUEUED)]
    with _open_to_act(args) as db:
        woken = db.wake_queued(why="asked from the command line")
        runs = [db.get_run(run_id) for run_id in dict.fromkeys([*queued, *woken])]
    promoted = [r for r in runs if r.started_at is not None]
    return Output(
        [{"id": r.run_id, "run_id": r.run_id, "nodes": _step_nodes(r)} for r in promoted],
        table(
            ("PROMOTED", "NODES"),
            ((r.run_id, _step_nodes(r)) for r in promoted),
            empty="no run promoted",
        ),
    )


def _reap(args: argparse.Namespace) -> Output:
    """Fail the runs holding an expired lease, and promote the QUEUED runs
    their nodes let start; print both."""
    with _open_view(args.db) as db:
        queued = [r.run_id for r in db.list_runs(state=RunState.QUEUED)]
    with _open_to_act(args) as db:
        failed = [db.get_run(run_id) for run_id in db.reap()]
        woken = [db.get_run(run_id) for run_id in queued]
    started = [r for r in woken if r.started_at is not None]
    rows = [(r.run_id, "reaped", r.reason or EMPTY) for r in failed]
    rows += [(r.run_id, "promoted", f"on {_step_nodes(r)}") for r in started]
    return Output(
        [
            *(
                {"id": r.run_id, "run_id": r.run_id, "reaped": True, "reason": r.reason}
                for r in failed
            ),
            *(
                {"id": r.run_id, "run_id": r.run_id, "promoted": True, "nodes": _step_nodes(r)}
                for r in started
            ),
        ],
        table(("RUN", "WHAT", "WHY"), rows, empty="no lease expired"),
    )


def _drain(args: argparse.Namespace) -> Output:
    """Let a node finish the run it holds and take no new one."""
    return _set_draining(args, Store.drain)


def _undrain(args: argparse.Namespace) -> Output:
    """Let a node take runs again (which wakes the queue)."""
    return _set_draining(args, Store.undrain)


def _set_draining(args: argparse.Namespace, change: Callable[[Store, str], None]) -> Output:
    """Apply ``change`` (drain or undrain) to ``args.node_id``; print the node."""
    with _open_to_act(args) as db:
        change(db, args.node_id)
        node = next(n for n in db.list_nodes() if n.node_id == args.node_id)
    now = time.time()
    return Output(_node_json(node, now), _node_table([node], now))


# -- parsing -------------------------------------------------------------------------


def build_parser(prog: str = "python -m store") -> argparse.ArgumentParser:
    """The parser of every command; each command's function is its ``handler``."""
    parser = Parser(
        prog=prog,
        description="Look at and steer the runs, nodes and queue of a store.",
    )
    also_db = add_db(parser, STORE_DB)
    add_version(parser)
    view = Parser(add_help=False)
    view.add_argument("--json", action="store_true", help="print JSON, one object per line")
    # The service's placement settings, which a view that places in its
    # head (explain) needs as much as an action that places.
    settings = Parser(add_help=False, parents=[view])
    settings.add_argument(
        "--max-leases-per-run",
        type=count,
        default=MAX_LEASES_PER_RUN,
        metavar="N",
        help=f"the most nodes a run may hold (default: {MAX_LEASES_PER_RUN})",
    )
    settings.add_argument(
        "--reserve-after",
        type=seconds_or_never,
        default=RESERVE_AFTER,
        metavar="SECONDS",
        help="a run QUEUED this long reserves the nodes it could use; never: no run does"
        f" (default: {RESERVE_AFTER:g})",
    )
    act = Parser(add_help=False, parents=[settings])
    act.add_argument(
        "--lease-ttl",
        type=seconds,
        default=LEASE_TTL,
        metavar="SECONDS",
        help=f"lifetime of the leases a promotion issues (default: {LEASE_TTL:g})",
    )
    commands = parser.add_subparsers(
        title="commands", dest="command", required=True, metavar="COMMAND"
    )

    def add(name: str, handler: Callable[[argparse.Namespace], Output], kind: Parser) -> Parser:
        """Add the command ``name``; its help is the first line of ``handler``'s docstring."""
        said = about(handler)
        sub: Parser = commands.add_parser(name, help=said, description=said, parents=[kind])
        sub.set_defaults(handler=handler)
        also_db(sub)
        return sub

    add("nodes", _nodes, view)
    add("runs", _runs, view).add_argument(
        "--state",
        type=str.upper,
        choices=tuple(RunState),
        help=f"only the runs in this state: {', '.join(RunState)} (any case)",
    )
    add("show", _show, view).add_argument("run_id", metavar="RUN", help="the run id")
    add("queue", _queue, view)
    add("explain", _explain, settings).add_argument("run_id", metavar="RUN", help="the run id")
    add("cancel", _cancel, act).add_argument("run_id", metavar="RUN", help="the run id")
    add("wake", _wake, act)
    add("reap", _reap, act)
    add("drain", _drain, act).add_argument("node_id", metavar="NODE", help="the node id")
    add("undrain", _undrain, act).add_argument("node_id", metavar="NODE", help="the node id")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m store") -> int:
    """Run one command line; return its exit status."""
    return run("store" if prog.startswith("python") else prog, build_parser(prog), argv)


def console_main() -> int:
    """The ``batch-store`` command."""
    return main(prog="batch-store")
