"""oom_retry: a job whose last attempt ran out of memory is retried so that it fits this time, or,
with its retries spent, failed.

Design note. The executor requeues every out-of-memory attempt to resume from the newest complete
checkpoint its worker reported, recording the outcome and counting the exit (`oom_retries`); what
happens next is decided here, each retry or give-up its own audited decision. Out of memory more
than `max_retries` times, the job fails (`Fail`, `oom_retry.give_up`) with the count and the key
in its reason. Otherwise the retry is fitted: first a device with more free memory than the last
attempt's peak (times `memory_margin`), on a schedulable node; else the admission plan's
placement with half the micro-batch and twice the gradient accumulation, so the global batch (and
with it the loss curve) is kept, which the trainer's resize supports; with a micro-batch of 1
already, gradient checkpointing is switched on if the job had switched it off (LLaMA-Factory has
it on by default). With nothing left to shrink the retry runs as it was, saying so: the memory may
have been taken by something that has gone since, and `max_retries` bounds the tries. It takes
precedence over `priority_fifo` for these jobs only and admits them in the same queue order.
"""

from __future__ import annotations

from services.decider.admission_plan import plan_admission
from services.decider.free_devices import FreeDevices
from services.decider.placement import place
from services.decider.plugin import Rule, RuleOutput
from services.decider.snapshot import JobView, Snapshot
from shared.contracts.actions import Fail, Start
from shared.contracts.outcomes import ExitOutcome
from shared.contracts.reason_codes import ReasonCode
from shared.contracts.strategies import OomRetry

NAME = "oom_retry"
# What a train section that names neither gets: Hugging Face TrainingArguments' defaults, kept by LLaMA-Factory.
DEFAULT_MICRO_BATCH = 8
DEFAULT_GRAD_ACCUM = 1


def smaller_batch(job: JobView) -> dict[str, object]:
    """Train settings that hold less at once and keep the global batch; empty if nothing is left to shrink."""
    micro = job.micro_batch or DEFAULT_MICRO_BATCH
    accum = job.grad_accum or DEFAULT_GRAD_ACCUM
    if micro >= 2:
        half = micro // 2
        if micro % half == 0:
            return {"per_device_train_batch_size": half, "gradient_accumulation_steps": accum * (micro // half)}
    if not job.gradient_checkpointing:
        return {"gradient_checkpointing": True, "disable_gradient_checkpointing": False}
    return {}


def give_up(job: JobView, config: OomRetry) -> Fail:
    retries = job.oom_retries - 1  # the first out-of-memory exit is no retry
    peak = job.peak_memory_bytes or 0
    return Fail(
        job_id=job.id,
        reason_code=ReasonCode.OOM_RETRY_GIVE_UP,
        reason=f"ran out of memory {job.oom_retries} times"
        + (f", last at a peak of {peak / 2**30:.2f} GiB" if peak else "")
        + f": failed after {retries} retr{'y' if retries == 1 else 'ies'}"
        f" (strategies.oom_retry.max_retries is {config.max_retries})",
        evidence={"oom_retries": job.oom_retries, "max_retries": config.max_retries, "peak_memory_bytes": peak},
    )


def decide(snapshot: Snapshot, config: OomRetry) -> RuleOutput:
    out_of_memory = ExitOutcome.OOM  # looked up once, not per pending job
    oom = {j.id: j for j in snapshot.pending() if j.last_outcome == out_of_memory}
    if not oom:
        return RuleOutput([])
    actions: list[Fail | Start] = [give_up(j, config) for j in oom.values() if j.oom_retries > config.max_retries]
    retried = {job_id for job_id, j in oom.items() if j.oom_retries <= config.max_retries}
    if not retried:
        return RuleOutput(actions)
    telemetry = snapshot.telemetry
    free = FreeDevices.of(snapshot)
    for admitted in plan_admission(snapshot).admitted:
        job = admitted.job
        if job.id not in retried:
            continue
        peak = job.peak_memory_bytes or 0
        story = (
            "its last attempt ran out of memory"
            + (f" at a peak of {peak / 2**30:.2f} GiB" if peak else "")
            + f"; retry {job.oom_retries} of {config.max_retries}, resuming from {job.resume_from or 'the start'}"
        )
        roomy = None
        if peak and telemetry is not None:

            def has_room(node: str, gpu: int) -> bool:
                reading = telemetry.gpu_latest(node, gpu)
                return reading is not None and reading.free_bytes >= peak * config.memory_margin  # noqa: B023

            roomy = place(job.gpus, free, snapshot.nodes, multi_node=job.multi_node, eligible=has_room)
        if roomy is not None:
            first = roomy.placement[0]
            reading = telemetry.gpu_latest(first.node, first.gpus[0])
            actions.append(
                Start(
                    job_id=job.id,
                    placement=list(roomy.placement),
                    resume_from=job.resume_from,
                    reason_code=ReasonCode.OOM_RETRY_ROOMY_DEVICE,
                    reason=f"{story} on {first.node}:{list(first.gpus)}, which has {reading.free_bytes / 2**30:.2f} GiB free",
                    evidence={
                        "peak_memory_bytes": peak,
                        "free_bytes": reading.free_bytes,
                        "memory_margin": config.memory_margin,
                        "remedy": "more_memory",
                    },
                )
            )
        else:
            settings = smaller_batch(job)
            if "per_device_train_batch_size" in settings:
                how = (
                    f"micro-batch {job.micro_batch} -> {settings['per_device_train_batch_size']}, gradient accumulation "
                    f"{job.grad_accum or 1} -> {settings['gradient_accumulation_steps']} (global batch kept)"
                )
            elif settings:
                how = "gradient checkpointing on (micro-batch is 1)"
            else:
                how = (
                    "nothing left to shrink (micro-batch 1, gradient checkpointing on): retrying as it was, "
                    "in case what held the memory has gone"
                )
            actions.append(
                Start(
                    job_id=job.id,
                    placement=list(admitted.choice.placement),
                    resume_from=job.resume_from,
                    train_overrides=settings,
                    reason_code=ReasonCode.OOM_RETRY_SMALLER_BATCH,
                    reason=f"{story}; no device has more free memory: {how}",
                    evidence={
                        "peak_memory_bytes": peak,
                        "train_overrides": settings,
                        "remedy": "smaller_batch" if settings else "none",
                    },
                )
            )
        free.book(actions[-1].placement)
    return RuleOutput(actions)


RULE = Rule(
    name=NAME,
    decide=decide,
    config=OomRetry,
    precedence=15,
    description="retry an out-of-memory job on a roomier device, else with a smaller micro-batch; fail it past its retries",
)
