"""A DeepSpeed checkpoint to resume from is read as data: a pickle in it that would run code is refused,
a real ZeRO checkpoint still loads. DeepSpeed itself, in the trainer's environment (a real engine, one
rank on CPU, writes the checkpoint); what DeepSpeed's resume calls (its checkpoint engine's `load`) reads it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from worker.trainer.interpreter import trainer_python

SCRIPT = r"""
import os, sys, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
# Where the trainer finds DeepSpeed's op, built there by install.sh (worker/trainer/__main__.py).
os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")
out, hooked = sys.argv[1], sys.argv[2] == "hooked"
if hooked:
    from worker.trainer.safe_load import load_checkpoints_as_data
    load_checkpoints_as_data()
import deepspeed
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(out, "payload-ran"),))

real = os.path.join(out, "real", "global_step2")
if not os.path.isdir(real):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                      config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
    for _ in range(2):
        engine.backward(engine(torch.randn(1, 8)).sum())
        engine.step()
    engine.save_checkpoint(os.path.join(out, "real"), tag="global_step2")
engine = TorchCheckpointEngine()
for name in sorted(os.listdir(real)):
    state = engine.load(os.path.join(real, name), map_location="cpu")
    print("loaded", name, sorted(state)[:3], flush=True)
evil = os.path.join(out, "evil.pt")
torch.save({"optimizer_state_dict": Payload()}, evil)
try:
    engine.load(evil, map_location="cpu")
    print("evil loaded", flush=True)
except Exception as err:
    print("evil refused:", type(err).__name__, str(err).splitlines()[0][:200], flush=True)
"""


def _run(out: Path, how: str, port: int) -> subprocess.CompletedProcess:
    python = trainer_python()
    env = {
        "PATH": f"{Path(python).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
        "HOME": str(out),
        "DS_ACCELERATOR": "cpu",
    }
    return subprocess.run(
        [python, "-c", SCRIPT, str(out), how, str(port)], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.fixture
def deepspeed_available():
    # Installed or not, without importing it (torch and DeepSpeed's op loading take seconds): an
    # installed DeepSpeed that fails to import fails the test below rather than skipping it.
    probe = subprocess.run(
        [trainer_python(), "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"no DeepSpeed in the trainer's environment: {probe.stderr[-300:]}")


def test_a_resumed_deepspeed_checkpoint_cannot_run_code_and_a_real_one_loads(tmp_path, deepspeed_available):
    hooked = _run(tmp_path, "hooked", 29000 + os.getpid() % 1000)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert hooked.stdout.count("loaded ") == 2, hooked.stdout  # model states and ZeRO optimizer states
    assert "evil refused: UnpicklingError" in hooked.stdout, hooked.stdout
    assert not (tmp_path / "payload-ran").exists(), "a checkpoint's pickle ran code in the trainer"
    # The same file through DeepSpeed as it ships runs its code: what the trainer's hook prevents.
    plain = _run(tmp_path, "plain", 30000 + os.getpid() % 1000)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "evil loaded" in plain.stdout and (tmp_path / "payload-ran").exists(), plain.stdout
