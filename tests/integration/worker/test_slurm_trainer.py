"""A Slurm attempt on a real Slurm (tests/slurm_cluster.py), below the stack: what the worker does when
Slurm holds a job it cannot start, and what the launcher, the team's uid, does with a folder that uid cannot
read."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from shared.contracts.messages import Device
from shared.contracts.outcomes import ExitOutcome
from tests.slurm_cluster import local_slurm, squeue
from worker.launch_check import code_folders
from worker.sandbox import Identity, SandboxPlan, bubblewrap
from worker.slurm.trainer import SlurmTrainer
from worker.trainer_process import JobFolder


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory, gpus=1) as cluster:
        yield cluster


def attempt(tmp_path, **options) -> SlurmTrainer:
    return SlurmTrainer("j-held", 1, [0], JobFolder(tmp_path / "jobs" / "j-held"), node="node-1", **options)


async def launch_and_follow(trainer: SlurmTrainer, timeout_s: float, plan: SandboxPlan | None = None) -> list[dict]:
    seen: list[dict] = []

    async def sink(job_id, attempt, seq, event):
        seen.append(event)

    plan = plan or SandboxPlan(identity=Identity(os.geteuid(), os.getegid()), bwrap=None)
    await trainer.launch({"max_steps": 1}, [Device(index=0, simulated=True)], None, {}, plan)
    await asyncio.wait_for(trainer.follow(sink), timeout_s)
    return seen


def test_a_job_slurm_cannot_start_is_withdrawn_back_to_the_queue(slurm, tmp_path):
    foreign = slurm.run("sbatch", "--parsable", "--gres=gpu:i0:1", "--output=/dev/null", "--wrap=sleep 600").strip()
    try:
        trainer = attempt(tmp_path, pending_limit_s=3)
        asyncio.run(launch_and_follow(trainer, timeout_s=60))
        assert trainer.withdrawn and trainer.outcome == ExitOutcome.STOPPED
        held = squeue(slurm)[trainer.slurm_job_id]
        assert held["job_state"] == "CANCELLED" and held["name"] == "adc-j-held-1"
        assert not (trainer.folder.config(1).parent / "run" / "slurm-batch.log").exists()  # it never ran
        sbatch = json.loads((trainer.folder.config(1).parent / "slurm.json").read_text())["sbatch"]
        assert "--gres=gpu:i0:1" in sbatch and "--requeue" in sbatch and "--nodelist=node-1" in sbatch
    finally:
        slurm.run("scancel", foreign)


@pytest.mark.skipif(os.geteuid() != 0 or bubblewrap() is None, reason="needs root and a working bwrap")
def test_a_folder_the_teams_uid_cannot_read_is_refused_by_the_launcher_saying_which(slurm, tmp_path):
    tmp_path.chmod(0o711)  # the job folder is reachable, as a storage root is
    closed = tmp_path / "owners-only"
    closed.mkdir(mode=0o700)
    plan = SandboxPlan(
        identity=Identity(65534, 65534), bwrap=bubblewrap(), readable=(*code_folders(), closed), hidden=(tmp_path,)
    )
    trainer = attempt(tmp_path)
    asyncio.run(launch_and_follow(trainer, timeout_s=60, plan=plan))
    record = squeue(slurm)[trainer.slurm_job_id]
    assert record["user_id"] == 65534 and record["job_state"] == "FAILED", record
    assert trainer.exit_code == 2 and trainer.outcome == ExitOutcome.FAILED  # a config error, from Slurm's record
    said = trainer.log_path.read_text()
    assert f"{closed} is not readable by uid 65534" in said and "deploy/slurm/README.md" in said, said
