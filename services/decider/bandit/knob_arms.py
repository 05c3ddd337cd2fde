"""Decision point 3, queue knobs: the settings of the queue rules the bandit chooses among for a
window, the load regime it chooses from, and the overlay the rules read while a setting holds.

Arms (at most five), each a change to the configured values of two rules:
- `configured`: the operator's own values (always arm 0: the rules' setting);
- `no_preempt`: `queue_order.preempt` false (no waiting job displaces a running one of its level);
- `eager_preempt`: `queue_order.preempt_ratio` halved (at least 1): displace for less;
- `cautious_preempt`: `queue_order.preempt_ratio` doubled: displace only for much more;
- `no_grow`: `elastic_scale.grow_levels` empty (elastic growth off; shrinking for waiting jobs stays).
An arm that would change nothing the rules read (the preemption knobs with `queue_order` off or
fifo, growth with `elastic_scale` off, a value already configured) is left out.

The overlay is a copy of the config in force with the arm's values in those two sections: the
operator's config is never rewritten, and a reload of it is what arm 0 reads at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from services.decider.snapshot import Snapshot
from shared.infra.config import AdcConfig

NAMES = ("configured", "no_preempt", "eager_preempt", "cautious_preempt", "no_grow")


@dataclass(frozen=True)
class KnobArm:
    name: str  # one of NAMES
    queue_order: dict[str, Any] = field(default_factory=dict)
    elastic_scale: dict[str, Any] = field(default_factory=dict)

    @property
    def features(self) -> dict[str, float]:
        return {n: float(n == self.name) for n in NAMES}

    @property
    def settings(self) -> dict[str, dict[str, Any]]:
        """What the arm sets, per rule section (empty for arm 0)."""
        return {k: v for k, v in (("queue_order", self.queue_order), ("elastic_scale", self.elastic_scale)) if v}


def knob_arms(config: AdcConfig) -> list[KnobArm]:
    """The arms for the config in force: the configured values first, then each alternative that
    changes what an enabled rule reads."""
    queue, elastic = config.strategies.queue_order, config.strategies.elastic_scale
    arms = [KnobArm("configured")]
    if queue.enabled and queue.method != "fifo":
        ratio = queue.preempt_ratio
        if queue.preempt:
            arms.append(KnobArm("no_preempt", queue_order={"preempt": False}))
        for name, value in (("eager_preempt", max(1.0, ratio / 2)), ("cautious_preempt", ratio * 2)):
            if value != ratio or not queue.preempt:
                arms.append(KnobArm(name, queue_order={"preempt": True, "preempt_ratio": value}))
    if elastic.enabled and elastic.grow_levels != []:
        arms.append(KnobArm("no_grow", elastic_scale={"grow_levels": []}))
    return arms


def overlay(config: AdcConfig, arm: KnobArm) -> AdcConfig:
    """The config the rules read while `arm` holds: the arm's values over the config in force."""
    if not arm.settings:
        return config
    strategies = config.strategies
    update = {name: getattr(strategies, name).model_copy(update=values) for name, values in arm.settings.items()}
    return config.model_copy(update={"strategies": strategies.model_copy(update=update)})


def cluster_gpus(snapshot: Snapshot) -> int:
    return sum(len(n.devices) for n in snapshot.nodes.values() if n.schedulable)


def waiting_gpus(snapshot: Snapshot) -> int:
    """The devices the pending jobs ask for."""
    return sum(j.gpus for j in snapshot.pending())


def knob_context(snapshot: Snapshot) -> dict[str, float]:
    """The load regime: the queue and its demand against the free devices, utilization, and how much
    of what runs the knobs can move (elastic, preemptible)."""
    total = max(1, cluster_gpus(snapshot))
    free = sum(len(n.free) for n in snapshot.nodes.values() if n.schedulable)
    pending, running = snapshot.pending(), snapshot.running()
    demand = sum(j.gpus for j in pending)
    ran = max(1, len(running))
    return {
        "log2_pending_jobs": math.log2(1 + len(pending)),
        "pending_demand": demand / total,
        "demand_over_free": min(8.0, demand / max(1, free)),
        "utilization": 1.0 - free / total,
        "elastic_share": sum(1 for j in running if j.elastic) / ran,
        "preemptible_share": sum(1 for j in running if j.preemptible) / ran,
    }
