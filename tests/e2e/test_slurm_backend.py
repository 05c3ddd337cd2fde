"""ADC on a real Slurm (slurmctld, slurmd, munge on this host, two GPUs as device files): Slurm runs the
trainers, ADC decides. Each attempt is an sbatch of ADC's launcher as the team's uid; what Slurm does (a
drained node, a GPU given to someone else's job, a restarted slurmctld) is read from Slurm itself, and so
is how a job ended. A hostile trainer (a trusted model folder's own Python) tries the confinement the
launcher builds without root. The backend's share of the common contract (preemption, a trainer ended
outside ADC) is in test_preemption.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shared.contracts.actions import Migrate, NodeGpus
from tests.conftest import models_root
from tests.e2e.conftest import running_stack
from tests.e2e.test_loop import lora_job
from tests.e2e.test_preemption import adapter, frozen, spec, wait_step
from tests.e2e.test_protocols import _publish_decision
from tests.hostile_code import code_model, host_targets
from tests.slurm_cluster import local_slurm, open_to_trainers, slurm_job_of, squeue

DONE = {"succeeded", "failed", "cancelled"}
STEPS = 40
NOBODY = 65534  # tenancy.sandbox's default user: the stack's trainers' uid
OTHER_TEAM_LOG = "OTHER-TEAMS-LOG-5d1e9a"

# A model folder's own Python, imported by transformers inside the real trainer (trust_remote_code). It
# reports what it reached to output/attack.json, then waits; SIGTERM makes it exit 0, as if it succeeded.
PAYLOAD = r"""
import json, os, signal, socket, time
P = json.loads(%(params)r)
attempt = os.path.dirname(os.path.dirname(os.environ["ADC_STOP_FILE"]))
job = os.path.dirname(os.environ["ADC_FENCE_FILE"])
report = {"uid": os.getuid(), "interfaces": [n for _, n in socket.if_nameindex()], "connect": {}, "read": {}}
with open("/proc/self/status") as f:
    report["status"] = {k: v.strip() for k, v in (line.split(":", 1) for line in f) if k in ("CapEff", "NoNewPrivs")}
for host, port in P["targets"]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        report["connect"]["%%s:%%d" %% (host, port)] = "open"
    except OSError as err:
        report["connect"]["%%s:%%d" %% (host, port)] = repr(err)
    finally:
        s.close()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
client = socket.create_connection(server.getsockname(), timeout=3)
report["loopback"] = "open"
client.close()
server.close()
for path in P["reads"]:
    try:
        with open(path) as f:
            report["read"][path] = f.read(200)
    except OSError as err:
        report["read"][path] = repr(err)
try:
    report["jobs_seen"] = sorted(os.listdir(os.path.dirname(job)))
except OSError as err:
    report["jobs_seen"] = repr(err)
forged = {"code": 0, "signal": None}
for name in (os.path.join(attempt, "exit.json"), os.path.join(attempt, "run", "exit.json")):
    try:
        with open(name, "w") as f:
            json.dump(forged, f)
        report.setdefault("forged", {})[name] = "written"
    except OSError as err:
        report.setdefault("forged", {})[name] = repr(err)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
with open(os.path.join(job, "output", "attack.json.tmp"), "w") as f:
    json.dump(report, f)
os.replace(os.path.join(job, "output", "attack.json.tmp"), os.path.join(job, "output", "attack.json"))
while True:
    time.sleep(0.2)
