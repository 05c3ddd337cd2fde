"""One trainer attempt as a Slurm batch job.

Everything up to the process is the worker's own launch (worker/trainer_process.py: the fence, train.yaml,
the sandbox plan, the built environment); the last step, instead of a child process, is an `sbatch` of
ADC's batch launcher (worker/slurm/batch.py) pinned to the placement: `--nodelist` the node, `--gres` one
ADC gres type per GPU index (gpu:i<N>), `--requeue`, `--signal=B:USR1@<grace>`. The Slurm job id is kept
in the attempt folder (`slurm.json`) and the node's registry, and reported with the start.

The job is submitted as the trainer's uid (`sbatch --uid --gid`, root may), so Slurm's accounting shows the
team's user, and the launcher builds the sandbox as that uid (worker/slurm/batch.py); the worker gives it
the attempt's `run/` folder and the trainer's log and events files, made here and handed to the uid.

What the attempt does is read back from Slurm: its events from the events file (through the descriptor the
worker opened before submitting), and its end from Slurm alone: the job's state and the batch script's exit
code in squeue, which no process of the job can write. A job Slurm ended or a person cancelled (CANCELLED,
TIMEOUT, NODE_FAIL, ...) is reported so whatever its exit code (a trainer that catches SIGTERM and exits 0
is still cancelled), never resubmitted by the worker. A checkpoint-stop is `scancel --signal=USR1 --batch`;
while slurmctld cannot be reached, the stop file is touched directly, so a stop never waits on Slurm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from shared.contracts.messages import Device
from shared.contracts.outcomes import ExitOutcome
from worker import job_files
from worker.sandbox import SandboxPlan
from worker.slurm import commands
from worker.slurm.batch import LAUNCH_FILE, RUN_DIR
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
# Ends Slurm gives a job whatever its batch script returned: by scancel, a time limit, a lost node, ...
ENDED_BY_SLURM = frozenset({"CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})


@dataclass(frozen=True)
class BuiltByLauncher(SandboxPlan):
    """The worker's sandbox plan, left unwrapped: the launcher builds it on the node, as the trainer's uid."""

    def wrap(self, argv: list[str], job_dir: Path, *, own_network: bool = True) -> list[str]:
        return argv

    @classmethod
    def of(cls, plan: SandboxPlan) -> BuiltByLauncher:
        return cls(**{f.name: getattr(plan, f.name) for f in fields(plan)})


def _owned_dir(parent_fd: int, name: str, uid: int, gid: int) -> int:
    """Folder `name` in the worker's folder `parent_fd`, made if missing and given to uid:gid; never a symlink."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise job_files.UnsafeJobFile(f"{name} is not a folder")
    os.fchown(fd, uid, gid)
    return fd


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
    _plan: SandboxPlan | None = None  # what the launcher builds on the node
    _scancelled: bool = False  # ADC itself cancelled the Slurm job (terminate)

    @property
    def backend_job(self) -> str | None:
        return f"slurm:{self.slurm_job_id}" if self.slurm_job_id else None

    @property
    def pid(self) -> int | None:
        return None  # the trainer's process is Slurm's, on its node

    def sbatch_argv(self, script: Path) -> list[str]:
        attempt_dir = self.folder.config(self.attempt).parent
        gres = ",".join(f"gpu:i{g}:1" for g in self.gpus) if self.gpus_are_slurms else ""
        identity = self._plan.identity if self._plan is not None else None
        as_team = [f"--uid={identity.uid}", f"--gid={identity.gid}"] if identity and identity.switch else []
        return [
            *as_team,
            f"--job-name={job_name(self.job_id, self.attempt)}",
            f"--nodelist={self.node}",
            "--nodes=1",
            "--ntasks=1",
            *([f"--gres={gres}"] if gres else []),
            "--requeue",
            f"--signal=B:USR1@{self.grace_s}",
            f"--chdir={attempt_dir}",
            f"--output={attempt_dir / RUN_DIR / 'slurm-batch.log'}",  # opened by slurmstepd as the uid
            "--export=NONE",
            f"--comment=adc job {self.job_id} attempt {self.attempt}",
            str(script),
            str(attempt_dir),
        ]

    async def launch(
        self,
        train: dict[str, Any],
        devices: list[Device],
        resume_from: str | None,
        extra_env: dict[str, str],
        sandbox: SandboxPlan,
        **more: Any,
    ) -> None:
        """The worker's launch with the sandbox left to the launcher, which builds it as the trainer's uid
        (without bwrap the launcher, that uid already, runs the trainer as it is)."""
        self._plan = sandbox
        await super().launch(train, devices, resume_from, extra_env, BuiltByLauncher.of(sandbox), **more)

    @property
    def run_stop_file(self) -> Path:
        """The stop file under Slurm: in the attempt's `run/` folder, where the launcher (the uid) may create it."""
        return self.folder.config(self.attempt).parent / RUN_DIR / self.folder.stop_file(self.attempt).name

    async def _start(
        self, argv: list[str], devices: list[Device], tuning: dict[str, str], attempt_fd: int, switch: dict
    ) -> None:
        by_index = {d.index: d for d in devices}
        self.gpus_are_slurms = all(by_index[g].kind == "gpu" for g in self.gpus)
        plan = self._plan
        identity = plan.identity
        owner = (identity.uid, identity.gid) if identity.switch else (os.geteuid(), os.getegid())
        os.close(_owned_dir(attempt_fd, RUN_DIR, *owner))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        for name in (self.log_path.name, self.folder.events(self.attempt).name):
            fd = job_files.open_file(attempt_fd, name, flags)
            try:
                os.fchown(fd, *owner)  # the launcher opens them, as the uid; the worker reads its own descriptor
            finally:
                os.close(fd)
        self._events_fd = job_files.open_file(attempt_fd, self.folder.events(self.attempt).name, 0)
        env = self._environment(devices, tuning, -1)  # the launcher sets ADC_EVENTS_FD to its own descriptor
        env["ADC_STOP_FILE"] = str(self.run_stop_file)
        job_dir = self.folder.root
        sandbox = (
            {
                "bwrap": plan.bwrap,
                "job_dir": str(job_dir),
                "readable": [str(p) for p in plan.readable],
                "hidden": [str(p) for p in plan.hidden],
                "writable": [str(self.folder.output_dir), str(self.folder.cache)],
            }
            if plan.bwrap
            else None
        )
        spec = {
            "argv": argv,
            "env": env,
            "log": self.log_path.name,
            "events": self.folder.events(self.attempt).name,
            "stop_file": self.folder.stop_file(self.attempt).name,
            "config": self.folder.config(self.attempt).name,
            "output_dir": str(self.folder.output_dir),
            "memory_limit_bytes": self.memory_limit_bytes,
            "uid": owner[0],
            "sandbox": sandbox,
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
        """Until Slurm says the job has ended (or has forgotten it); the batch script's exit code, as Slurm has it."""
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
        return self.slurm.exit_code if self.slurm is not None else None

    @property
    def outcome(self) -> ExitOutcome:
        """From Slurm's record: its state first (an end Slurm gave the job), then the batch script's exit code."""
        if self.cancelled:
            return ExitOutcome.CANCELLED
        if self.withdrawn:
            return ExitOutcome.STOPPED  # Slurm never started it: requeued from the job's newest checkpoint
        if self.slurm is not None and self.slurm.state in ENDED_BY_SLURM:
            return ExitOutcome.KILLED  # a person's scancel, a time limit: reported, never resubmitted
        return ExitOutcome.of_exit(self.exit_code)

    @property
    def outside_adc(self) -> bool:
        """Slurm ended the job (or a person through it), not ADC's own scancel."""
        return (
            self.slurm is not None
            and self.slurm.state in ENDED_BY_SLURM
            and not (self._scancelled and self.slurm.state == "CANCELLED")
        )

    @property
    def ended_by(self) -> str | None:
        """Why the job ended when Slurm (or a person through it) ended it, for the exit event's error."""
        if self.outcome != ExitOutcome.KILLED or not self.outside_adc:
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
            self.touch_stop_file()

    def touch_stop_file(self) -> None:
        """The stop file in `run/` (the uid's folder, in the worker's attempt folder: no symlink followed)."""
        attempt_fd = job_files.attempt_dir(self.folder.root, self.folder.stop_file(self.attempt).parent.name)
        try:
            run_fd = os.open(RUN_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=attempt_fd)
            try:
                job_files.touch(run_fd, self.run_stop_file.name)
            finally:
                os.close(run_fd)
        finally:
            os.close(attempt_fd)

    async def terminate(self, grace_s: float = 10.0) -> None:
        self._scancelled = True
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
        self.exit_code = self.slurm.exit_code if self.slurm is not None else None
        self.adopted_pid = None  # judged by Slurm's record of it
