"""Standby trainers (worker/standby.py), on a real worker over the real NATS with real trainers.

A start is handed to the node's standby trainer, and the trainer it becomes is confined exactly as a
fresh one: the payload (a model folder's own Python, run by transformers under trust_remote_code inside
the trainer) reports what it can see and do, then lets the training run to its end. Also: a symlink
where the worker expects a folder is not followed into a standby's view, and a standby that died falls
back to a fresh trainer. The handoff holds while a library's at-fork hook starts a thread in every
forked child, as OpenTelemetry's batch span processor does once tracing is on.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from shared.contracts.actions import NodeGpus
from shared.contracts.messages import CommandResult
from shared.infra.command_auth import SignatureVerifier
from tests.conftest import REPO_ROOT, Isolated
from tests.hostile_code import code_model, command, stage_storage, tenancy_of, train_section, until
from worker import mounts
from worker.agent import NodeAgent
from worker.inventory import cpu_slots
from worker.launch_check import LaunchCheck
from worker.sandbox import bubblewrap, sandbox_view
from worker.standby import Standby, StandbyPool, StandbyUnfit

NODE = "node-standby"
ROOT_SECRET = "ROOT-ONLY-5b1d9e"
OTHER_JOB = "OTHER-JOBS-LOG-c03a11"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or bubblewrap() is None, reason="needs root and a working bwrap (scripts/install.sh installs it)"
)

PROBE = r"""
import json, os, resource, socket, sys
P = json.loads(%(params)r)
job = os.path.dirname(os.environ["ADC_FENCE_FILE"])
report = {"cwd": os.getcwd(), "home": os.environ.get("HOME"), "connect": {}}
with open("/proc/self/status") as f:
    status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
