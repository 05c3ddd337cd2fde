"""Simulated executor and workers: decisions carried out with the protocol costs of the real ones.

The live executor starts a job (first start: the trace's duration already includes the launch),
and moves a running one by checkpoint-then-stop at a step boundary, then a restart:
- preempt: checkpoint (`checkpoint_s`, devices held), then back to the queue with `resume_from`;
- migrate, scale, tune: checkpoint on the old devices (the target's devices held too), then a
  restart on the new placement (`restart_s`, 30 s by default as in the Pollux simulator) before
  the trainer makes progress again. A tune that halves the micro-batch (its `train_overrides`)
  restarts in place, and its step time is `HALVED_BATCH_STEP` times longer from then on and its
  memory share `HALVED_BATCH_MEMORY` times smaller (sim/step_model.py).
A restart after a preemption costs `restart_s` as well. Nothing is lost beyond these costs
(checkpoints are taken at the stop), and nothing is free: the GPU-seconds spent checkpointing
and restarting are counted. An attempt that dies out of memory (a spike nobody acted on, see
sim/memory.py) loses its progress since its last checkpoint (the one it stopped on, or the
trainer's periodic one every `save_every_s`), and goes back to the queue to resume from it, as
the live executor requeues an out-of-memory attempt; its row records no outcome, so the decider's
`oom_retry` rule (which retries or fails such jobs live) never acts here and admission restarts it as it
was. A decision the executor cannot carry out (its job is no longer in the state it needs, or a `fail`,
which no rule proposes here) is refused, as the live executor refuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shared.contracts.actions import NodeGpus
from shared.contracts.job_status import JobStatus
from sim.cluster import SimJob, device_count
from sim.step_model import HALVED_BATCH_STEP
from sim.workload import Enrichment


@dataclass(frozen=True)
class ProtocolCosts:
    checkpoint_s: float = 20.0
    restart_s: float = 30.0


@dataclass
class Counters:
    starts: int = 0
    preemptions: int = 0
    migrations: int = 0
    resizes: int = 0
    tunes: int = 0
    refused: int = 0
    checkpoint_gpu_s: float = 0.0
    restart_gpu_s: float = 0.0
    memory_spikes: int = 0
    oom_crashes: int = 0
    oom_lost_gpu_s: float = 0.0  # progress thrown away by out-of-memory deaths
    oom_actions: dict[str, int] = field(default_factory=dict)  # oom_protection's decisions, by action


class SimExecutor:
    """Applies decisions to jobs; `schedule(t, job, kind)` is how it asks for its next step."""

    def __init__(self, costs: ProtocolCosts, enrichment: Enrichment, schedule, save_every_s: float = 1800.0) -> None:
        self.costs = costs
        self.save_every_s = save_every_s
        self.enrichment = enrichment
        self.schedule = schedule
        self.counters = Counters()
        self.states: dict[str, str] = {}  # decision id -> done | refused, as the decisions table says
        self.slowdown = None  # job -> its placement's step-time factor (sim/step_model.py), when that is on

    def apply(self, job: SimJob, action, decision_id: str, now: float) -> None:
        kind = action.action
        if kind == "start" and job.status == JobStatus.PENDING:
            self._start(job, tuple(action.placement), now)
            self.states[decision_id] = "done"
        elif kind in ("preempt", "migrate", "scale", "tune") and job.status == JobStatus.RUNNING:
            job.advance(now)
            target = tuple(action.placement) if kind in ("migrate", "scale") else job.placement
            if kind == "migrate" and not target:
                self.states[decision_id] = "refused"  # a manual "anywhere" move; rules always name a target
                self.counters.refused += 1
                return
            job.status, job.rate = JobStatus.CHECKPOINTING, 0.0
            job.then = "requeue" if kind == "preempt" else "restart"
            job.target = None if kind in ("preempt", "tune") else _new_devices(job.placement, target)
            job.decision_id = decision_id
            job.generation += 1
            self.counters.checkpoint_gpu_s += self.costs.checkpoint_s * job.devices()
            name = {"preempt": "preemptions", "migrate": "migrations", "scale": "resizes", "tune": "tunes"}[kind]
            setattr(self.counters, name, getattr(self.counters, name) + 1)
            job.restart_on = target
            overrides = getattr(action, "train_overrides", None) or {}
            if "per_device_train_batch_size" in overrides:  # the restart runs with half the micro-batch
                job.halvings += 1
                job.micro_batch = overrides["per_device_train_batch_size"]
                job.grad_accum = overrides.get("gradient_accumulation_steps")
            self.schedule(now + self.costs.checkpoint_s, job, "checkpointed")
        else:
            self.states[decision_id] = "refused"
            self.counters.refused += 1

    def _start(self, job: SimJob, placement: tuple[NodeGpus, ...], now: float) -> None:
        job.set_placement(placement)
        job.attempt += 1
        job.generation += 1
        self.counters.starts += 1
        if job.first_start is None:
            job.first_start = now
        if job.attempt == 1:
            self._run(job, now)
            return
        job.status, job.rate, job.since = JobStatus.STARTING, 0.0, now
        self.counters.restart_gpu_s += self.costs.restart_s * device_count(placement)
        self.schedule(now + self.costs.restart_s, job, "started")

    def _run(self, job: SimJob, now: float) -> None:
        job.status, job.since, job.running_since = JobStatus.RUNNING, now, now
        job.run_step_s = job.true_step_s(self.enrichment)  # its placement is fixed while it runs
        if self.slowdown is not None:
            job.run_step_s *= self.slowdown(job)
        if job.halvings:
            job.run_step_s *= HALVED_BATCH_STEP**job.halvings
        job.rate = 1.0 / job.run_step_s
        self.schedule(now + job.finish_in(), job, "finished")
        spike = job.spec.spike_at_step
        if spike is not None and not job.spiked and job.steps_done < spike:
            self.schedule(now + (spike - job.steps_done) / job.rate, job, "spike")

    def out_of_memory(self, job: SimJob, now: float) -> None:
        """The attempt dies: back to the queue from its last checkpoint, the progress since then lost."""
        job.advance(now)
        every = max(1, round(self.save_every_s / job.spec.step_s))
        kept = max(job.stop_checkpoint_step, math.floor(job.steps_done) // every * every)
        self.counters.oom_crashes += 1
        job.oom_deaths += 1
        self.counters.oom_lost_gpu_s += (job.steps_done - kept) * job.true_step_s(self.enrichment) * job.devices()
        job.steps_done = float(kept)
        job.stop_checkpoint_step = kept
        job.resume_from = f"checkpoint-{kept}" if kept else job.resume_from
        job.status, job.rate, job.target = JobStatus.PENDING, 0.0, None
        job.generation += 1
        job.set_placement(())

    def step_done(self, job: SimJob, kind: str, now: float) -> bool:
        """The next step of a job's protocol or run; True when the job finished."""
        if kind == "started":
            self._run(job, now)
        elif kind == "checkpointed":
            job.stop_checkpoint_step = math.floor(job.steps_done)
            job.steps_done = float(job.stop_checkpoint_step)  # resumes at the step boundary it stopped on
            job.stop_checkpoint_at, job.resume_from = now, f"checkpoint-{job.stop_checkpoint_step}"
            self.states[job.decision_id] = "done"
            if job.then == "requeue":
                job.status, job.target = JobStatus.PENDING, None
                job.set_placement(())
            else:
                placement = job.restart_on
                job.target = None
                job.status = JobStatus.PENDING
                self._start(job, placement, now)
        elif kind == "finished":
            job.advance(now)
            job.status, job.rate, job.finished = JobStatus.SUCCEEDED, 0.0, now
            job.set_placement(())
            return True
        return False


def _new_devices(old: tuple[NodeGpus, ...], target: tuple[NodeGpus, ...]) -> tuple[NodeGpus, ...]:
    """The devices of `target` the job does not hold already (held for it while it checkpoints)."""
    mine = {(p.node, g) for p in old for g in p.gpus}
    parts = [NodeGpus(node=p.node, gpus=tuple(g for g in p.gpus if (p.node, g) not in mine)) for p in target]
    return tuple(p for p in parts if p.gpus)
