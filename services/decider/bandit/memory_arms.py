"""Decision point 2, memory pressure: the feasible responses to a hot job, and their features.

The rule's own response (`oom_protection`) is always arm 0. The others are the responses the rule
itself would build, each feasible only as the rule judges it (`oom_protection.respond`, devices
that no other proposal of the pass takes): migrate (a target of the same model with room), scale
out (elastic, auto scale on, free devices beside it, within quota), checkpoint-and-requeue; and,
reusing the tune the executor already runs (a restart in place) with the OOM retry's settings
(`oom_retry.smaller_batch`), half the micro-batch with twice the gradient accumulation, the global
batch kept: not at a micro-batch of 1.

No arm preempts a co-located job: ADC gives each device to one job (a start, a move or a resize
takes only free, unbooked devices), so the memory on a hot device is its own job's, and stopping
a neighbour on the node frees none of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from services.decider.bandit.arms import Taken, job_features
from services.decider.free_devices import FreeDevices
from services.decider.rules.oom_protection import OomSettings, hot_jobs, respond, situation
from services.decider.rules.oom_retry import smaller_batch
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import NodeGpus, Tune
from shared.contracts.reason_codes import ReasonCode

KINDS = ("migrate", "scale_out", "requeue", "halve_batch")
OF_ACTION = {"migrate": "migrate", "scale": "scale_out", "preempt": "requeue", "tune": "halve_batch"}


@dataclass(frozen=True)
class MemoryArm:
    kind: str  # one of KINDS
    action: Any
    features: dict[str, float]


def memory_arms(job: JobView, rule_action, snapshot: Snapshot, settings: OomSettings, taken: Taken):
    """The arms for the rule's response to a hot job: its own first, then each other feasible one;
    None when there is no other."""
    first = OF_ACTION.get(rule_action.action)
    spells = hot_jobs(snapshot, settings).get(job.id)
    if first is None or not spells:
        return None
    why, evidence = situation(spells, settings)
    free = FreeDevices.of(snapshot)
    own = {(p.node, g) for p in getattr(rule_action, "placement", None) or () for g in p.gpus}
    others: dict[str, list[int]] = {}
    for node, g in taken - own:
        others.setdefault(node, []).append(g)
    free.book([NodeGpus(node=n, gpus=tuple(sorted(gs))) for n, gs in others.items()])
    arms = [MemoryArm(first, rule_action, _features(first, job, rule_action))]
    for kind in KINDS:
        if kind == first:
            continue
        if kind == "halve_batch":
            action = _halve(job, why, evidence)
        else:
            action = respond(kind, snapshot, job, why, evidence, [], free.copy(), settings)
        if action is not None:
            arms.append(MemoryArm(kind, action, _features(kind, job, action)))
    return arms if len(arms) > 1 else None


def memory_context(job: JobView, snapshot: Snapshot) -> dict[str, float]:
    """The job and the cluster as the memory choice sees them: the placement context, the queue."""
    pending = sum(j.gpus for j in snapshot.pending())
    return job_features(job, snapshot) | {"log2_pending_gpus": math.log2(1 + pending)}


def _halve(job: JobView, why: str, evidence: dict):
    settings = smaller_batch(job)
    if "per_device_train_batch_size" not in settings:
        return None  # a micro-batch of 1: nothing to halve
    micro, accum = settings["per_device_train_batch_size"], settings["gradient_accumulation_steps"]
    return Tune(
        job_id=job.id,
        train_overrides=settings,
        reason_code=ReasonCode.OOM_SMALLER_BATCH,
        reason=f"{why}: restart in place with micro-batch {micro}, gradient accumulation {accum} (global batch kept)",
        evidence=evidence | {"train_overrides": settings},
    )


def _features(kind: str, job: JobView, action) -> dict[str, float]:
    features = {k: float(k == kind) for k in KINDS}
    placement = getattr(action, "placement", None) or ()
    devices = sum(len(p.gpus) for p in placement) or job.gpu_count or job.gpus
    features["log2_devices_ratio"] = math.log2(max(1, devices) / max(1, job.gpu_count or job.gpus))
    features["nodes"] = float(len(placement) or len(job.placement))
    return features
