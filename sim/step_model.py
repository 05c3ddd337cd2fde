"""Placement quality in the simulator (`SimOptions.step_model`, off by default): what a placement
does to a job's step time beyond the device count, the same for every policy compared.

When on, an attempt's step time (sim/workload.py: `step x (g / n) ** 0.9`, x 1.1 across nodes) is
multiplied, when the attempt begins to run, by:
- co-location: `1 + colocation x (devices other jobs hold on its nodes / devices of those nodes)`
  for a job of two or more devices (its collectives share the host's PCIe switches and NICs with
  its neighbours' traffic), half of that for a one-device job (no collectives; host memory
  bandwidth, PCIe and data loading are still shared);
- `numa_penalty` when its devices on a node sit on both NUMA nodes;
- `rack_penalty` when it spans racks (on top of the cross-node factor);
- `slow_factor` when any of its nodes is one of `slow_nodes`: a node whose devices run slower than
  the others' for a cause the decider does not see (throttled clocks, a degraded PCIe link or
  cooling); a gang runs at its slowest member's pace. No node is slow unless a run names some.
The factor is fixed for the attempt (as the simulator fixes its device count): a neighbour that
starts or leaves later does not change it. Off, no factor is applied at all, so every figure
and digest of the simulator without it is unchanged.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

# A restart with half the micro-batch and twice the gradient accumulation (oom_protection's
# halve-the-batch response, the bandit's memory arm) keeps the global batch, so the loss curve, and
# runs twice the micro-steps of half the size: per optimizer step, the same arithmetic at lower
# device utilisation plus the per-micro-step overheads (kernel launches, the data loader, the
# gradient accumulation). Step time times this factor for the rest of the job, per halving, whether
# the placement model is on or not, for every policy. Its memory: weights, gradients and optimizer
# state stay, activations halve; the steady share of each device times `HALVED_BATCH_MEMORY`.
HALVED_BATCH_STEP = 1.2
HALVED_BATCH_MEMORY = 0.75


@dataclass(frozen=True)
class StepModel:
    colocation: float = 0.4
    single_device_share: float = 0.5  # of the co-location slowdown a one-device job feels
    numa_penalty: float = 1.05
    rack_penalty: float = 1.15
    slow_nodes: frozenset[str] = frozenset()
    slow_factor: float = 1.0

    def factor(self, placement, holders: dict[str, dict[int, int]], gpus_per_node: int, numa_of, rack_of) -> float:
        """The slowdown of an attempt on `placement`, given who holds which device (`holders`: node ->
        device -> holders, the job's own devices included or not)."""
        devices = sum(len(p.gpus) for p in placement)
        factor = 1.0
        others = sum(sum(1 for g in holders.get(p.node, ()) if g not in p.gpus) for p in placement)
        share = 1.0 if devices >= 2 else self.single_device_share
        factor *= 1.0 + share * self.colocation * others / (gpus_per_node * max(1, len(placement)))
        if any(len({numa_of(g) for g in p.gpus}) > 1 for p in placement):
            factor *= self.numa_penalty
        if len({rack_of(p.node) for p in placement}) > 1:
            factor *= self.rack_penalty
        if any(p.node in self.slow_nodes for p in placement):
            factor *= self.slow_factor
        return factor

    def with_slow_nodes(self, names: list[str], share: float, factor: float, seed: int) -> StepModel:
        """This model with `share` of `names` (at least one when `share` > 0), drawn by `seed`, slow by `factor`."""
        if share <= 0:
            return self
        count = max(1, round(share * len(names)))
        return replace(self, slow_nodes=frozenset(random.Random(seed).sample(names, count)), slow_factor=factor)
