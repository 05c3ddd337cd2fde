"""oom_protection: act on a job whose GPU memory stays above the threshold, before it crashes.

Design note. Trigger: a GPU held by a running job has had memory use above
`threshold_memory_usage` for `for_s` seconds (hysteresis: it stays hot until it drops below
threshold - `hysteresis`, so noise at the edge neither starts nor resets the window). The
response, in order of what loses least:
1. migrate: the whole job (gang) to free GPUs of the same model on other nodes, idle nodes
   first, each target GPU with at least the job's peak memory use times (1 + headroom) free;
2. scale out (elastic jobs, when `controller.enable_auto_scale`): more GPUs, so each holds a
   smaller share of the batch (the executor keeps the global batch by gradient accumulation);
3. checkpoint and requeue (a preempt), whatever the job's priority: a crash would lose more.
`action` picks the first step tried: migrate (1, 2, 3), scale_out (2, 1, 3), checkpoint_requeue (3).
Evidence: the memory window of every hot GPU of the job.
"""

from __future__ import annotations

import math

from services.decider.cluster_view import Watch
from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput, section_config
from services.decider.snapshot import JobView, Snapshot
from services.decider.telemetry_types import HotGpu
from shared.contracts.actions import Migrate, NodeGpus, Preempt, Scale
from shared.contracts.job_status import JobStatus
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import OomProtection
from shared.infra.config import AdcConfig

NAME = "oom_protection"


class OomSettings(OomProtection):
    auto_scale: bool = True  # controller.enable_auto_scale


def bind(config: AdcConfig) -> OomSettings:
    section = section_config(config, NAME, OomProtection)
    return OomSettings(**section.model_dump(), auto_scale=config.controller.enable_auto_scale)


def _clear_below(config: OomProtection) -> float:
    return max(0.0, config.threshold_memory_usage - config.hysteresis)


def watches(config: OomSettings) -> list[Watch]:
    return [Watch("gpu_memory", config.threshold_memory_usage, config.for_s, _clear_below(config), label=NAME)]


def decide(snapshot: Snapshot, config: OomSettings) -> RuleOutput:
    by_job = hot_jobs(snapshot, config)
    if not by_job:
        return RuleOutput([])
    free = FreeDevices.of(snapshot)
    actions = []
    for job_id, spells in sorted(by_job.items()):
        action = _respond(snapshot, snapshot.job(job_id), spells, free, config)
        if action is not None:
            actions.append(action)
    return RuleOutput(actions)


def hot_jobs(snapshot: Snapshot, config: OomSettings) -> dict[str, list[HotGpu]]:
    """The running jobs with a hot GPU, each with its hot GPUs' spells."""
    telemetry = snapshot.telemetry
    if telemetry is None or not telemetry.gpus():
        return {}  # no GPU has reported: nothing can be hot
    # The hot GPUs first (a vector test over all of them leaves a few), then their owners: the work
    # follows what is hot, not how many jobs run.
    hot = telemetry.hot_gpus(
        "gpu_memory", config.threshold_memory_usage, config.for_s, clear_below=_clear_below(config)
    )
    by_job: dict[str, list[HotGpu]] = {}
    for spell in hot:
        owner = snapshot.owner(spell.node, spell.gpu)
        if owner is not None and owner.status == JobStatus.RUNNING:
            by_job.setdefault(owner.id, []).append(spell)
    return by_job


def situation(spells: list[HotGpu], config: OomSettings) -> tuple[str, dict]:
    """What is hot, in words and as evidence: the start of every response's reason."""
    worst = max(spells, key=lambda s: (s.values[-1], s.duration_s))
    evidence = {
        "hot_gpus": [s.evidence() for s in spells],
        "threshold": config.threshold_memory_usage,
        "for_s": config.for_s,
        "window_satisfied_at": min(s.satisfied_at for s in spells),
    }
    why = (
        f"GPU memory on {', '.join(f'{s.node}:{s.gpu}' for s in spells)} above "
        f"{config.threshold_memory_usage:.0%} for {worst.duration_s:.0f} s (peak {max(worst.values[-worst.spell_len :]):.1%}, "
        f"window {config.for_s:g} s)"
    )
    return why, evidence


def _respond(snapshot: Snapshot, job: JobView, spells: list[HotGpu], free: FreeDevices, config: OomSettings):
    why, evidence = situation(spells, config)
    order = {
        "migrate": ("migrate", "scale_out", "requeue"),
        "scale_out": ("scale_out", "migrate", "requeue"),
        "checkpoint_requeue": ("requeue",),
    }[config.action]
    tried: list[str] = []
    for step in order:
        action = respond(step, snapshot, job, why, evidence, tried, free, config)
        if action is not None:
            return action
    return None


