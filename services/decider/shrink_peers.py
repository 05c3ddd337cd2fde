"""Which running peers a waiting job may shrink, and what shrinking one to its floor frees
(elastic_scale's shrink; kept apart so the rule reads as its decisions)."""

from __future__ import annotations

import bisect

from services.decider.admission_order import Keys
from services.decider.placement import without
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.strategies import QueueOrder


def floor_yield(peer: JobView) -> list[tuple[str, int]]:
    """What shrinking the peer to its floor frees on each node. It rests on the view's placement and
    bounds alone, so it is kept on the view (views outlive passes while their job does not change)."""
    known = peer.__dict__.get("_floor_yield")
    if known is None:
        known = [(part.node, len(part.gpus)) for part in without(peer.placement, peer.shrunk_to(peer.floor))]
        object.__setattr__(peer, "_floor_yield", known)
    return known


class ShrinkPeers:
    """Which running peers of its level a waiting job may take devices from: all of them, unless the
    queue order is shortest_remaining, where only peers with more estimated work left (a shrink slows
    the peer down; doing that for a longer job raises the average completion time). Peers are ranked
    once a pass by that work, so a waiting job's peers are a prefix of its level's ranking."""

    def __init__(self, snapshot: Snapshot, queue: QueueOrder, peers: list[JobView]) -> None:
        self.ordered = queue.enabled and queue.method == "shortest_remaining"
        self.keys = Keys(queue, snapshot.jobs)  # the typical step time only if a job without one is asked about
        self.by_rank: dict[int, list[JobView]] = {}
        for j in peers:
            self.by_rank.setdefault(j.priority_rank, []).append(j)
        self.less: dict[int, list[float]] = {}  # per level, minus each ranked peer's remaining work, ascending
        if self.ordered:
            for rank, level in self.by_rank.items():
                work = [self.remaining(j) for j in level]  # once per peer, then sorted by it
                order = sorted(
                    range(len(level)), key=work.__getitem__, reverse=True
                )  # stable: ties keep the running order
                level[:] = [level[i] for i in order]
                self.less[rank] = [-work[i] for i in order]

    def remaining(self, job: JobView) -> float:
        return self.keys.remaining(job)

    def count(self, waiting: JobView) -> int:
        """How many of its level's ranked peers (`by_rank`, in order) the waiting job may take from."""
        level = self.by_rank.get(waiting.priority_rank)
        if not level:
            return 0
        if not self.ordered:
            return len(level)
        return bisect.bisect_left(self.less[waiting.priority_rank], -self.remaining(waiting))  # remaining > its own
