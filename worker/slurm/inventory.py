"""The devices a Slurm node offers ADC, read from Slurm at every heartbeat.

Slurm owns the node: its GPUs are those its gres.conf names with ADC's per-GPU types (`gpu:i0`, `gpu:i1`,
...; deploy/slurm/README.md), so a placement's indices are exactly what ADC asks Slurm for. A GPU Slurm
has allocated to a job ADC did not submit is left out, and so is every GPU ADC's own jobs do not hold
while the node is drained, draining or down: the decider then never places onto a device Slurm gave
someone else, nor onto a node Slurm will start nothing on. What ADC's running attempts hold stays
listed, so their placement stays valid while they run.

Slurm is read beside the heartbeat, never in its way: a slurmctld that is restarting makes its clients
wait for it, and a heartbeat that waited with them would have the node called lost. The offer is made
from Slurm's last answer.
"""

from __future__ import annotations

import logging

from shared.contracts.messages import Device
from worker.inventory import cpu_slots, simulated_devices
from worker.slurm import commands
from worker.slurm.commands import SlurmError
from worker.slurm.state import SlurmNode

log = logging.getLogger(__name__)


class SlurmInventory:
    def __init__(self, node: str, gpu_memory_bytes: int, simulated: bool = False, cpu_slot_count: int = 1) -> None:
        self.node = node
        self.gpu_memory_bytes = gpu_memory_bytes
        self.simulated = simulated  # the node's gres are device files standing in for GPUs (tests, demos)
        self.cpu_slot_count = cpu_slot_count
        self.last: SlurmNode | None = None
        self.foreign: dict[int, int] = {}  # GPU -> the Slurm job not ADC's that holds it

    def devices_of(self, node: SlurmNode) -> list[Device]:
        if not node.gpus:
            return cpu_slots(self.cpu_slot_count)
        count = max(node.gpus) + 1
        every = simulated_devices(count, self.gpu_memory_bytes, name="Slurm-GPU")
        return [d.model_copy(update={"simulated": self.simulated}) for d in every if d.index in node.gpus]

    async def read(self) -> SlurmNode:
        found = await commands.node(self.node)
        if found is None:
            raise SlurmError(f"Slurm knows no node {self.node!r} (sinfo --nodes={self.node})")
        self.last = found
        return found

    async def refresh(self, adc_jobs: set[int]) -> None:
        """Read the node and the jobs on it (`adc_jobs`: ADC's own Slurm job ids); on failure the last
        reading stands."""
        try:
            node = await self.read()
            jobs = await commands.jobs_on(self.node) if node.gpus_used else []
        except (SlurmError, ValueError) as err:
            log.warning("node %s: Slurm not readable (%s); its last inventory stands", self.node, err)
            return
        self.foreign = {g: j.job_id for j in jobs if j.job_id not in adc_jobs for g in j.gpus}

    def offer(self, held: dict[int, str]) -> list[Device] | None:
        """What ADC may place on, from the last reading (`held`: GPU -> ADC job running there); None
        before the first."""
        if self.last is None:
            return None
        devices = self.devices_of(self.last)
        if self.last.closed:
            return [d for d in devices if d.index in held]
        return [d for d in devices if d.index in held or d.index not in self.foreign]
