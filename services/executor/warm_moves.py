"""A move's target made ready before its source stops: prepare, then switch.

For a migrate or scale whose target devices are not the source's, the protocol's first step,
`preparing`, has the target's workers start the next attempt's trainer as a warm trainer
(worker/trainer/warm_start.py): imports done, dataset loaded from the job's tokenized cache,
model built from the base weights, waiting. Only then is the source asked to checkpoint-stop;
the `go` that follows names the checkpoint, and the target loads it at once. A target that fails
to get ready ends the move before anything was asked of the source: it trains on, untouched.

Where the target shares devices with the source (a tune restarts in place; a scale may keep the
source's devices), a trainer built there would compete with the running one for the device's
memory, so that move stays cold: stop first, then start. PPO's trainer does not train through
transformers' `Trainer.train`, where a warm trainer waits, so its moves stay cold too.
"""

from __future__ import annotations

from services.executor.store import Job
from services.executor.transport import WorkerTransport
from shared.contracts.actions import NodeGpus
from shared.contracts.messages import CommandResult

COLD_STAGES = {"ppo"}


def can_prepare(job: Job, target: tuple[NodeGpus, ...] | None) -> bool:
    """Whether the move's target may be made ready while the source still trains."""
    train = job.train or {}
    if not target or train.get("stage") in COLD_STAGES or train.get("adc_export_of") or train.get("adc_serve"):
        return False  # a serving job has no checkpoint to hand over: it starts again on the target
    held = {(p.node, g) for p in job.placement or () for g in p.gpus}
    return not any((p.node, g) in held for p in target for g in p.gpus)


class WarmTarget:
    """The commands of a warm move: prepare the next attempt on the target, let it go, or drop it."""

    def __init__(self, transport: WorkerTransport) -> None:
        self.transport = transport

    async def prepare(
        self, job: Job, target: tuple[NodeGpus, ...], attempt: int, env: dict[str, str], protocol_id: str
    ) -> CommandResult:
        return await self.transport.start(
            job, target, f"{protocol_id}:prepare:{attempt}", protocol_id, prepare_attempt=attempt, env=env
        )

    async def go(self, job: Job, protocol_id: str) -> CommandResult:
        return await self.transport.go(job, f"{protocol_id}:go:{job.attempt}", protocol_id)

    async def drop(self, job: Job, target: tuple[NodeGpus, ...], attempt: int, protocol_id: str) -> None:
        """Stop a prepared trainer that will not be used (the move ended another way)."""
        for part in target:
            await self.transport.cancel(
                job, part.node, f"{protocol_id}:drop:{attempt}:{part.node}", protocol_id, attempts=1, attempt=attempt
            )
