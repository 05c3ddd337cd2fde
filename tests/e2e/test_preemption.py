"""A high-priority job arrives on a full cluster: a low-priority job is checkpointed and preempted, the
high-priority job runs, then the low-priority one resumes from its checkpoint and finishes with weights
bit-identical to an untouched twin's. The audit log tells the story in order. And a trainer ended outside
ADC (a person's kill, a person's scancel) is reported as such, never resubmitted.

This is the contract every backend keeps (worker/backend.py), so the module runs against each: the built-in
workers and a real Slurm (slurmctld, slurmd, munge on this host). One GPU on one node: the high-priority job
can only run by preempting the low one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.e2e.conftest import running_stack
from tests.e2e.test_loop import lora_job
from tests.e2e.test_protocols import wait_step
from tests.slurm_cluster import local_slurm, open_to_trainers, slurm_job_of

STEPS, SAVE_STEPS = 40, 10
DONE = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module", params=["local", "slurm"])
def backend(request, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(local_slurm(tmp_path_factory, gpus=1)) if request.param == "slurm" else None
        lives = running_stack(
            tmp_path_factory, workers=1, simulate_gpus=1, backend=request.param, worker={"node_timeout": 20}
        )
        live = next(lives)
        stack.callback(lambda: next(lives, None))  # the generator's cleanup stops the stack
        if cluster is not None:
            open_to_trainers(live)  # Slurm's trainers run as the team's uid, which must reach the storage
        yield request.param, live, cluster


@pytest.fixture(scope="module")
def live(backend):
    return backend[1]


def spec(tiny_model, data_dir, name: str, steps: int = STEPS) -> dict:
    s = lora_job(tiny_model, data_dir, name=name, steps=steps)
    s["train"]["save_steps"] = SAVE_STEPS
    return s


def adapter(job: dict) -> dict:
    return load_file(str(Path(job["output_dir"]) / "adapter_model.safetensors"))


def trainer_pids(job_id: str, attempt: int) -> list[int]:
    """The processes of an attempt's trainer on this host, whoever started them (the worker or slurmd):
    those whose environment names the job and attempt, as every trainer's does."""
    want = (f"\0ADC_JOB_ID={job_id}\0".encode(), f"\0ADC_ATTEMPT={attempt}\0".encode())
    found = []
    for proc in Path("/proc").iterdir():
        try:
            env = b"\0" + (proc / "environ").read_bytes()
        except OSError:  # not a process, or gone
            continue
        if all(w in env for w in want):
            found.append(int(proc.name))
    return found


