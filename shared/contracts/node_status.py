"""A node's lifecycle as the executor records it: one transition table.

`ready` takes work; `cordoned` takes none; `draining` takes none and the decider's `drain` rule
moves its jobs off, then cordons it; `lost` sent no heartbeat for `worker.node_timeout` and is
`ready` again when heartbeats return. Migration 008 holds the same states as a CHECK.
"""

from __future__ import annotations

from enum import StrEnum


class NodeStatus(StrEnum):
    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    LOST = "lost"


N = NodeStatus
NODE_TRANSITIONS: dict[NodeStatus, frozenset[NodeStatus]] = {
    N.READY: frozenset({N.CORDONED, N.DRAINING, N.LOST}),
    N.CORDONED: frozenset({N.READY, N.DRAINING, N.LOST}),
    N.DRAINING: frozenset({N.CORDONED, N.READY, N.LOST}),  # ready: uncordoned mid-drain
    N.LOST: frozenset({N.READY}),
}


class InvalidNodeTransition(ValueError):
    def __init__(self, node: str, old: NodeStatus, new: NodeStatus) -> None:
        allowed = ", ".join(sorted(NODE_TRANSITIONS[old]))
        super().__init__(f"node {node}: {old} -> {new} is not allowed (from {old}: {allowed})")
        self.old, self.new = old, new


def sources_of(new: NodeStatus) -> frozenset[NodeStatus]:
    """The statuses a node may move to `new` from."""
    return frozenset(s for s, targets in NODE_TRANSITIONS.items() if new in targets)
