"""The run scheduler of the queued-runs note, a package of its own: nodes,
runs, steps, their leases and records, and its command line (``cli``).
They share the engine with the batch jobs and nothing else. Here, runs and
their steps: submit, read, claim, report, heartbeat, reap, cancel; beside
it, the FIFO wake (``queue``), the waiting line (``waiting``), placement
(``match``, ``nodes``, ``node_leases``), the Record (``record``) and why a
run waits (``explain``).

Functions take an open transaction (``Tx``) and run inside it; none of
them wakes the queue (the ``Store`` does that after the commit).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..engines import Database, Tx
from ..errors import Conflict, InvalidRun, NotFound, Unsatisfiable
from ..shapes import Assigned, Claim, NewRun, RunView, Step, StepView
from ..states import RunState, StepState, sql_list
from . import match, node_leases, nodes, record, waiting

__all__ = [
    "CheckedStep",
    "cancel",
    "check_steps",
    "claim",
    "end_run",
    "get",
    "heartbeat",
    "insert_steps",
    "list_ids",
    "new_id",
    "queue",
    "reap",
    "report",
    "submit",
]

#: A step not finished yet, as an SQL list.
_UNFINISHED = sql_list(StepState.PENDING, StepState.RUNNING)

KIND = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True, slots=True)
class CheckedStep:
    """A step that passed :func:`check_steps`: numbered, needs normalised."""

    seq: int
    name: str
    kind: str
    needs: frozenset[str]

    @property
    def stored_needs(self) -> str:
        """``needs`` as the step's row keeps them: a sorted JSON array."""
        return json.dumps(sorted(self.needs))


def check_steps(steps: object) -> tuple[list[CheckedStep], list[str]]:
    """Validate and normalise a run's steps: the one place this is done.
    Returns the steps numbered from 1 and the warnings normalisation gave.
    Raises ``InvalidRun`` naming the first thing wrong."""
    if isinstance(steps, str | bytes | Mapping) or not isinstance(steps, Iterable):
        raise InvalidRun(f"steps must be a list of store.Step, not {type(steps).__name__}")
    out: list[CheckedStep] = []
    warnings: list[str] = []
    names: set[str] = set()
    for seq, step in enumerate(steps, 1):
        if not isinstance(step, Step):
            raise InvalidRun(f"step {seq}: expected a store.Step, not {type(step).__name__}")
        if not isinstance(step.name, str) or not step.name.strip():
            raise InvalidRun(f"step {seq}: name must be a non-empty str, not {step.name!r}")
        if step.name in names:
            raise InvalidRun(f"step {seq}: the name {step.name!r} is used twice")
        names.add(step.name)
        if not isinstance(step.kind, str) or not KIND.fullmatch(step.kind):
            raise InvalidRun(
                f"step {seq} ({step.name!r}): kind {step.kind!r} is not a lowercase"
                " identifier ([a-z][a-z0-9_]*)"
            )
        needs, notes = match.labels(step.needs, f"step {step.name!r} needs")
        warnings += notes
        out.append(CheckedStep(seq, step.name, step.kind, needs))
    if not out:
        raise InvalidRun("a run needs at least one step")
    return out, warnings