"""


def hostile_model(tiny_model: Path, trusted: Path, params: dict) -> Path:
    return code_model(tiny_model, trusted, "hostile", PAYLOAD % {"params": json.dumps(params)})


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with local_slurm(tmp_path_factory, gpus=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def trusted(tmp_path_factory) -> Path:
    root = models_root(tmp_path_factory) / "trusted-slurm"
    root.mkdir(mode=0o755, exist_ok=True)
    return root


@pytest.fixture(scope="module")
def live(slurm, trusted, tmp_path_factory):
    for live in running_stack(
        tmp_path_factory,
        workers=1,
        simulate_gpus=2,
        backend="slurm",
        worker={"node_timeout": 20},
        trusted_code_roots=[trusted],
    ):
        open_to_trainers(live)
        yield live


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
    record = squeue(slurm)[slurm_id]
    assert record["name"] == f"adc-{job['id']}-1"
    # Slurm's record names the team's user (tenancy.sandbox: nobody), not root: sbatch --uid.
    assert (record["user_id"], record["user_name"], record["group_id"]) == (65534, "nobody", 65534), record
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
    # Slurm gave the second attempt exactly that GPU (its own record; the launcher saw it as SLURM_JOB_GPUS).
    second = squeue(slurm)[slurm_job_of(done, 2)]
    assert second["tres_per_node"] == f"gres:gpu:i{target[0]}:1" and second["exit_code"] == 0, second
    launcher = (Path(done["output_dir"]).parent / "attempt-2" / "run" / "slurm-batch.log").read_text()
    assert f"SLURM_JOB_GPUS={target[0]}" in launcher, launcher
    assert_bit_identical(adapter(done), reference)


def test_a_restarted_worker_finds_its_slurm_job_and_stops_it_cleanly(live, slurm, reference, tiny_model, data_dir):
    """Slurm's job outlives its worker (nothing ties them); the worker, back, checkpoint-stops it through
    Slurm, and the job resumes from that checkpoint as a new attempt, losing nothing."""
    job = live.submit(spec(tiny_model, data_dir, "through-a-worker-restart", steps=STEPS))
    running = wait_step(live, job["id"], 10)
    first = slurm_job_of(running)
    stop_file = Path(running["output_dir"]).parent / "attempt-1" / "run" / "stop"
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


def test_a_hostile_trainer_under_slurm_is_confined_and_cannot_forge_its_end(live, slurm, trusted, tiny_model, data_dir):
    """Built without root, the sandbox still holds: the trainer (the team's uid, no capability) reaches no host
    service and no other team's job folder; and after a person's scancel, its exit 0 (SIGTERM caught) and an
    exit file it writes change nothing: the job is reported as Slurm ended it."""
    storage = open_to_trainers(live)
    other = storage / "jobs" / "their-job"
    (other / "attempt-1").mkdir(parents=True, exist_ok=True)
    (other / "attempt-1" / "trainer.log").write_text(f"{OTHER_TEAM_LOG}\n")
    (other / "team").write_text("beta\n")
    nats_port = int(live.env.nats_url.rsplit(":", 1)[1])
    api_port = int(live.stack.api_url.rsplit(":", 1)[1])
    reads = [str(other / "attempt-1" / "trainer.log"), str(live.stack.home / "adc_config.yaml")]
    model = hostile_model(tiny_model, trusted, {"targets": host_targets([5432, nats_port, api_port]), "reads": reads})
    job_spec = lora_job(model, data_dir, name="hostile-under-slurm", steps=1000)
    job_spec["train"]["trust_remote_code"] = True
    job = live.submit(job_spec)
    running = live.wait_for(job["id"], {"starting", "running", *DONE}, timeout=120)
    report_file = Path(running["output_dir"]) / "attack.json"
    deadline = time.monotonic() + 180
    while not report_file.exists():  # the payload runs as the trainer loads its model, before any step
        assert time.monotonic() < deadline, f"the payload never reported: {live.job(job['id'])}"
        time.sleep(0.5)
    report = json.loads(report_file.read_text())
    assert report["uid"] == NOBODY and report["status"] == {"CapEff": "0000000000000000", "NoNewPrivs": "1"}, report
    assert report["interfaces"] == ["lo"] and report["loopback"] == "open", report
    assert not [t for t, r in report["connect"].items() if r == "open"], report["connect"]
    other_log, config = reads
    assert "FileNotFoundError" in report["read"][other_log], report["read"]  # the storage root is masked
    assert report["read"][config] == "" or "Error" in report["read"][config], report["read"]  # hidden
    assert report["jobs_seen"] == [job["id"]], report["jobs_seen"]
    attempt = Path(running["output_dir"]).parent / "attempt-1"
    assert "PermissionError" in report["forged"][str(attempt / "exit.json")], report["forged"]
    assert not (attempt / "exit.json").exists()

    slurm_id = slurm_job_of(running)
    slurm.run("scancel", str(slurm_id))  # a person's, not ADC's
    done = live.wait_for(job["id"], DONE, timeout=120)
    assert done["status"] == "failed", done
    assert f"Slurm job {slurm_id} ended CANCELLED outside ADC" in done["status_reason"], done
    assert squeue(slurm)[slurm_id]["job_state"] == "CANCELLED"
    assert json.loads((attempt / "run" / "exit.json").read_text())["code"] == 0  # written in its own folder, unread
    time.sleep(3)  # a resubmission would show as a new attempt
    assert live.job(job["id"])["attempt"] == 1
