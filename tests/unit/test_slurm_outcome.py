"""How a Slurm attempt ended is Slurm's word (its state, the batch script's exit code), never a file of the
job's: a job Slurm or a person ended is reported so, whatever code its launcher returned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.contracts.outcomes import ExitOutcome
from worker.sandbox import Identity, SandboxPlan
from worker.slurm.state import SlurmJob
from worker.slurm.trainer import BuiltByLauncher, SlurmTrainer
from worker.trainer_process import JobFolder


def ended(state: str, code: int | None, **trainer) -> SlurmTrainer:
    t = SlurmTrainer("j1", 1, [0], JobFolder(Path("/nonexistent/jobs/j1")), node="node-1", slurm_job_id=7, **trainer)
    t.slurm = SlurmJob(7, "adc-j1-1", state, "node-1", (0,), code, "None", 0, "")
    t.exit_code = code
    return t


@pytest.mark.parametrize(
    ("state", "code", "outcome"),
    [
        ("COMPLETED", 0, ExitOutcome.SUCCEEDED),
        ("FAILED", 75, ExitOutcome.STOPPED),
        ("FAILED", 76, ExitOutcome.OOM),
        ("FAILED", 1, ExitOutcome.FAILED),
        ("CANCELLED", 0, ExitOutcome.KILLED),  # a trainer that caught SIGTERM and exited 0 is still cancelled
        ("TIMEOUT", 0, ExitOutcome.KILLED),
        ("NODE_FAIL", None, ExitOutcome.KILLED),
    ],
)
def test_the_outcome_is_slurms_state_first_then_its_exit_code(state, code, outcome):
    trainer = ended(state, code)
    assert trainer.outcome == outcome
    said = trainer.ended_by
    if outcome == ExitOutcome.KILLED:
        assert said is not None and f"Slurm job 7 ended {state} outside ADC" in said
    else:
        assert said is None


def test_adcs_own_scancel_is_not_called_an_end_outside_adc():
    trainer = ended("CANCELLED", 0)
    trainer._scancelled = True  # terminate() sent it
    assert trainer.outcome == ExitOutcome.KILLED and trainer.ended_by is None
    trainer.cancelled = True  # a cancel the job's owner asked for
    assert trainer.outcome == ExitOutcome.CANCELLED


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may submit as another uid")
def test_the_batch_job_is_submitted_as_the_trainers_uid_with_its_output_in_the_uids_folder():
    trainer = ended("PENDING", None)
    trainer._plan = SandboxPlan(identity=Identity(65534, 65534), bwrap="/usr/bin/bwrap")
    argv = trainer.sbatch_argv(Path("/nonexistent/jobs/j1/attempt-1/slurm-batch"))
    assert argv[:2] == ["--uid=65534", "--gid=65534"]
    assert "--output=/nonexistent/jobs/j1/attempt-1/run/slurm-batch.log" in argv
    trainer._plan = SandboxPlan(identity=Identity(0, 0), bwrap=None)  # allow_root: nothing to switch
    assert not [a for a in trainer.sbatch_argv(Path("/x")) if a.startswith(("--uid", "--gid"))]


def test_the_worker_leaves_the_sandbox_to_the_launcher_with_the_same_plan():
    plan = SandboxPlan(
        identity=Identity(65534, 65534), bwrap="/usr/bin/bwrap", readable=(Path("/a"),), hidden=(Path("/b"),)
    )
    deferred = BuiltByLauncher.of(plan)
    assert (deferred.identity, deferred.bwrap, deferred.readable, deferred.hidden) == (
        plan.identity,
        plan.bwrap,
        plan.readable,
        plan.hidden,
    )
    assert deferred.wrap(["python", "-m", "worker.trainer"], Path("/jobs/j1")) == ["python", "-m", "worker.trainer"]