def submit(
    conn: Tx,
    checked: list[CheckedStep],
    warnings: list[str],
    run_id: str,
    *,
    lease_ttl: float,
    max_leases: int,
    fleets: nodes.Fleets,
    reserve_after: float | None,
    reserved: waiting.Reservations,
) -> RunView:
    """Store a new run: RUNNING with every step placed and leased if the
    available nodes allow it now, else QUEUED with no node and no lease.
    The new run is behind every QUEUED run, so the nodes those that waited
    ``reserve_after`` seconds reserve (``reserved`` keeps what was read of
    them) are not available to it. Raises
    ``Conflict`` for a run id in use, and ``Unsatisfiable`` if no
    placement exists even with every node free. ``checked``, ``warnings``:
    from :func:`check_steps`; ``run_id``: from :func:`new_id`."""
    # What the submit decides on, in one round trip.
    taken, generation, free, last = conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM runs WHERE id = ?), {nodes.GENERATION},"
        f" {nodes.ANY_FREE}, (SELECT MAX(created_at) FROM runs)",
        (run_id,),
    ).fetchone()
    if taken:
        raise Conflict(f"run {run_id!r} exists already")
    now = conn.now  # read with the statement above, on PostgreSQL
    fleet = fleets.get(conn, generation)
    needs = [(s.seq, s.needs) for s in checked]
    placed = None
    if lease_ttl and free:
        blocked = nodes.unavailable(conn)
        placed = match.place(needs, fleet.caps, blocked, max_leases)
        if placed is not None:
            # It fits: unless a run that waited reserve_after holds back a
            # free node it would take.
            cutoff = waiting.cutoff(now, reserve_after)
            held = reserved.get(conn, fleet, cutoff, max_leases).keys() - blocked
            if held & fleet.covering(needs):
                placed = match.place(needs, fleet.caps, blocked | held, max_leases)
    if placed is None and not fleet.placeable(needs, max_leases):
        raise Unsatisfiable(_why_unsatisfiable(checked, fleet.caps, max_leases))
    # created_at is strictly increasing in submit order, so FIFO never falls
    # back on the run ids, even when the clock stalls or steps back.
    created_at = now if last is None or now > last else math.nextafter(last, math.inf)
    # The writes need no answer: they go out with the COMMIT (a node lease
    # taken meanwhile cannot be: the serial lock is held).
    state = RunState.RUNNING if placed else RunState.QUEUED
    conn.executemany(
        "INSERT INTO runs (id, state, created_at, started_at, warnings) VALUES (?, ?, ?, ?, ?)",
        [(run_id, state, created_at, now if placed else None, json.dumps(warnings))],
    )
    node_of = {a.seq: a.node_id for a in placed or ()}
    insert_steps(conn, run_id, checked, node_of)
    assigned = record.label(placed, fleet.adverts) if placed else []
    if placed:
        node_leases.issue(conn, run_id, set(node_of.values()), now + lease_ttl)
    record.open_record(conn, run_id, [(s.seq, s.name) for s in checked], assigned, now)
    return _view(
        run_id,
        state,
        checked,
        warnings,
        created_at=created_at,
        started_at=now if placed else None,
        node_of=node_of,
        assigned=assigned,
    )


def new_id(run_id: object) -> str:
    """The id a new run is to have: ``run_id``, or a new one for None."""
    if run_id is None:
        return uuid.uuid4().hex
    if not isinstance(run_id, str) or not run_id.strip():
        raise InvalidRun(f"run_id must be a non-empty str or None, not {run_id!r}")
    return run_id


def _view(
    run_id: str,
    state: RunState,
    checked: Iterable[CheckedStep],
    warnings: Iterable[str],
    *,
    created_at: float,
    started_at: float | None = None,
    node_of: Mapping[int, str] | None = None,
    assigned: Iterable[Assigned] = (),
) -> RunView:
    """A new run as :func:`get` would read it back."""
    return RunView(
        run_id,
        state,
        None,
        tuple(
            StepView(
                s.seq, s.name, s.kind, s.needs, StepState.PENDING, (node_of or {}).get(s.seq, "")
            )
            for s in checked
        ),
        tuple(warnings),
        created_at,
        started_at,
        None,
        tuple(assigned),
    )


def queue_waiting(
    db: Database,
    fleets: nodes.Fleets,
    checked: list[CheckedStep],
    warnings: list[str],
    run_id: str,
    *,
    lease_ttl: float,
    max_leases: int,
) -> RunView | None:
    """Queue a new run in one round trip, where the schema's functions run
    (``Database.functions``) and the run is to wait: no node free now, the
    fleet as last read. None: the caller submits it the usual way
    (:func:`submit`), which decides as this would. Raises as it does."""
    fleet = fleets.last
    if fleet is None or not db.functions:
        return None
    needs = [(s.seq, s.needs) for s in checked]
    new = NewRun(
        run_id,
        fleet.generation,
        bool(lease_ttl),
        fleet.placeable(needs, max_leases),
        json.dumps(
            [
                {"seq": s.seq, "name": s.name, "kind": s.kind, "needs": s.stored_needs}
                for s in checked
            ]
        ),
        json.dumps(warnings),
        record.opening([(s.seq, s.name) for s in checked], []),
    )
    verdict, created_at = db.write(lambda tx: _queue_on_server(tx, new))
    if verdict == "taken":
        raise Conflict(f"run {run_id!r} exists already")
    if verdict == "unsatisfiable":
        raise Unsatisfiable(_why_unsatisfiable(checked, fleet.caps, max_leases))
    if verdict != "queued":
        return None
    return _view(run_id, RunState.QUEUED, checked, warnings, created_at=created_at)