@contextlib.contextmanager
def frozen(job_id: str, attempt: int):
    """The attempt's trainer stopped (SIGSTOP) for the block: it trains no step, so a move asked meanwhile
    begins before the job can finish, however fast the host."""
    pids = trainer_pids(job_id, attempt)
    assert pids, f"no trainer process of {job_id} attempt {attempt}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_high_priority_preempts_low_which_resumes_from_its_checkpoint(backend, live, tiny_model, data_dir):
    twin = live.wait_for(live.submit(spec(tiny_model, data_dir, "twin"))["id"], DONE, timeout=300)
    assert twin["status"] == "succeeded", twin
    low = spec(tiny_model, data_dir, "low-batch") | {"priority": "low"}
    low_job = live.submit(low)
    wait_step(live, low_job["id"], 12)
    with frozen(low_job["id"], 1):
        high = spec(tiny_model, data_dir, "urgent", steps=6) | {"priority": "high"}
        high_job = live.submit(high)
        live.wait_for(low_job["id"], {"checkpointing"}, timeout=120)

    high_done = live.wait_for(high_job["id"], DONE, timeout=300)
    assert high_done["status"] == "succeeded", high_done
    low_done = live.wait_for(low_job["id"], DONE, timeout=300)
    assert low_done["status"] == "succeeded", low_done
    assert low_done["attempt"] == 2 and low_done["progress"]["step"] == STEPS

    history = [
        r["new_status"]
        for r in live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", low_job["id"])
    ]
    assert history == [
        "pending",
        "scheduled",
        "starting",
        "running",
        "checkpointing",
        "preempted",
        "pending",
        "scheduled",
        "starting",
        "running",
        "succeeded",
    ], history

    # The sink records events after the status they report: wait for the last one this test reads.
    trail = live.wait_audit(lambda t: any(e["kind"] == "job.succeeded" and e["job_id"] == low_job["id"] for e in t))

    def at(pred):
        return next(i for i, e in enumerate(trail) if pred(e))

    preempt = at(lambda e: e["kind"] == "decision" and e["action"] == "preempt" and e["job_id"] == low_job["id"])
    decision = trail[preempt]
    assert decision["rule"] == "priority_scheduling" and decision["reason"]
    stopped = at(lambda e: e["kind"] == "command.stop" and e["job_id"] == low_job["id"])
    preempted = at(lambda e: e["kind"] == "job.preempted" and e["job_id"] == low_job["id"])
    high_running = at(lambda e: e["kind"] == "job.running" and e["job_id"] == high_job["id"])
    high_succeeded = at(lambda e: e["kind"] == "job.succeeded" and e["job_id"] == high_job["id"])
    low_resumed = at(
        lambda e: e["kind"] == "command.start" and e["job_id"] == low_job["id"] and e["data"]["attempt"] == 2
    )
    low_succeeded = at(lambda e: e["kind"] == "job.succeeded" and e["job_id"] == low_job["id"])
    assert preempt < stopped < preempted < high_running < high_succeeded < low_resumed < low_succeeded
    checkpoint = trail[stopped]["data"]["checkpoint"]
    assert checkpoint and trail[low_resumed]["data"]["resume_from"] == checkpoint
    assert trail[stopped]["data"]["step"] >= 12
    # The resumed attempt did not tokenize again: it loaded the dataset the first one cached in the job's folder.
    logs = [(Path(low_done["job_dir"]) / f"attempt-{n}" / "trainer.log").read_text() for n in (1, 2)]
    assert "Loaded tokenized dataset from" not in logs[0] and "Tokenized dataset is saved at" in logs[0]
    assert "Loaded tokenized dataset from" in logs[1] and "Tokenized dataset is saved at" not in logs[1]
    if backend[0] == "slurm":  # each attempt its own Slurm job, named in the audit
        assert trail[low_resumed]["data"]["backend_job"] == f"slurm:{slurm_job_of(low_done, 2)}"
        assert slurm_job_of(low_done, 1) != slurm_job_of(low_done, 2)

    a, b = adapter(low_done), adapter(twin)
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert worst == 0.0, f"max abs diff {worst}"


def kill_outside_adc(backend, live, job: dict) -> str:
    """End the job's trainer as a person would, not through ADC; what the job's reason must then say."""
    name, _, cluster = backend
    if name == "slurm":
        slurm_id = slurm_job_of(job)
        cluster.run("scancel", str(slurm_id))
        return f"Slurm job {slurm_id} ended CANCELLED outside ADC"
    os.killpg(live.trainer_record(job["id"], job["placement"][0]["node"])["pid"], signal.SIGKILL)
    return "trainer killed"


def test_a_trainer_ended_outside_adc_is_reported_and_not_resubmitted(backend, live, tiny_model, data_dir):
    job = live.submit(spec(tiny_model, data_dir, "ended-outside", steps=2000))
    running = wait_step(live, job["id"], 2)
    said = kill_outside_adc(backend, live, running)
    done = live.wait_for(job["id"], DONE, timeout=120)
    assert done["status"] == "failed" and said in done["status_reason"], done
    time.sleep(3)  # a resubmission would show as a new attempt
    again = live.job(job["id"])
    assert again["status"] == "failed" and again["attempt"] == 1, again
    trail = live.wait_audit(lambda t: "job.failed" in [e["kind"] for e in t], job_id=job["id"])
    assert [e["data"]["attempt"] for e in trail if e["kind"] == "command.start"] == [1]
