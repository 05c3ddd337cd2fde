"""comm_jitter: re-place or re-tune a job whose communication latency is erratic.

Design note. Collectors report, per job, communication latency samples (microseconds) from
each node it runs on. Over the last `window_s` seconds, with at least `min_samples` samples,
the rule takes the standard deviation of all of them together: it is high when one node is
slower than the others (spread across nodes) and when latency jitters on a node. Above
`stddev_us`:
1. if free devices (plus the job's own) allow a strictly tighter placement of the same size
   and GPU model (fewer racks, then fewer nodes, then fewer NVLink domains), migrate there;
2. else tune: restart with `tune_env` NCCL settings (ring algorithm, simple protocol, more
   channels by default), which trade peak bandwidth for steadier collectives.
The cooldown (default 15 min) keeps a job from being tuned over and over.
"""

from __future__ import annotations

import numpy as np

from services.decider.free_devices import FreeDevices
from services.decider.placement import place, tightness
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import Snapshot
from shared.contracts.actions import Migrate, Tune
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import CommJitter

NAME = "comm_jitter"


def decide(snapshot: Snapshot, config: CommJitter) -> RuleOutput:
    if snapshot.telemetry is None:
        return RuleOutput([])
    reporting = snapshot.telemetry.comm_latency_jobs()
    if not reporting:
        return RuleOutput([])  # no job has samples: nothing to walk
    free = FreeDevices.of(snapshot)
    actions = []
    for job in snapshot.running():
        if job.id not in reporting:
            continue
        samples = snapshot.telemetry.comm_latency(job.id, config.window_s)
        pooled = np.concatenate(list(samples.values())) if samples else np.empty(0)
        if len(pooled) < config.min_samples:
            continue
        stddev = float(np.std(pooled))
        if stddev <= config.stddev_us:
            continue
        evidence = {
            "stddev_us": round(stddev, 2),
            "threshold_us": config.stddev_us,
            "window_s": config.window_s,
            "samples": int(len(pooled)),
            "mean_us": round(float(np.mean(pooled)), 2),
            "per_node": {
                n: {
                    "mean_us": round(float(np.mean(v)), 2),
                    "stddev_us": round(float(np.std(v)), 2),
                    "samples": int(len(v)),
                    "recent": [round(float(x), 1) for x in v[-10:]],
                }
                for n, v in samples.items()
            },
        }
        why = (
            f"communication latency stddev {stddev:.0f} us over {len(pooled)} samples on "
            f"{', '.join(sorted(samples))} exceeds {config.stddev_us:g} us (window {config.window_s:g} s)"
        )
        current = tightness(job.placement, snapshot.nodes)
        evidence["current_topology"] = dict(zip(("racks", "nodes", "nvlink_domains"), current))
        trial = free.copy()
        trial.release(job.placement)
        first = job.placement[0]
        model = snapshot.nodes[first.node].gpu(first.gpus[0]).model if first.node in snapshot.nodes else ""
        target = place(
            job.gpu_count,
            trial,
            snapshot.nodes,
            multi_node=job.multi_node,
            eligible=lambda n, g: snapshot.nodes[n].gpu(g).model == model,  # noqa: B023 (place calls it at once)
        )
        if target is not None and (target.racks, target.nodes, target.domains) < current:
            free.book(target.placement)
            actions.append(
                Migrate(
                    job_id=job.id,
                    placement=list(target.placement),
                    reason_code=ReasonCode.COMM_JITTER_MIGRATE,
                    reason=f"{why}: re-place it on a tighter topology, {target.describe()}",
                    evidence=evidence | {"target_topology": target.evidence()},
                )
            )
        else:
            actions.append(
                Tune(
                    job_id=job.id,
                    env=dict(config.tune_env),
                    reason_code=ReasonCode.COMM_JITTER_TUNE,
                    reason=f"{why}; no tighter placement is free: tune NCCL ({', '.join(config.tune_env)})",
                    evidence=evidence,
                )
            )
    return RuleOutput(actions)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=CommJitter,
    precedence=60,
    description="communication latency stddev above stddev_us: re-place tighter, or tune NCCL",
)
