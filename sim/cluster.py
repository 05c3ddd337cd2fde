"""The simulated cluster: nodes of `gpus_per_node` devices, one NVLink domain per node, two NUMA
nodes, racks of `nodes_per_rack` nodes; and the jobs' state on it, as the executor would record it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property

from services.decider.snapshot import GpuInfo, NodeView
from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import HOLDING_GPUS, JobStatus
from sim.workload import Enrichment, JobSpec

GiB = 2**30
RUNNING = JobStatus.RUNNING  # looked up once: an enum member's lookup costs 0.3 us in Python 3.11


@dataclass(frozen=True)
class Topology:
    gpus: int
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    model: str = "H100"
    memory_gib: int = 80

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} must be a positive multiple of --gpus-per-node {self.gpus_per_node}")

    def node_names(self) -> list[str]:
        return [f"node-{i:04d}" for i in range(self.gpus // self.gpus_per_node)]

    def rack(self, i: int) -> str:
        return f"rack-{i // self.nodes_per_rack:03d}"

    @cached_property  # the same for every node: made once
    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        half = max(1, self.gpus_per_node // 2)
        return tuple(
            GpuInfo(
                index=g,
                model=self.model,
                memory_total_bytes=self.memory_gib * GiB,
                nvlink_domain=0,
                numa_node=g // half,
            )
            for g in range(self.gpus_per_node)
        )

    def node_views(self, used: dict[str, set[int]], now: float) -> dict[str, NodeView]:
        return {name: self.node_view(i, name, used.get(name, ()), now) for i, name in enumerate(self.node_names())}

    def node_view(self, i: int, name: str, used, now: float) -> NodeView:
        devices = tuple(range(self.gpus_per_node))
        return NodeView(
            id=name,
            devices=devices,
            rack=self.rack(i),
            last_seen=now,
            gpus=self.gpu_infos,
            free=tuple(g for g in devices if g not in used),
        )


def device_count(placement: tuple[NodeGpus, ...]) -> int:
    return sum(len(p.gpus) for p in placement)


@dataclass
class SimJob:
    """One job's state, as the executor records it, plus the simulator's truth about its progress."""

    spec: JobSpec
    status: JobStatus = JobStatus.PENDING
    placement: tuple[NodeGpus, ...] = ()
    placement_text: str | None = None
    target: tuple[NodeGpus, ...] | None = None  # where a protocol restarts it (held during its checkpoint)
    restart_on: tuple[NodeGpus, ...] = ()  # the whole placement it restarts on after the checkpoint
    then: str = ""  # after the checkpoint: "requeue" or "restart"
    steps_done: float = 0.0
    rate: float = 0.0  # steps per second while running
    run_step_s: float = 0.0  # the true step time of the attempt running now (1 / rate)
    since: float = 0.0  # when steps_done was last brought up to date
    running_since: float | None = None  # when this attempt began making progress
    generation: int = 0  # events of an older generation are stale
    attempt: int = 0
    first_start: float | None = None
    finished: float | None = None
    resume_from: str | None = None
    stop_checkpoint_step: int = 0
    stop_checkpoint_at: float | None = None
    reported_step: int | None = None
    reported_step_s: float | None = None
    reported_at: float = -math.inf
    decision_id: str | None = None  # the decision whose protocol is under way
    spiked: bool = False  # its one memory spike has begun (sim/memory.py)
    spike_since: float | None = None
    noise: object = None  # its own random stream for step-time noise (simulator.py)
    noise_draws: list = field(default_factory=list)  # drawn from it and not used yet, the next one last
    save_every_steps: int | None = None  # steps between its periodic checkpoints (simulator.py), worked out once
    halvings: int = 0  # restarts with half the micro-batch (a tune with train_overrides), sim/step_model.py
    micro_batch: int | None = None  # as the tunes set it (None: the spec's, unknown to the decider)
    grad_accum: int | None = None
    oom_deaths: int = 0  # attempts that died out of memory (the row's oom_retries)

    @property
    def holds(self) -> bool:
        return self.status in HOLDING_GPUS

    def set_placement(self, placement: tuple[NodeGpus, ...]) -> None:
        self.placement = placement
        self.placement_text = json.dumps([p.model_dump(mode="json") for p in placement]) if placement else None

    def devices(self) -> int:
        return device_count(self.placement)

    def advance(self, now: float) -> None:
        if self.status == RUNNING and self.rate > 0:
            self.steps_done = min(float(self.spec.max_steps), self.steps_done + (now - self.since) * self.rate)
        self.since = now

    def true_step_s(self, e: Enrichment) -> float:
        return self.spec.step_time(self.devices(), len(self.placement), e)

    def finish_in(self) -> float:
        return max(0.0, (self.spec.max_steps - self.steps_done) / self.rate) if self.rate > 0 else math.inf

    def held_devices(self) -> list[NodeGpus]:
        return list(self.placement) + list(self.target or ())