def _queue_on_server(conn: Tx, new: NewRun) -> tuple[str, float]:
    """Queue ``new`` by one call of ``store_queue_run`` (schema step 9), the
    transaction's one statement, sent with its BEGIN and COMMIT. Returns
    the verdict and the time the run was created (if queued)."""
    verdict, created_at = conn.finish(
        "SELECT verdict, queued_at FROM store_queue_run(?, ?, ?::boolean, ?::boolean, ?,"
        " ?::json, ?, store_now())",
        (
            new.run_id,
            new.generation,
            new.may_place,
            new.placeable,
            new.warnings,
            new.steps,
            new.record,
        ),
    ).fetchone()
    return verdict, created_at


def _why_unsatisfiable(
    steps: list[CheckedStep], caps: Mapping[str, frozenset[str]], max_leases: int
) -> str:
    for s in steps:
        if not any(s.needs <= c for c in caps.values()):
            wanted = ", ".join(sorted(s.needs)) or "nothing"
            return f"no advertised node can run step {s.name!r} (it needs: {wanted})"
    return f"the run needs more than max_leases_per_run={max_leases} nodes"


def insert_steps(
    conn: Tx, run_id: str, steps: Iterable[CheckedStep], node_of: Mapping[int, str]
) -> None:
    """Insert a run's checked steps, each on ``node_of[seq]`` or on no node."""
    conn.executemany(
        "INSERT INTO steps (run_id, seq, name, kind, needs, node_id) VALUES (?, ?, ?, ?, ?, ?)",
        ((run_id, s.seq, s.name, s.kind, s.stored_needs, node_of.get(s.seq, "")) for s in steps),
    )