report["uid"] = status["Uid"].split()
report["caps"] = {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
report["no_new_privs"] = status["NoNewPrivs"].strip()
report["interfaces"] = sorted(name for _, name in socket.if_nameindex())
report["rlimit_as"] = resource.getrlimit(resource.RLIMIT_AS)[0]
report["omp"] = os.environ.get("OMP_NUM_THREADS")
import torch
report["torch_threads"] = torch.get_num_threads()
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as err:
        return repr(err)
report["storage"] = listing(P["storage"])
report["jobs"] = listing(os.path.join(P["storage"], "jobs"))
report["other_job"] = listing(P["other_job"])
report["secret_dir"] = listing(P["secret_dir"])
for host, port in P["targets"]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        report["connect"]["%%s:%%d" %% (host, port)] = "open"
    except OSError as err:
        report["connect"]["%%s:%%d" %% (host, port)] = repr(err)
    finally:
        s.close()
import datasets.config, huggingface_hub.constants
report["hf_home"] = huggingface_hub.constants.HF_HOME
report["hf_hub_cache"] = huggingface_hub.constants.HF_HUB_CACHE
report["datasets_cache"] = str(datasets.config.HF_DATASETS_CACHE)
if "matplotlib" in sys.modules:
    report["mpl"] = sys.modules["matplotlib"].get_configdir()
left = []
for name, module in list(sys.modules.items()):
    try:
        items = list(vars(module).items())
    except TypeError:
        continue
    for key, value in items:
        if isinstance(value, (str, os.PathLike)) and str(value).startswith("/tmp/adc-standby"):
            left.append(f"{name}.{key}")
report["standby_paths_left"] = left
with open("/proc/self/environ", "rb") as f:
    report["proc_environ"] = [e.decode() for e in f.read().split(b"\0") if e.startswith(b"ADC_JOB_ID=")]
with open(os.path.join(job, "output", "probe.json.tmp"), "w") as f:
    json.dump(report, f)
os.replace(os.path.join(job, "output", "probe.json.tmp"), os.path.join(job, "output", "probe.json"))
"""


_THREAD_IN_FORKED_CHILDREN = threading.Event()
os.register_at_fork(
    after_in_child=lambda: (
        _THREAD_IN_FORKED_CHILDREN.is_set() and threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    )
)


@pytest.fixture
def threads_in_forked_children():
    """While the test runs, every child this process forks starts a thread, as a tracing library's at-fork
    hook does (the worker's own mount child is one)."""
    _THREAD_IN_FORKED_CHILDREN.set()
    yield
    _THREAD_IN_FORKED_CHILDREN.clear()


@pytest.fixture
def stage(tmp_path, tmp_path_factory):
    """A trusted code root, a root-only secret and another job's folder in the same storage."""
    trusted, storage, secret, _ = stage_storage(
        tmp_path, tmp_path_factory, secret=ROOT_SECRET, other_log=OTHER_JOB, other_team="alpha"
    )
    yield trusted, storage, secret
    shutil.rmtree(trusted, ignore_errors=True)


def probe_model(tiny_model: Path, trusted: Path, name: str, params: dict) -> Path:
    return code_model(tiny_model, trusted, name, PROBE % {"params": json.dumps(params)}, model_class=True)


async def _command(bus, **fields) -> CommandResult:
    return await command(bus, NODE, 120, **fields)


async def _until(predicate, what: str, timeout: float = 300.0):
    return await until(predicate, what, timeout)


def _ready(agent: NodeAgent) -> bool:
    return any(s.ready.is_set() for s in agent.standbys.standbys)


async def test_a_start_handed_to_a_standby_is_confined_as_a_fresh_trainer(
    stage, tiny_model, data_dir, threads_in_forked_children
):
    trusted, storage, secret = stage
    env = await asyncio.to_thread(Isolated((NODE,)).open)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    nats_port = int(env.nats_url.rsplit(":", 1)[1])
    params = {
        "storage": str(storage),
        "other_job": str(storage / "jobs" / "their-job"),
        "secret_dir": str(secret.parent),
        "targets": [["127.0.0.1", 5432], ["127.0.0.1", nats_port], ["127.0.0.1", listener.getsockname()[1]]],
    }
    model = probe_model(tiny_model, trusted, "probe", params)
    worker_bus = await env.bus(f"worker-{NODE}")
    executor_bus = await env.bus("executor")
    limit = 24 << 30
    agent = NodeAgent(
        worker_bus,
        NODE,
        cpu_slots(1),
        storage,
        heartbeat_interval=0.5,
        tenancy=tenancy_of(trusted, data_dir),
        data_root=REPO_ROOT,
        commands=SignatureVerifier.from_store(env.keys),
        cores=2,
        trainer_memory_limit=limit,
        standby_trainers=1,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await _until(lambda: _ready(agent), "ready standby")
        standby_pid = next(s.pid for s in agent.standbys.standbys if s.ready.is_set())
        start = dict(
            kind="start",
            attempt=1,
            train=train_section(model, data_dir, steps=3),
            placement=[NodeGpus(node=NODE, gpus=[0])],
            team="alpha",
        )
        result = await _command(executor_bus, job_id="jstandby", **start)
        assert result.ok, result
        assert result.pid == standby_pid  # the standby became the trainer
        job_dir = Path(result.job_dir)
        trainer = agent.trainers["jstandby"]
        await _until(trainer.done.is_set, "trainer exit")
        assert trainer.exit_code == 0, (job_dir / "attempt-1" / "trainer.log").read_text()[-3000:]
        launch = json.loads((job_dir / "attempt-1" / "launch.json").read_text())
        assert launch["standby"] is True and launch["bubblewrap"] is True, launch
        report = json.loads((job_dir / "output" / "probe.json").read_text())
        await _until(lambda: _ready(agent), "replacement standby")  # a new one was launched meanwhile
    finally:
        stop.set()
        await asyncio.wait_for(task, 90)
        await executor_bus.close()
        await worker_bus.close()
        listener.close()
        await asyncio.to_thread(env.close)

    nobody = str(pwd.getpwnam("nobody").pw_uid)
    assert report["uid"] == [nobody] * 4, report["uid"]
    assert all(int(v, 16) == 0 for v in report["caps"].values()), report["caps"]
    assert report["no_new_privs"] == "1"
    assert report["interfaces"] == ["lo"], report["interfaces"]
    assert not [t for t, how in report["connect"].items() if how == "open"], report["connect"]
    assert report["storage"] == ["jobs"] and report["jobs"] == ["jstandby"], report
    assert "FileNotFoundError" in report["other_job"], report["other_job"]
    assert "Error" in report["secret_dir"], report["secret_dir"]
    assert report["cwd"] == str(job_dir) and report["home"] == str(job_dir / "cache" / "home")
    assert report["rlimit_as"] == limit and report["omp"] == "2" and report["torch_threads"] == 2, report
    # What libraries computed at import points into the job's folder, not the standby's.
    assert report["hf_home"] == str(job_dir / "cache" / "huggingface"), report
    assert report["hf_hub_cache"].startswith(str(job_dir / "cache")), report
    assert report["datasets_cache"].startswith(str(job_dir / "cache")), report
    if "mpl" in report:
        assert report["mpl"].startswith(str(job_dir / "cache")), report
    assert report["standby_paths_left"] == [], report["standby_paths_left"]
    assert report["proc_environ"] == ["ADC_JOB_ID=jstandby"]  # what tools read in /proc names the job
    assert any((job_dir / "cache" / "huggingface").rglob("*")), "datasets wrote no cache into the job's folder"


async def _ready_standby(tmp_path: Path, tenancy, data_dir: Path) -> tuple[StandbyPool, Standby]:
    storage = tmp_path / "storage"
    (storage / "jobs").mkdir(parents=True)
    check = LaunchCheck(tenancy, REPO_ROOT, storage)
    pool = StandbyPool("n1", storage, check, count=1, memory_limit=None, threads=1)
    pool.start()
    await _until(lambda: any(s.ready.is_set() for s in pool.standbys), "ready standby")
    return pool, pool.standbys[0]


def _mountinfo(standby: Standby) -> str:
    return Path(f"/proc/{standby._init_pid()}/mountinfo").read_text()


async def test_a_symlink_in_place_of_a_job_folder_is_not_followed_into_a_standby(tmp_path, data_dir):
    tmp_path.chmod(0o755)
    tenancy = tenancy_of(tmp_path / "team", data_dir)
    pool, standby = await _ready_standby(tmp_path, tenancy, data_dir)
    try:
        secret = tmp_path / "root-only"
        secret.mkdir(mode=0o700)
        (secret / "key").write_text(ROOT_SECRET)
        job = pool.storage_root / "jobs" / "jevil"
        job.symlink_to(secret)  # planted where the worker's job folder should be
        plan = pool.launch_check.standby_plan(standby.identity)
        view = sandbox_view(standby.identity, writable=job, readable=plan.readable, hidden=plan.hidden)
        with pytest.raises(mounts.MountError, match="open"):
            mounts.clone_tree(job, writable=True)
        r, w = os.pipe()
        try:
            with pytest.raises((mounts.MountError, StandbyUnfit)):
                await standby.handoff(view, {"HOME": "/"}, job / "attempt-1" / "train.yaml", r, w)
        finally:
            os.close(r)
            os.close(w)
        # Nothing of the secret folder reached the standby's view (it is ended, its namespace gone, or empty).
        if standby.alive():
            assert str(secret) not in _mountinfo(standby) and "jevil" not in _mountinfo(standby)
        # A symlink inside a folder the worker opens is refused too (openat2 without symlinks).
        real_job = pool.storage_root / "jobs" / "jreal"
        real_job.mkdir()
        (real_job / "output").symlink_to(secret)
        with pytest.raises(mounts.MountError):
            mounts.clone_tree(real_job / "output", writable=False)
    finally:
        await standby.end()
        await pool.close()
