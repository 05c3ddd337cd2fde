"""The Slurm backend of the worker (worker/backend.py): each attempt a Slurm batch job, the node's devices
as Slurm has them. One worker serves one Slurm node under ADC's name for it; it needs Slurm's client
tools and munge, and the storage root shared with the compute node (deploy/slurm/README.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from shared.contracts.messages import Command, Device
from worker.slurm.inventory import SlurmInventory
from worker.slurm.trainer import SIGNAL_GRACE_S, SlurmTrainer
from worker.trainer_process import JobFolder, TrainerProcess


class SlurmBackend:
    name = "slurm"

    def __init__(self, node: str, inventory: SlurmInventory, grace_s: int = SIGNAL_GRACE_S) -> None:
        self.node = node
        self.inventory = inventory
        self.grace_s = grace_s
        self._reading: asyncio.Task | None = None  # Slurm being read for the next heartbeat

    def trainer(self, job_id: str, attempt: int, gpus: list[int], folder: JobFolder, **options: Any) -> TrainerProcess:
        return SlurmTrainer(job_id, attempt, gpus, folder, node=self.node, grace_s=self.grace_s, **options)

    def from_record(self, record: Path) -> TrainerProcess | None:
        return SlurmTrainer.from_record(record)

    def refusal(self, cmd: Command) -> str | None:
        if (cmd.train or {}).get("adc_serve"):  # its server accepts on a socket the worker hands down (docs/serving.md)
            return "the Slurm backend does not run serving jobs: their socket is handed down by the worker itself"
        if len(cmd.placement) > 1:
            return "the Slurm backend runs single-node placements only; this job spans " + ", ".join(
                p.node for p in cmd.placement
            )
        return None

    async def offered(self, devices: list[Device], held: dict[int, str], running: list[TrainerProcess]) -> list[Device]:
        """From Slurm's last answer; the next reading starts beside it (inventory.py says why)."""
        if self._reading is None or self._reading.done():
            ours = {t.slurm_job_id for t in running if isinstance(t, SlurmTrainer) and t.slurm_job_id}
            self._reading = asyncio.ensure_future(self.inventory.refresh(ours))
        found = self.inventory.offer(held)
        return devices if found is None else found