def get(conn: Tx, run_id: str) -> RunView:
    """The run as stored; ``NotFound`` if there is none."""
    row = conn.execute(
        "SELECT state, reason, created_at, started_at, ended_at, warnings FROM runs WHERE id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    state, reason, created_at, started_at, ended_at, warnings = row
    steps = tuple(
        StepView(
            seq,
            name,
            kind,
            frozenset(json.loads(needs)),
            StepState(step_state),
            node_id,
            None if output is None else json.loads(output),
        )
        for seq, name, kind, needs, step_state, node_id, output in conn.execute(
            "SELECT seq, name, kind, needs, state, node_id, output FROM steps WHERE run_id = ?"
            " ORDER BY seq",
            (run_id,),
        )
    )
    assigned = tuple(
        Assigned(s["seq"], s["node_id"], s["node_name"])
        for s in record.get_record(conn, run_id)["steps"]
        if s["node_id"]
    )
    return RunView(
        run_id,
        RunState(state),
        reason,
        steps,
        tuple(json.loads(warnings)),
        created_at,
        started_at,
        ended_at,
        assigned,
    )


def list_ids(conn: Tx, state: RunState | None) -> list[str]:
    """Run ids in FIFO order (``created_at``, then id), of one state or all."""
    if state is None:
        rows = conn.execute("SELECT id FROM runs ORDER BY created_at, id")
    else:
        rows = conn.execute("SELECT id FROM runs WHERE state = ? ORDER BY created_at, id", (state,))
    return [run_id for (run_id,) in rows]


def claim(conn: Tx, node_id: str, now: float, lease_ttl: float) -> Claim | None:
    """The next step this node may run, now RUNNING, with the node's lease
    renewed; None if it has none. A step is claimable once every step before
    it in its run has SUCCEEDED, and only by the node it is assigned to."""
    nodes.require(conn, node_id, now)
    row = conn.execute(
        "SELECT s.run_id, s.seq, s.name, s.kind, s.needs FROM steps s"
        " JOIN runs r ON r.id = s.run_id"
        f" WHERE s.node_id = ? AND s.state = '{StepState.PENDING}'"
        f" AND r.state = '{RunState.RUNNING}'"
        " AND NOT EXISTS (SELECT 1 FROM steps p WHERE p.run_id = s.run_id"
        f"                 AND p.seq < s.seq AND p.state != '{StepState.SUCCEEDED}')"
        " ORDER BY r.created_at, s.seq LIMIT 1",
        (node_id,),
    ).fetchone()
    if row is None:
        return None
    run_id, seq, name, kind, needs = row
    conn.execute(
        f"UPDATE steps SET state = '{StepState.RUNNING}' WHERE run_id = ? AND seq = ?",
        (run_id, seq),
    )
    not_after = now + lease_ttl
    node_leases.renew(conn, node_id, not_after)
    return Claim(run_id, seq, name, kind, frozenset(json.loads(needs)), not_after)


def report(
    conn: Tx,
    node_id: str,
    run_id: str,
    seq: int,
    *,
    ok: bool,
    output: object,
    now: float,
) -> bool:
    """Record how a RUNNING step held by ``node_id`` ended. A success releases
    the node's lease once it has no unfinished step left in the run, and ends
    the run SUCCEEDED after its last step; a failure fails the run. Returns
    whether capacity was freed. ``Conflict`` (nothing changed) if the node
    does not hold that RUNNING step."""
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise TypeError(f"seq is an int, not {type(seq).__name__}")
    if not isinstance(ok, bool):
        raise TypeError(f"ok is a bool, not {type(ok).__name__}")
    nodes.require(conn, node_id, now)
    try:
        text = None if output is None else json.dumps(output, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidRun(f"step output must be JSON-serializable: {e}") from None
    state = conn.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
    if state is None:
        raise NotFound(f"no run {run_id!r}")
    row = conn.execute(
        "SELECT name, state, node_id FROM steps WHERE run_id = ? AND seq = ?", (run_id, seq)
    ).fetchone()
    if row is None or row[1] != StepState.RUNNING or row[2] != node_id:
        held = "no such step" if row is None else f"the step is {row[1]} on {row[2] or 'no node'!r}"
        raise Conflict(f"node {node_id!r} does not hold step {seq} of run {run_id!r}: {held}")
    name = row[0]
    conn.execute(
        "UPDATE steps SET state = ?, output = ? WHERE run_id = ? AND seq = ?",
        (StepState.SUCCEEDED if ok else StepState.FAILED, text, run_id, seq),
    )
    if not ok:
        end_run(conn, run_id, RunState.FAILED, f"step {name!r} failed", now)
        return True
    left = {
        n
        for (n,) in conn.execute(
            f"SELECT node_id FROM steps WHERE run_id = ? AND state IN {_UNFINISHED}",
            (run_id,),
        )
    }
    if not left:
        end_run(conn, run_id, RunState.SUCCEEDED, None, now)
        return True
    if node_id not in left:
        node_leases.release(conn, node_id, run_id)
        return True
    return False


def heartbeat(conn: Tx, node_id: str, now: float, lease_ttl: float) -> float | None:
    """Extend the node's lease to ``now + lease_ttl``; return the new end, or
    None if the node holds no lease."""
    nodes.require(conn, node_id, now)
    return node_leases.renew(conn, node_id, now + lease_ttl)


def reap(conn: Tx, now: float) -> list[str]:
    """Fail every run holding a lease that expired at or before ``now``. A
    QUEUED run holds no lease, so it is never touched."""
    expired = node_leases.lapsed(conn, now)
    for run_id, node_id in expired:
        end_run(conn, run_id, RunState.FAILED, f"lease expired on node {node_id!r}", now)
    return [run_id for run_id, _ in expired]


def cancel(conn: Tx, run_id: str, now: float) -> bool:
    """Fail a QUEUED or RUNNING run with reason ``cancelled``; False for an
    unknown or terminal run."""
    row = conn.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None or row[0] not in (RunState.QUEUED, RunState.RUNNING):
        return False
    end_run(conn, run_id, RunState.FAILED, "cancelled", now)
    if row[0] == RunState.QUEUED:
        waiting.bump(conn)
    return True


def end_run(conn: Tx, run_id: str, state: RunState, reason: str | None, now: float) -> None:
    """End a run: unfinished steps FAILED, every lease released, the run's
    state and end written, its Record sealed."""
    conn.execute(
        f"UPDATE steps SET state = '{StepState.FAILED}'"
        f" WHERE run_id = ? AND state IN {_UNFINISHED}",
        (run_id,),
    )
    node_leases.release_run(conn, run_id)
    conn.execute(
        "UPDATE runs SET state = ?, reason = ?, ended_at = ? WHERE id = ?",
        (state, reason, now, run_id),
    )
    record.seal_record(conn, run_id, state, reason, now)
