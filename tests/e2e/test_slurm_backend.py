"""ADC on a real Slurm (slurmctld, slurmd, munge on this host, two GPUs as device files): Slurm runs the
trainers, ADC decides. Each attempt is an sbatch of ADC's launcher; what Slurm does (a drained node, a GPU
given to someone else's job, a restarted slurmctld) is read from Slurm itself. The backend's share of the
common contract (preemption, a trainer ended outside ADC) is in test_preemption.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shared.actions import Migrate, NodeGpus
from tests.e2e.conftest import running_stack
from tests.e2e.test_loop import lora_job
from tests.e2e.test_preemption import adapter, frozen, spec, wait_step
from tests.e2e.test_protocols import _publish_decision
from tests.slurm_cluster import local_slurm, slurm_job_of, squeue

DONE = {"succeeded", "failed", "cancelled"}
STEPS = 40


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory, gpus=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def live(slurm, tmp_path_factory):
    yield from running_stack(tmp_path_factory, workers=1, simulate_gpus=2, backend="slurm", worker={"node_timeout": 20})


@pytest.fixture(scope="module")
def reference(live, tiny_model, data_dir) -> dict:
    done = live.wait_for(live.submit(spec(tiny_model, data_dir, "reference", steps=STEPS))["id"], DONE, timeout=300)
    assert done["status"] == "succeeded", done
    return adapter(done)


def assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst == 0.0, f"max abs diff {worst}"


def offered(live) -> list[int]:
    """The GPUs node-1's worker offers, as the executor last recorded them."""
    [row] = live.sql("SELECT devices FROM nodes WHERE id = 'node-1'")
    devices = row["devices"]
    return sorted(d["index"] for d in (devices if isinstance(devices, list) else json.loads(devices)))


def wait_offered(live, gpus: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while offered(live) != gpus:
        assert time.monotonic() < deadline, f"node-1 offers {offered(live)}, not {gpus}"
        time.sleep(0.2)


def test_a_lora_job_runs_as_a_slurm_job_and_its_audit_names_it(live, slurm, tiny_model, data_dir):
    job = live.submit(lora_job(tiny_model, data_dir, name="slurm-lora", steps=8))
    running = live.wait_for(job["id"], {"running", *DONE}, timeout=120)
    slurm_id = slurm_job_of(running)
    assert squeue(slurm)[slurm_id]["name"] == f"adc-{job['id']}-1"
    done = live.wait_for(job["id"], DONE, timeout=180)
    assert done["status"] == "succeeded", done
    assert done["progress"]["step"] == 8
    assert (Path(done["output_dir"]) / "adapter_model.safetensors").exists()
    assert squeue(slurm)[slurm_id]["job_state"] == "COMPLETED"
    trail = live.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], job_id=job["id"])
    [start] = [e for e in trail if e["kind"] == "command.start"]
    assert start["data"]["backend_job"] == f"slurm:{slurm_id}", start


def test_gpus_slurm_gave_another_job_are_never_offered(live, slurm, tiny_model, data_dir):
    foreign = slurm.run(
        "sbatch", "--parsable", "--gres=gpu:i0:1", "--job-name=not-adc", "--output=/dev/null", "--wrap=sleep 600"
    ).strip()
    try:
        wait_offered(live, [1])
        job = live.submit(lora_job(tiny_model, data_dir, name="beside-a-foreign-job", steps=4))
        done = live.wait_for(job["id"], DONE, timeout=180)
        assert done["status"] == "succeeded" and done["placement"][0]["gpus"] == [1], done
    finally:
        slurm.run("scancel", foreign)
    wait_offered(live, [0, 1])


def test_a_node_drained_in_slurm_stops_receiving_placements(live, slurm, tiny_model, data_dir):
    slurm.run("scontrol", "update", "nodename=node-1", "state=drain", "reason=maintenance")
    try:
        wait_offered(live, [])
        job = live.submit(lora_job(tiny_model, data_dir, name="while-drained", steps=4))
        time.sleep(5)  # several decider passes
        waiting = live.job(job["id"])
        assert waiting["status"] == "pending" and not waiting["placement"], waiting
    finally:
        slurm.run("scontrol", "update", "nodename=node-1", "state=resume")
    done = live.wait_for(job["id"], DONE, timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done


def test_slurmctld_restarted_mid_training_loses_nothing(live, slurm, reference, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "through-a-restart", steps=STEPS))
    wait_step(live, job["id"], 10)
    slurm.stop_ctld()
    time.sleep(4)  # the worker's reads of Slurm fail meanwhile; the trainer trains on
    slurm.start_ctld()
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    assert done["progress"]["step"] == STEPS
    assert_bit_identical(adapter(done), reference)


def test_a_migration_to_another_gpu_set_resumes_bit_identical(live, slurm, reference, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "migrate-me", steps=STEPS))
    running = wait_step(live, job["id"], 10)
    target = [1] if running["placement"][0]["gpus"] == [0] else [0]
    move = Migrate(job_id=job["id"], placement=[NodeGpus(node="node-1", gpus=tuple(target))], reason="test: move")
    with frozen(job["id"], 1):
        _publish_decision(live, move)
        live.wait_for(job["id"], {"checkpointing", "migrating"}, timeout=120)
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    assert done["placement"][0]["gpus"] == target
    # Slurm allocated exactly that GPU to the second attempt (its launcher noted SLURM_JOB_GPUS).
    ended = json.loads((Path(done["output_dir"]).parent / "attempt-2" / "exit.json").read_text())
    assert ended["slurm_job_gpus"] == str(target[0]) and ended["code"] == 0, ended
    assert_bit_identical(adapter(done), reference)


def test_a_restarted_worker_finds_its_slurm_job_and_stops_it_cleanly(live, slurm, reference, tiny_model, data_dir):
    """Slurm's job outlives its worker (nothing ties them); the worker, back, checkpoint-stops it through
    Slurm, and the job resumes from that checkpoint as a new attempt, losing nothing."""
    job = live.submit(spec(tiny_model, data_dir, "through-a-worker-restart", steps=STEPS))
    running = wait_step(live, job["id"], 10)
    first = slurm_job_of(running)
    stop_file = Path(running["output_dir"]).parent / "attempt-1" / "stop"
    with frozen(job["id"], 1):
        live.stack.kill("worker-node-1")
        assert squeue(slurm)[first]["job_state"] == "RUNNING"
        live.stack.restart("worker-node-1")
        deadline = time.monotonic() + 60
        while not stop_file.exists():  # the launcher's answer to the restarted worker's USR1
            assert time.monotonic() < deadline, "the restarted worker never asked Slurm's job to stop"
            time.sleep(0.2)
    done = live.wait_for(job["id"], DONE, timeout=300)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done
    ended = squeue(slurm)[first]
    assert ended["job_state"] == "FAILED" and ended["exit_code"] == 75 << 8, ended  # exit 75: stopped at a checkpoint
    assert_bit_identical(adapter(done), reference)
