"""What runs a node's trainers: the worker's contract with the executor (a signed Command on
`adc.nodes.<node>.cmd`, a CommandResult back, heartbeats listing devices and attempts, job events) is the
same whichever backend carries it out; the backend is how.

- start an attempt on a placement: `trainer(...)` makes the attempt, its `launch` starts it;
- checkpoint-stop it and stop it: the attempt's `request_stop` and `terminate`;
- its state and exit: the attempt's `follow` (events until it ends), `exit_code`, `outcome`, `ended_by`;
- what runs on the node and what it offers: the worker's own attempts, `from_record` for those a previous
  run of the worker left, and `offered` for the devices the decider may place on.

`LocalBackend` runs trainers as the worker's children (the built-in default); `worker/slurm/backend.py`
submits them to Slurm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from shared.contracts.messages import Command, Device
from worker.trainer_process import JobFolder, TrainerProcess


class Backend(Protocol):
    name: str

    def trainer(self, job_id: str, attempt: int, gpus: list[int], folder: JobFolder, **options: Any) -> TrainerProcess:
        """A new attempt, not started yet."""
        ...

    def from_record(self, record: Path) -> TrainerProcess | None:
        """An attempt a previous run of this worker left, from the node's registry."""
        ...

    def refusal(self, cmd: Command) -> str | None:
        """Why this backend cannot carry out a start (None: it can)."""
        ...

    async def offered(self, devices: list[Device], held: dict[int, str], running: list[TrainerProcess]) -> list[Device]:
        """The devices the node offers now (`held`: device -> job of the attempts running there)."""
        ...


class LocalBackend:
    """Trainers as the worker's own children, on the devices it was started with."""

    name = "local"

    def trainer(self, job_id: str, attempt: int, gpus: list[int], folder: JobFolder, **options: Any) -> TrainerProcess:
        return TrainerProcess(job_id, attempt, gpus, folder, **options)

    def from_record(self, record: Path) -> TrainerProcess | None:
        return TrainerProcess.from_record(record)

    def refusal(self, cmd: Command) -> str | None:
        return None

    async def offered(self, devices: list[Device], held: dict[int, str], running: list[TrainerProcess]) -> list[Device]:
        return devices
