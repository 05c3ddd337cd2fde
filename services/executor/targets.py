"""Which free devices a moved job lands on when a manual action names no target.

Mechanical, not a policy: the same best-fit as the decider's first rule (the node left with
the fewest free devices that still fits the whole job), so a manual move or a drain never
fragments the cluster more than the decider would.
"""
from __future__ import annotations

from shared.actions import NodeGpus


def pick_target(free: dict[str, list[int]], gpus: int, exclude: set[str] = frozenset()) -> list[NodeGpus] | None:
    fitting = [n for n, devices in free.items() if n not in exclude and len(devices) >= gpus]
    if not fitting:
        return None
    node = min(fitting, key=lambda n: (len(free[n]) - gpus, n))
    return [NodeGpus(node=node, gpus=tuple(sorted(free[node])[:gpus]))]
