"""What the tests that run their own code inside a trainer share: a model folder whose Python
transformers imports under trust_remote_code, the storage it is let loose in, the host's addresses
it tries, and a worker driven over the bus as the executor drives it."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import time
from pathlib import Path

import psutil
from nats.errors import NoRespondersError

from shared.contracts.messages import Command, CommandResult
from shared.infra.config import parse_config
from tests.conftest import models_root


def code_model(tiny_model: Path, folder: Path, name: str, source: str, *, model_class: bool = False) -> Path:
    """The tiny model with an AutoConfig of its own (and with `model_class` an AutoModelForCausalLM) in a
    module that runs `source` first: transformers imports it under trust_remote_code."""
    model = folder / name
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_payload.PayloadConfig"}
    classes = (
        "\nfrom transformers import LlamaConfig, LlamaForCausalLM\n\nclass PayloadConfig(LlamaConfig):\n    pass\n"
    )
    if model_class:
        config["auto_map"]["AutoModelForCausalLM"] = "configuration_payload.PayloadModel"
        classes += "\nclass PayloadModel(LlamaForCausalLM):\n    config_class = PayloadConfig\n"
    (model / "config.json").write_text(json.dumps(config))
    (model / "configuration_payload.py").write_text(source + classes)
    for path in [model, *model.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return model


def stage_storage(tmp_path: Path, tmp_path_factory, *, secret: str, other_log: str, other_team: str):
    """A trusted code root, a root-only secret and another job's log in the same storage:
    (trusted, storage, secret file, the other job's log)."""
    trusted = models_root(tmp_path_factory) / f"trusted-{tmp_path.name}"
    trusted.mkdir(mode=0o755)
    storage = tmp_path / "storage"
    secret_file = tmp_path / "root-only" / "credentials.json"
    secret_file.parent.mkdir(mode=0o700)
    secret_file.write_text(json.dumps({"token": secret}))
    secret_file.chmod(0o600)
    other = storage / "jobs" / "their-job" / "attempt-1"
    other.mkdir(parents=True)
    (other / "trainer.log").write_text(f"{other_log}\n" * 3)
    (storage / "jobs" / "their-job" / "team").write_text(f"{other_team}\n")
    tmp_path.chmod(0o755)
    return trusted, storage, secret_file, other / "trainer.log"


def host_targets(ports: list[int]) -> list[tuple[str, int]]:
    """Every address of this host (loopback included), with each port."""
    addresses = {"127.0.0.1", "::1"}
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6) and "%" not in entry.address:
                addresses.add(entry.address)
    return [(a, p) for a in sorted(addresses) for p in ports]


def tenancy_of(trusted: Path, data_dir: Path):
    """Team alpha reads `trusted` (whose model code may run) and every team the data."""
    return parse_config(
        {
            "tenancy": {
                "team_roots": {"alpha": [str(trusted)]},
                "shared_roots": [str(data_dir)],
                "trusted_code_roots": [str(trusted)],
            }
        },
        env={},
    ).tenancy


async def command(bus, node: str, timeout: float = 60, **fields) -> CommandResult:
    """A signed command to `node`'s worker, retried until it has subscribed."""
    for _ in range(100):
        try:
            reply = await bus.request(bus.subjects.command(node), Command(**fields), timeout, signed=True)
            return CommandResult.decode(reply.data)
        except NoRespondersError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"no worker answers on {bus.subjects.command(node)}")


async def until(predicate, what: str, timeout: float):
    """`predicate()`'s first truthy value, polled; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout:.0f}s")


def train_section(model: Path, data_dir: Path, steps: int) -> dict:
    """A LoRA SFT `train` section for a code model (trust_remote_code: its Python runs in the trainer)."""
    return {
        "model_name_or_path": str(model),
        "trust_remote_code": True,
        "stage": "sft",
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(data_dir),
        "cutoff_len": 64,
        "max_samples": 16,
        "template": "default",
        "per_device_train_batch_size": 1,
        "max_steps": steps,
        "save_steps": 1000,
        "logging_steps": 1,
        "report_to": "none",
    }
