"""ADC on a real Slurm (slurmctld, slurmd, munge on this host): Slurm runs the trainers, ADC decides.
Each job is an sbatch of ADC's launcher; what Slurm does to it (a person's scancel, a drained node, a
restarted slurmctld) is seen through Slurm itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import running_stack
from tests.e2e.slurm_fixture import local_slurm
from tests.e2e.test_loop import lora_job

DONE = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from local_slurm(tmp_path_factory)


@pytest.fixture(scope="module")
def live(slurm, tmp_path_factory):
    yield from running_stack(tmp_path_factory, workers=1, simulate_gpus=4, backend="slurm", worker={"node_timeout": 20})


def slurm_job_of(live, job: dict) -> int:
    record = json.loads((Path(job["output_dir"]).parent / f"attempt-{job['attempt']}" / "slurm.json").read_text())
    return int(record["slurm_job_id"])


def squeue_names(slurm) -> dict[int, str]:
    docs = json.loads(slurm.run("squeue", "--json", "--states=all"))["jobs"]
    return {int(d["job_id"]): d["name"] for d in docs}


def test_a_lora_job_runs_as_a_slurm_job_and_its_audit_names_it(live, slurm, tiny_model, data_dir):
    job = live.submit(lora_job(tiny_model, data_dir, name="slurm-lora", steps=8))
    running = live.wait_for(job["id"], {"running", *DONE}, timeout=120)
    slurm_id = slurm_job_of(live, running)
    assert squeue_names(slurm)[slurm_id] == f"adc-{job['id']}-1"
    done = live.wait_for(job["id"], DONE, timeout=180)
    assert done["status"] == "succeeded", done
    assert done["progress"]["step"] == 8
    assert (Path(done["output_dir"]) / "adapter_model.safetensors").exists()
    trail = live.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], job_id=job["id"])
    start = next(e for e in trail if e["kind"] == "command.start")
    assert start["data"]["backend_job"] == f"slurm:{slurm_id}", start
    # The trainer ran in the worker's sandbox, under Slurm.
    launch = json.loads((Path(done["output_dir"]).parent / "attempt-1" / "launch.json").read_text())
    assert launch["uid"] != 0


def test_a_job_a_person_scancels_is_reported_and_not_resubmitted(live, slurm, tiny_model, data_dir):
    job = live.submit(lora_job(tiny_model, data_dir, name="slurm-scancelled", steps=400))
    running = live.wait_for(job["id"], {"running", *DONE}, timeout=120)
    assert running["status"] == "running", running
    slurm_id = slurm_job_of(live, running)
    slurm.run("scancel", str(slurm_id))
    done = live.wait_for(job["id"], DONE, timeout=120)
    assert done["status"] == "failed", done
    assert f"Slurm job {slurm_id} ended CANCELLED outside ADC" in done["status_reason"], done
    time.sleep(3)  # a resubmission would show as a new attempt and a new Slurm job
    again = live.job(job["id"])
    assert again["status"] == "failed" and again["attempt"] == 1, again
    assert [n for n in squeue_names(slurm).values() if n.startswith(f"adc-{job['id']}-")] == [f"adc-{job['id']}-1"]
