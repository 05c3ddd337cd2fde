"""Workload enrichment: what a trace lacks and ADC's policies read, drawn from a fixed seed.

Identical for every policy compared in one run (drawn once, before any policy runs), and
documented here because every figure depends on it:
- priority: `high_share` of jobs are `high` and not preemptible; the rest `low`, preemptible.
- elastic bounds: `elastic_share` of the jobs declare min_gpus = max(1, gpus // 2) and
  max_gpus = min(2 x gpus, gpus_per_node) (a job larger than a node does not grow; a 1-GPU job
  may grow to 2: data-parallel fine-tunes keep their global batch by gradient accumulation).
- multi-node: jobs larger than a node must span nodes; `multi_node_share` of the others with 2
  or more GPUs allow it (they may then take fragments on several nodes, at a step-time cost).
- step time: log-normal, median `step_s_median`, sigma `step_s_sigma`, on the requested GPUs;
  `max_steps` = duration / step time (rounded, at least 1). A policy sees `max_steps` at
  submission, and its noisy step time only once the job has run (see simulator.py); never the
  trace's duration.
- scaling: on n devices instead of the requested g a step takes step_s x (g / n) ** `scaling`
  (the global batch is kept, so more devices shorten each step, sub-linearly), times
  `cross_node_penalty` when the placement spans nodes.
- memory: each job holds a steady share of each of its devices, uniform in `memory_range`
  (below oom_protection's 92 % threshold); `spike_share` of the jobs have one spike: once
  the job reaches a uniformly drawn point of its steps (10 % to 90 %), its devices' memory
  climbs to `spike_level` and holds until the job stops; still running `oom_after_s` later,
  the attempt dies out of memory (see sim/memory.py). A policy sees only the memory windows.
These memory draws come after all the others, so adding them changed no other attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.traces import TraceJob


@dataclass(frozen=True)
class Enrichment:
    seed: int = 0
    high_share: float = 0.2
    elastic_share: float = 0.3
    multi_node_share: float = 0.5
    step_s_median: float = 1.0
    step_s_sigma: float = 0.5
    scaling: float = 0.9
    cross_node_penalty: float = 1.1
    memory_range: tuple[float, float] = (0.45, 0.85)
    spike_share: float = 0.05
    spike_level: float = 0.97
    oom_after_s: float = 90.0


@dataclass(frozen=True)
class JobSpec:
    """One job as submitted, plus its hidden truth (`step_s`, the true step time on `gpus`)."""

    index: int
    id: str
    submit_s: float
    gpus: int
    priority: str
    preemptible: bool
    multi_node: bool
    min_gpus: int | None
    max_gpus: int | None
    max_steps: int
    step_s: float
    memory_fraction: float = 0.6  # steady share of each device's memory
    spike_at_step: int | None = None  # the step at which its one memory spike starts (None: never)

    def step_time(self, devices: int, nodes: int, e: Enrichment) -> float:
        """Seconds per optimizer step on `devices` devices over `nodes` nodes (the global batch kept)."""
        t = self.step_s * (self.gpus / devices) ** e.scaling
        return t * (e.cross_node_penalty if nodes > 1 else 1.0)


def enrich(trace: list[TraceJob], gpus_per_node: int, e: Enrichment = Enrichment()) -> list[JobSpec]:
    rng = np.random.default_rng(e.seed)
    n = len(trace)
    # Every draw is made for every job in one vector, so a job's attributes never depend on others'.
    high = rng.random(n) < e.high_share
    elastic = rng.random(n) < e.elastic_share
    multi = rng.random(n) < e.multi_node_share
    step = np.clip(rng.lognormal(np.log(e.step_s_median), e.step_s_sigma, n), 0.05, 60.0)
    memory = rng.uniform(e.memory_range[0], e.memory_range[1], n)
    spikes = rng.random(n) < e.spike_share
    spike_at = rng.uniform(0.1, 0.9, n)
    specs = []
    for i, t in enumerate(trace):
        g = t.gpus
        is_elastic = bool(elastic[i])
        steps = max(1, round(t.duration_s / float(step[i])))
        specs.append(
            JobSpec(
                index=i,
                id=f"j{i:06d}",
                submit_s=t.submit_s,
                gpus=g,
                priority="high" if high[i] else "low",
                preemptible=not high[i],
                multi_node=g > gpus_per_node or (bool(multi[i]) and g >= 2),
                min_gpus=max(1, g // 2) if is_elastic else None,
                max_gpus=(min(2 * g, gpus_per_node) if g <= gpus_per_node else g) if is_elastic else None,
                max_steps=steps,
                step_s=float(step[i]),
                memory_fraction=float(memory[i]),
                spike_at_step=max(1, int(spike_at[i] * steps)) if spikes[i] and steps >= 2 else None,
            )
        )
    return specs
