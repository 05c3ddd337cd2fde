"""One trainer attempt as a Slurm batch job.

Everything up to the process is the worker's own launch (worker/trainer_process.py: the fence, train.yaml,
the sandbox plan, the built environment); the last step, instead of a child process, is an `sbatch` of
ADC's batch launcher (worker/slurm/batch.py) pinned to the placement: `--nodelist` the node, `--gres` one
ADC gres type per GPU index (gpu:i<N>), `--requeue`, `--signal=B:USR1@<grace>`. The Slurm job id is kept
in the attempt folder (`slurm.json`) and the node's registry, and reported with the start.

What the attempt does is read back from Slurm: its events from the events file the launcher writes, its end
from squeue (a job Slurm ended, failed or a person cancelled is seen, never resubmitted by the worker), its
exit code from the launcher's `exit.json`. A checkpoint-stop is `scancel --signal=USR1 --batch`; while
slurmctld cannot be reached, the stop file is touched directly, so a stop never waits on Slurm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from shared.messages import Device
from shared.outcomes import ExitOutcome
from worker import job_files
from worker.slurm import commands
from worker.slurm.batch import EXIT_FILE, LAUNCH_FILE
from worker.slurm.commands import SlurmError
from worker.slurm.state import SlurmJob
from worker.trainer_process import REPO_ROOT, TrainerProcess

log = logging.getLogger(__name__)
POLL_S = 1.0
SIGNAL_GRACE_S = 120  # --signal=B:USR1@<grace>: the stop request this long before Slurm's time limit
# Slurm holding the job this long without starting it (its GPUs taken meanwhile by a job ADC did not submit):
# the job is withdrawn and goes back to ADC's queue, to be placed where Slurm has room.
PENDING_LIMIT_S = 60.0
_SCRIPT = "slurm-batch"


def job_name(job_id: str, attempt: int) -> str:
    """How ADC's jobs are named in squeue."""
    return f"adc-{job_id}-{attempt}"


