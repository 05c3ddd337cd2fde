"""priority_fifo: admit pending jobs in priority order, then FIFO, whole jobs onto one node.

Gang placement: a job gets all its devices at once or waits. Among nodes that fit, the one
left with the fewest free devices wins (best fit), which keeps large holes for large jobs.
A job that does not fit does not block smaller ones behind it (backfill); why it waits is
kept as its pending reason.
"""
from __future__ import annotations

from typing import Any

from services.decider.snapshot import JobView, NodeView, Snapshot
from shared.actions import NodeGpus, Start

NAME = "priority_fifo"


def _best_fit(job: JobView, free: dict[str, list[int]], nodes: dict[str, NodeView]) -> str | None:
    fitting = [n for n, devs in free.items() if nodes[n].schedulable and len(devs) >= job.gpus]
    if not fitting:
        return None
    return min(fitting, key=lambda n: (len(free[n]) - job.gpus, n))


def decide(snapshot: Snapshot, config: Any = None) -> tuple[list[Start], dict[str, str]]:
    """Start actions for what fits now, and a pending reason for each job that waits."""
    free = {n.id: sorted(n.free) for n in snapshot.nodes.values()}
    actions: list[Start] = []
    waiting: dict[str, str] = {}
    for position, job in enumerate(snapshot.pending(), start=1):
        node = _best_fit(job, free, snapshot.nodes)
        if node is None:
            most = max(free.items(), key=lambda kv: len(kv[1]), default=(None, []))
            waiting[job.id] = (
                f"no node has {job.gpus} free device(s) (most free: {most[0]} with {len(most[1])})"
                if snapshot.nodes else "no nodes are registered")
            continue
        gpus = tuple(free[node][: job.gpus])
        free[node] = free[node][job.gpus:]
        actions.append(Start(
            job_id=job.id,
            placement=[NodeGpus(node=node, gpus=gpus)],
            resume_from=job.resume_from,
            reason=(f"queue position {position} (priority {job.priority}, then submission order); "
                    f"node {node} has {len(free[node]) + job.gpus} free device(s), {job.gpus} needed: best fit"),
            evidence={"queue_position": position, "priority": job.priority, "gpus_needed": job.gpus,
                      "free_devices": {n: len(v) for n, v in free.items()} | {node: len(free[node]) + job.gpus},
                      "chosen_node": node, "devices": list(gpus)},
        ))
    return actions, waiting
