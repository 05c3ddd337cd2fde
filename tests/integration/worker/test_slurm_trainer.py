"""A Slurm attempt on a real Slurm (tests/slurm_cluster.py), below the stack: what the worker does when
Slurm holds a job it cannot start, and how a checkpoint-stop reaches the batch launcher."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from shared.messages import Device
from shared.outcomes import ExitOutcome
from tests.slurm_cluster import local_slurm, squeue
from worker.sandbox import Identity, SandboxPlan
from worker.slurm.trainer import SlurmTrainer
from worker.trainer_process import JobFolder


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory, gpus=1) as cluster:
        yield cluster


def attempt(tmp_path, **options) -> SlurmTrainer:
    return SlurmTrainer("j-held", 1, [0], JobFolder(tmp_path / "jobs" / "j-held"), node="node-1", **options)


async def launch_and_follow(trainer: SlurmTrainer, timeout_s: float) -> list[dict]:
    seen: list[dict] = []

    async def sink(job_id, attempt, seq, event):
        seen.append(event)

    plan = SandboxPlan(identity=Identity(os.geteuid(), os.getegid()), bwrap=None)
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
        assert trainer.exit_record() is None  # it never ran
        sbatch = json.loads((trainer.folder.config(1).parent / "slurm.json").read_text())["sbatch"]
        assert "--gres=gpu:i0:1" in sbatch and "--requeue" in sbatch and "--nodelist=node-1" in sbatch
    finally:
        slurm.run("scancel", foreign)
