"""The Record of a run: which node (by id and by name) ran each step, sealed
for good when the run ends.

Every path that names nodes in a Record goes through :func:`label`, so a run
placed at submit and one placed by promotion read the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..engines import Tx
from ..errors import NotFound
from ..shapes import Assigned, Assignment
from ..states import RunState, StepState

__all__ = ["fill_record", "get_record", "label", "open_record", "seal_record"]


def label(assignments: Iterable[Assignment], adverts: Mapping[str, Any]) -> list[Assigned]:
    """Attach each assigned node's human name. ``adverts`` maps node ids to
    adverts (anything with a ``name``); an assignment to a node not among them
    is a bug in the caller and raises ``ValueError``."""
    out = []
    for a in assignments:
        advert = adverts.get(a.node_id)
        if advert is None:
            raise ValueError(f"step {a.seq} is assigned to {a.node_id!r}, which is not advertised")
        out.append(Assigned(a.seq, a.node_id, advert.name))
    return out


def open_record(
    conn: Tx,
    run_id: str,
    steps: Iterable[tuple[int, str]],
    assigned: Iterable[Assigned],
    now: float,
) -> None:
    """Open the Record of a new run: its steps (``(seq, name)``), PENDING,
    with their nodes if the run is placed already."""
    assigned = list(assigned)
    conn.executemany(
        "INSERT INTO records (run_id, state, opened_at, steps) VALUES (?, ?, ?, ?)",
        [
            (
                run_id,
                RunState.RUNNING if assigned else RunState.QUEUED,
                now,
                opening(steps, assigned),
            )
        ],
    )


def opening(steps: Iterable[tuple[int, str]], assigned: Iterable[Assigned]) -> str:
    """The steps of a new run's Record, as JSON: each PENDING, with its node
    if the run is placed already."""
    nodes = {a.seq: a for a in assigned}
    return json.dumps(
        [
            {
                "seq": seq,
                "name": name,
                "node_id": nodes[seq].node_id if seq in nodes else "",
                "node_name": nodes[seq].node_name if seq in nodes else "",
                "state": StepState.PENDING,
            }
            for seq, name in steps
        ]
    )


def fill_record(conn: Tx, run_id: str, assigned: Iterable[Assigned]) -> None:
    """Write the nodes a promotion chose into the run's Record."""
    nodes = {a.seq: a for a in assigned}
    body = _steps(conn, run_id)
    for step in body:
        a = nodes[step["seq"]]
        step["node_id"], step["node_name"] = a.node_id, a.node_name
    conn.execute(
        f"UPDATE records SET state = '{RunState.RUNNING}', steps = ? WHERE run_id = ?",
        (json.dumps(body), run_id),
    )


def seal_record(conn: Tx, run_id: str, state: RunState, reason: str | None, now: float) -> None:
    """Seal the Record of a run that just ended: its final state and reason,
    each step's final state, and a digest of it all. It never changes again."""
    body = _steps(conn, run_id)
    states = dict(conn.execute("SELECT seq, state FROM steps WHERE run_id = ?", (run_id,)))
    for step in body:
        step["state"] = states[step["seq"]]
    (opened_at,) = conn.execute(
        "SELECT opened_at FROM records WHERE run_id = ?", (run_id,)
    ).fetchone()
    content = {
        "run_id": run_id,
        "state": state,
        "reason": reason,
        "opened_at": opened_at,
        "sealed_at": now,
        "steps": body,
    }
    conn.execute(
        "UPDATE records SET state = ?, reason = ?, sealed_at = ?, steps = ?, digest = ?"
        " WHERE run_id = ?",
        (state, reason, now, json.dumps(body), digest(content), run_id),
    )


def digest(content: Mapping[str, Any]) -> str:
    """SHA-256 of the Record's content (everything but the digest), as
    canonical JSON: sorted keys, no spaces. Anyone can recompute it."""
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def get_record(conn: Tx, run_id: str) -> dict[str, Any]:
    """The run's Record as a dict; ``digest`` only once sealed."""
    row = conn.execute(
        "SELECT state, reason, opened_at, sealed_at, steps, digest FROM records WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    state, reason, opened_at, sealed_at, steps, sealed_digest = row
    out: dict[str, Any] = {
        "run_id": run_id,
        "state": state,
        "reason": reason,
        "opened_at": opened_at,
        "sealed_at": sealed_at,
        "steps": json.loads(steps),
    }
    if sealed_digest is not None:
        out["digest"] = sealed_digest
    else:
        # An open Record shows where its run is now; the seal fixes the states.
        now = dict(conn.execute("SELECT seq, state FROM steps WHERE run_id = ?", (run_id,)))
        for step in out["steps"]:
            step["state"] = now.get(step["seq"], step["state"])
        (out["state"],) = conn.execute("SELECT state FROM runs WHERE id = ?", (run_id,)).fetchone()
    return out


def _steps(conn: Tx, run_id: str) -> list[dict[str, Any]]:
    (steps,) = conn.execute("SELECT steps FROM records WHERE run_id = ?", (run_id,)).fetchone()
    body: list[dict[str, Any]] = json.loads(steps)
    return body