@dataclass
class SlurmTrainer(TrainerProcess):
    node: str = ""
    slurm_job_id: int | None = None
    slurm: SlurmJob | None = None  # Slurm's last word on the job
    grace_s: int = SIGNAL_GRACE_S
    gpus_are_slurms: bool = True  # False for CPU slots: nothing to ask of Slurm's gres
    pending_limit_s: float = PENDING_LIMIT_S
    withdrawn: bool = False  # Slurm never started it within pending_limit_s: cancelled, back to ADC's queue
    _stopping: asyncio.Future | None = None  # the checkpoint-stop being sent

    @property
    def backend_job(self) -> str | None:
        return f"slurm:{self.slurm_job_id}" if self.slurm_job_id else None

    @property
    def pid(self) -> int | None:
        return None  # the trainer's process is Slurm's, on its node

    def sbatch_argv(self, script: Path) -> list[str]:
        attempt_dir = self.folder.config(self.attempt).parent
        gres = ",".join(f"gpu:i{g}:1" for g in self.gpus) if self.gpus_are_slurms else ""
        return [
            f"--job-name={job_name(self.job_id, self.attempt)}",
            f"--nodelist={self.node}",
            "--nodes=1",
            "--ntasks=1",
            *([f"--gres={gres}"] if gres else []),
            "--requeue",
            f"--signal=B:USR1@{self.grace_s}",
            f"--chdir={attempt_dir}",
            f"--output={attempt_dir / 'slurm-batch.log'}",
            "--export=NONE",
            f"--comment=adc job {self.job_id} attempt {self.attempt}",
            str(script),
            str(attempt_dir),
        ]

    async def _start(
        self, argv: list[str], devices: list[Device], tuning: dict[str, str], attempt_fd: int, switch: dict
    ) -> None:
        by_index = {d.index: d for d in devices}
        self.gpus_are_slurms = all(by_index[g].kind == "gpu" for g in self.gpus)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        for name in (self.log_path.name, self.folder.events(self.attempt).name):
            os.close(job_files.open_file(attempt_fd, name, flags))
        self._events_fd = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, 0)
        env = self._environment(devices, tuning, -1)  # the launcher sets ADC_EVENTS_FD to its own descriptor
        spec = {
            "argv": argv,
            "env": env,
            "log": self.log_path.name,
            "events": self.folder.events(self.attempt).name,
            "stop_file": self.folder.stop_file(self.attempt).name,
            "output_dir": str(self.folder.output_dir),
            "memory_limit_bytes": self.memory_limit_bytes,
            "switch": switch,
        }
        job_files.write_file(attempt_fd, LAUNCH_FILE, json.dumps(spec).encode())
        script = f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
        script += "from worker.slurm.batch import main\nsys.exit(main(sys.argv[1]))\n"
        job_files.write_file(attempt_fd, _SCRIPT, script.encode())
        sbatch = self.sbatch_argv(self.folder.config(self.attempt).parent / _SCRIPT)
        self.slurm_job_id = await commands.submit(sbatch)
        record = {"slurm_job_id": self.slurm_job_id, "sbatch": sbatch}
        job_files.write_file(attempt_fd, "slurm.json", json.dumps(record, indent=1).encode())
        log.info("job %s attempt %d submitted as Slurm job %d", self.job_id, self.attempt, self.slurm_job_id)

    async def _exited(self) -> int | None:
        """Until Slurm says the job has ended (or has forgotten it); its exit code, the launcher's word first."""
        unreachable = pending = 0
        while True:
            try:
                self.slurm = await commands.job(self.slurm_job_id)
                unreachable = 0
            except SlurmError as err:  # slurmctld restarting: the job runs on, its state is asked again
                unreachable += 1
                if unreachable in (1, 30):
                    log.warning("job %s: Slurm job %d not readable (%s)", self.job_id, self.slurm_job_id, err)
            else:
                if self.slurm is None or self.slurm.final:
                    break
                pending = pending + 1 if self.slurm.state == "PENDING" and not self.slurm.restarts else 0
                if pending * POLL_S >= self.pending_limit_s and not self.withdrawn:
                    log.warning(
                        "job %s: Slurm job %d still pending (%s) after %.0f s: withdrawn, back to the queue",
                        self.job_id,
                        self.slurm_job_id,
                        self.slurm.reason,
                        self.pending_limit_s,
                    )
                    self.withdrawn = True
                    await self.terminate()
            await asyncio.sleep(POLL_S)
        ended = self.exit_record()
        if ended is not None:
            return ended.get("code")
        return self.slurm.exit_code if self.slurm is not None else None

    def exit_record(self) -> dict | None:
        try:
            with job_files.opened_dir(self.folder.config(self.attempt).parent) as fd:
                return json.loads(job_files.read_file(fd, EXIT_FILE, 4096))
        except (OSError, ValueError):
            return None

    @property
    def outcome(self) -> ExitOutcome:
        if self.cancelled:
            return ExitOutcome.CANCELLED
        if self.withdrawn and self.exit_record() is None:
            return ExitOutcome.STOPPED  # it never ran: requeued from the job's newest checkpoint, no fault of its own
        if self.slurm is not None and self.slurm.state == "CANCELLED" and self.exit_code is None:
            return ExitOutcome.KILLED  # scancel by someone else than ADC: reported, never resubmitted
        return ExitOutcome.of_exit(self.exit_code)

    @property
    def ended_by(self) -> str | None:
        """Why the job ended when Slurm (or a person through it) ended it, for the exit event's error."""
        if self.slurm is None or self.outcome != ExitOutcome.KILLED:
            return None
        return (
            f"Slurm job {self.slurm_job_id} ended {self.slurm.state} outside ADC"
            f" (reason {self.slurm.reason or 'none'}); not resubmitted"
        )

    def request_stop(self) -> None:
        """The checkpoint-stop, through Slurm: USR1 to the batch launcher, which asks the trainer."""
        self._stopping = asyncio.ensure_future(self._signal_stop())  # held: a task nobody holds may be collected

    async def _signal_stop(self) -> None:
        try:
            await commands.signal_batch(self.slurm_job_id, "USR1")
        except SlurmError as err:  # slurmctld away: the stop file reaches the trainer all the same
            log.warning("job %s: USR1 through Slurm failed (%s): stop file touched", self.job_id, err)
            super().request_stop()

    async def terminate(self, grace_s: float = 10.0) -> None:
        try:
            await commands.cancel(self.slurm_job_id)
        except SlurmError as err:
            log.warning("job %s: scancel %s failed: %s", self.job_id, self.slurm_job_id, err)

    # --- a worker's restart: the record names the Slurm job --------------------------

    def register(self, registry: Path) -> None:
        super().register(registry)
        record = registry / f"{self.job_id}.json"
        doc = json.loads(record.read_text()) | {"pid": 0, "slurm_job_id": self.slurm_job_id, "node": self.node}
        record.write_text(json.dumps(doc))

    @classmethod
    def from_record(cls, path: Path) -> SlurmTrainer | None:
        trainer = super().from_record(path)
        try:
            doc = json.loads(path.read_text())
            trainer.slurm_job_id = int(doc["slurm_job_id"])
            trainer.node = str(doc.get("node") or "")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return trainer

    def alive(self) -> bool:
        try:
            self.slurm = commands.job_sync(self.slurm_job_id)
        except SlurmError:
            return True  # Slurm cannot say: taken as running, so it is stopped rather than forgotten
        return self.slurm is not None and not self.slurm.final

    async def wait_gone(self, timeout_s: float) -> None:
        for _ in range(int(timeout_s / POLL_S)):
            if not self.alive():
                break
            await asyncio.sleep(POLL_S)
        else:
            commands.cancel_sync(self.slurm_job_id)
        record = self.exit_record()
        self.exit_code = record.get("code") if record else None
        self.adopted_pid = None  # judged by its exit code, which the launcher wrote down
