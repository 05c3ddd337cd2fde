"""One comparison: a trace window, enriched once, replayed under each policy side by side."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.infra.config import AdcConfig, load_config
from sim.cluster import Topology
from sim.metrics import figures
from sim.policies import DEFAULT_POLICIES, policy_config
from sim.simulator import SimOptions, SimResult, Simulation
from sim.traces import read_trace, window
from sim.workload import Enrichment, enrich


@dataclass(frozen=True)
class Comparison:
    trace: str
    gpus: int
    gpus_per_node: int = 8
    start_s: float = 0.0
    days: float | None = None
    policies: tuple[str, ...] = tuple(DEFAULT_POLICIES)
    seed: int = 0
    config: AdcConfig | None = None
    options: SimOptions = field(default_factory=SimOptions)


def compare(c: Comparison) -> tuple[list[SimResult], list[dict]]:
    base = c.config or load_config()
    configs = {name: policy_config(base, name) for name in c.policies}  # every policy checked before any runs
    topology = Topology(c.gpus, c.gpus_per_node)
    jobs = window(read_trace(c.trace, c.seed), c.start_s, c.days)
    enrichment = Enrichment(seed=c.seed)
    specs = enrich(jobs, c.gpus_per_node, enrichment)
    options = SimOptions(**{**c.options.__dict__, "enrichment": enrichment})
    results = [Simulation(specs, topology, configs[name], name, options).run() for name in c.policies]
    return results, [figures(r) for r in results]