def respond(step: str, snapshot: Snapshot, job: JobView, why: str, evidence: dict, tried: list, free, config):
    """One response (`migrate`, `scale_out` or `requeue`) for the hot job, its devices booked in
    `free`; None, with why not added to `tried`, when it does not apply."""
    if step == "migrate":
        target = _migration_target(snapshot, job, free, config)
        if target is not None:
            free.book(target.placement)
            return Migrate(
                job_id=job.id,
                placement=list(target.placement),
                reason_code=ReasonCode.OOM_MIGRATE,
                reason=f"{why}: migrate before it runs out of memory to {target.describe()}",
                evidence=evidence
                | {
                    "target": [p.model_dump() for p in target.placement],
                    "target_topology": target.evidence(),
                    "tried": list(tried),
                },
            )
        tried.append("migrate: no free GPUs of the same model with enough free memory elsewhere")
    elif step == "scale_out":
        grown = _scale_out(snapshot, job, free, config)
        if grown is not None:
            placement, n = grown
            free.book(placement)
            return Scale(
                job_id=job.id,
                placement=placement,
                reason_code=ReasonCode.OOM_SCALE_OUT,
                reason=f"{why}: scale out from {job.gpu_count} to {n} GPU(s) to spread its memory",
                evidence=evidence | {"from_gpus": job.gpu_count, "to_gpus": n, "tried": list(tried)},
            )
        tried.append(
            "scale out: "
            + (
                "auto scale is off"
                if not config.auto_scale
                else "not elastic or no free GPUs beside it"
                if job.elastic
                else "not elastic"
            )
        )
    else:
        return Preempt(
            job_id=job.id,
            reason_code=ReasonCode.OOM_PREEMPT,
            reason=f"{why}: checkpoint and requeue before the crash",
            evidence=evidence | {"tried": list(tried)},
        )
    return None


def _model_of(snapshot: Snapshot, job: JobView) -> str:
    first = job.placement[0]
    node = snapshot.nodes.get(first.node)
    return node.gpu(first.gpus[0]).model if node else ""


def _migration_target(snapshot: Snapshot, job: JobView, free: FreeDevices, config: OomSettings):
    telemetry = snapshot.telemetry
    peak = 0
    for part in job.placement:
        for g in part.gpus:
            reading = telemetry.gpu_latest(part.node, g)
            peak = max(peak, reading.used_bytes if reading else 0)
    need = peak * (1 + config.headroom)
    model = _model_of(snapshot, job)

    def eligible(node: str, gpu: int) -> bool:
        if snapshot.nodes[node].gpu(gpu).model != model:
            return False
        reading = telemetry.gpu_latest(node, gpu)
        return reading is not None and reading.age_s <= telemetry.stale_after_s and reading.free_bytes >= need

    sources = set(job.nodes())
    idle = {n for n, v in snapshot.nodes.items() if v.idle}
    busy = set(snapshot.nodes) - idle
    # Idle nodes first: nothing else there competes for memory or bandwidth.
    for exclude in (sources | busy, sources):
        target = place(
            job.gpu_count, free, snapshot.nodes, multi_node=job.multi_node, eligible=eligible, exclude=exclude
        )
        if target is not None:
            return target
    return None


def _scale_out(snapshot: Snapshot, job: JobView, free: FreeDevices, config: OomSettings):
    if not (config.auto_scale and job.max_gpus and job.max_gpus > job.gpu_count):
        return None
    hottest = 0.0
    for part in job.placement:
        for g in part.gpus:
            reading = snapshot.telemetry.gpu_latest(part.node, g)
            hottest = max(hottest, reading.fraction if reading else 0.0)
    # Memory per GPU shrinks roughly with the share of the batch each GPU holds.
    target_fraction = max(0.05, config.threshold_memory_usage - 2 * config.hysteresis - config.headroom)
    want = min(job.max_gpus, max(job.gpu_count + 1, math.ceil(job.gpu_count * hottest / target_fraction)))
    if (room := snapshot.gpu_headroom(job)) is not None:  # never past the team's or the user's quota
        want = min(want, job.gpu_count + room)
    model = _model_of(snapshot, job)
    for n in range(want, job.gpu_count, -1):
        extra = n - job.gpu_count
        for part in job.placement:  # beside its current devices first: same node, same domain
            node = snapshot.nodes.get(part.node)
            if node is None:
                continue
            local = [g for g in free.free.get(part.node, []) if node.gpu(g).model == model]
            if len(local) >= extra:
                placement = [
                    p
                    if p.node != part.node
                    else NodeGpus(node=p.node, gpus=tuple(sorted(p.gpus + tuple(local[:extra]))))
                    for p in job.placement
                ]
                return placement, n
        if job.multi_node:
            more = place(
                extra,
                free,
                snapshot.nodes,
                multi_node=True,
                eligible=lambda node, g: snapshot.nodes[node].gpu(g).model == model,
            )
            if more is not None:
                return list(job.placement) + list(more.placement), n
    return None


RULE = Rule(
    name=NAME,
    decide=decide,
    config=OomSettings,
    bind=bind,
    watches=watches,
    precedence=10,
    description="GPU memory above the threshold for a window: migrate, scale out, or checkpoint and requeue",
)
