"""The values of the run scheduler: what nodes advertise, what runs hold, and
what the store hands back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "RUN_STATES",
    "STEP_STATES",
    "Advert",
    "Assigned",
    "Assignment",
    "Claim",
    "NodeView",
    "RunView",
    "Step",
    "StepView",
]

#: Run states; the last two are terminal (a cancelled run ends FAILED).
RUN_STATES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED")
#: Step states.
STEP_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED")


@dataclass(frozen=True, slots=True)
class Advert:
    """A node offering itself: its id, a human name, and the capabilities
    (``caps``) steps may need. Advertising a known node replaces its name and
    caps."""

    node_id: str
    name: str
    caps: frozenset[str] | set[str] | list[str] | tuple[str, ...] = frozenset()


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a run: a ``name`` unique in the run, a ``kind`` (a lowercase
    identifier) and the capabilities it ``needs`` from its node."""

    name: str
    kind: str
    needs: frozenset[str] | set[str] | list[str] | tuple[str, ...] = frozenset()


@dataclass(frozen=True, slots=True)
class Assignment:
    """The matcher's answer for one step: it runs on ``node_id``."""

    seq: int
    node_id: str


@dataclass(frozen=True, slots=True)
class Assigned:
    """An assignment with the node's human name, as the Record keeps it."""

    seq: int
    node_id: str
    node_name: str


@dataclass(frozen=True, slots=True)
class Claim:
    """A step a node may now run, and when its lease ends unless renewed."""

    run_id: str
    seq: int
    name: str
    kind: str
    needs: frozenset[str]
    not_after: float


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as an operator sees it: what it advertised, whether it drains,
    when it was last seen, and the lease it holds (``run_id`` and its
    ``not_after``, both None when it is free)."""

    node_id: str
    name: str
    caps: frozenset[str]
    draining: bool
    last_seen: float
    run_id: str | None
    not_after: float | None


@dataclass(frozen=True, slots=True)
class StepView:
    """A step as stored; ``node`` is ``""`` until the run is placed;
    ``output`` is what its node reported with it (decoded JSON), if any."""

    seq: int
    name: str
    kind: str
    needs: frozenset[str]
    state: str
    node: str
    output: Any = None


def _step_dict(step: StepView) -> dict[str, Any]:
    """A step in the wire view; ``output`` only once a node reported one."""
    out: dict[str, Any] = {
        "seq": step.seq,
        "name": step.name,
        "state": step.state,
        "node": step.node,
    }
    if step.output is not None:
        out["output"] = step.output
    return out


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as stored. Times are epoch seconds (None until they happen)."""

    run_id: str
    state: str
    reason: str | None
    steps: tuple[StepView, ...]
    warnings: tuple[str, ...]
    created_at: float
    started_at: float | None
    ended_at: float | None
    assigned: tuple[Assigned, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The wire view, the same for submit and get. ``assigned`` appears
        once the run is placed and ``reject`` once it failed."""
        out: dict[str, Any] = {
            "run_id": self.run_id,
            "state": self.state,
            "steps": [_step_dict(s) for s in self.steps],
            "warnings": list(self.warnings),
        }
        if self.assigned:
            out["assigned"] = [
                {"seq": a.seq, "node_id": a.node_id, "node_name": a.node_name}
                for a in self.assigned
            ]
        if self.state == "FAILED" and self.reason:
            out["reject"] = self.reason
        return out
