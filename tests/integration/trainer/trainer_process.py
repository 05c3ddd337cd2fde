"""Runs the real trainer as the worker does: a subprocess with a train.yaml, an events file and
a stop file, optionally stopped by the file or by SIGUSR1 once a given step has been logged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from worker.trainer.interpreter import trainer_python

REPO = Path(__file__).resolve().parents[3]
EXAMPLE_DATA = REPO / "examples" / "data"
REFERENCE_LLAMAFACTORY = REPO / ".." / "shared" / "llamafactory"
EXAMPLES = REFERENCE_LLAMAFACTORY.resolve() / "examples"


def example_names(examples: Path = EXAMPLES) -> list[str]:
    """LLaMA-Factory's example configs in `examples`, e.g. `train_lora/qwen3_lora_sft.yaml`."""
    return sorted(str(p.relative_to(examples)) for p in examples.rglob("*.yaml")) if examples.is_dir() else []


def adapted_example(example: str, model_dir: Path, max_steps: int = 2, examples: Path = EXAMPLES) -> dict:
    """An example as it is written, with only the model, the dataset folder (`data` beside
    `examples`), a step cap and bf16 (and pure_bf16) changed (and its DeepSpeed config path made absolute:
    LLaMA-Factory's README runs the examples from its root, the folder holding `examples`).
    output_dir goes: the worker gives every job its own output folder."""
    root = examples.resolve().parent
    train = yaml.safe_load((examples / example).read_text())
    train.update(model_name_or_path=str(model_dir), dataset_dir=str(root / "data"), max_steps=max_steps, bf16=False)
    if train.get("pure_bf16"):  # the other bf16 switch (bf16 weights, no autocast): changed the same way
        train["pure_bf16"] = False
    train.pop("output_dir", None)
    if isinstance(train.get("deepspeed"), str):
        train["deepspeed"] = str(root / train["deepspeed"])
    return train


def base_settings(model_dir: Path, **overrides) -> dict:
    """A small LoRA SFT run on the alpaca fixture: 16 steps of 4 samples, cutoff 64 tokens."""
    settings = {
        "model_name_or_path": str(model_dir),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "alpaca_en_demo",
        "dataset_dir": str(EXAMPLE_DATA),
        "cutoff_len": 64,
        "max_samples": 64,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "learning_rate": 1.0e-3,
        "max_steps": 16,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.1,
        "logging_steps": 1,
        "save_steps": 5,
        "disable_gradient_checkpointing": True,
        "seed": 7,
        "report_to": "none",
        "template": "qwen3_nothink",
    }
    settings.update(overrides)
    return settings


@dataclass
class TrainerRun:
    job_dir: Path
    returncode: int
    events: list[dict] = field(default_factory=list)
    # The kernel's figure for the process and its waited-for children (wait4's ru_maxrss), in bytes.
    peak_rss_bytes: int | None = None

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]

    def one(self, kind: str) -> dict:
        found = self.of(kind)
        assert len(found) == 1, f"expected one {kind!r} event, got {found}; log:\n{self.log_tail()}"
        return found[0]

    @property
    def output_dir(self) -> Path:
        return self.job_dir / "out"

    def progress_steps(self) -> list[int]:
        return [e["step"] for e in self.of("progress")]

    def log_tail(self, lines: int = 40) -> str:
        path = self.job_dir / "trainer.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""


class TrainerProcess:
    def __init__(
        self, job_dir: Path, settings: dict, nproc: int = 1, launcher: str = "launch", extra_env: dict | None = None
    ) -> None:
        self.job_dir = Path(job_dir)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        settings = {"output_dir": str(self.job_dir / "out"), **settings}
        self.config = self.job_dir / "train.yaml"
        self.config.write_text(yaml.safe_dump(settings, sort_keys=False))
        self.events_file = self.job_dir / "events.jsonl"
        self.stop_file = self.job_dir / "STOP"
        python = trainer_python()
        if nproc == 1:
            command = [python, "-m", "worker.trainer", "--config", str(self.config)]
        elif launcher == "torchrun":
            command = [
                python,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(nproc),
                "--master_port",
                str(_free_port()),
                "-m",
                "worker.trainer",
                "--config",
                str(self.config),
            ]
        else:
            command = [
                python,
                "-m",
                "worker.trainer.launch",
                "--nproc-per-node",
                str(nproc),
                "--config",
                str(self.config),
            ]
        env = dict(os.environ)
        env.update(
            ADC_EVENTS_FILE=str(self.events_file),
            ADC_STOP_FILE=str(self.stop_file),
            PYTHONPATH=str(REPO),
            # The same thread count in every run keeps CPU kernels' reduction order, hence bits, the same.
            OMP_NUM_THREADS="1",
        )
        env.update(extra_env or {})
        self.log = open(self.job_dir / "trainer.log", "w")
        self.process = subprocess.Popen(command, cwd=self.job_dir, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def events(self) -> list[dict]:
        if not self.events_file.exists():
            return []
        return [json.loads(line) for line in self.events_file.read_text().splitlines() if line.strip()]

    def wait(self, stop_after_step: int | None = None, stop_by: str = "file", timeout: float = 400) -> TrainerRun:
        deadline = time.monotonic() + timeout
        stop_sent = False
        while True:
            # wait4 rather than poll: the exit also brings the kernel's peak RSS of the process tree.
            pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
            if pid:
                self.process.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                self.process.kill()
                raise TimeoutError(f"trainer in {self.job_dir} did not finish in {timeout}s")
            if stop_after_step is not None and not stop_sent:
                if any(e["event"] == "progress" and e["step"] >= stop_after_step for e in self.events()):
                    if stop_by == "file":
                        self.stop_file.touch()
                    else:
                        self.process.send_signal(signal.SIGUSR1)
                    stop_sent = True
            # The tests take the step the stop landed on from the events, so a late look costs nothing
            # but steps; a busy poll would take CPU from the trainers.
            time.sleep(0.01 if stop_after_step is not None and not stop_sent else 0.2)
        self.log.close()
        return TrainerRun(self.job_dir, self.process.returncode, self.events(), peak_rss_bytes=usage.ru_maxrss * 1024)


def in_parallel(*runs, width: int | None = None):
    """Call the zero-argument functions `width` at a time (default: one per core, at least two) and
    return their results in order. Each runs trainer processes to completion: as many at once as
    there are cores keeps CI's two cores busy while one trainer imports or waits, and no more (more
    only thrash the same cores)."""
    width = width or max(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=min(width, len(runs))) as pool:
        return [future.result() for future in [pool.submit(run) for run in runs]]


def run_trainer(job_dir: Path, settings: dict, **kwargs) -> TrainerRun:
    nproc = kwargs.pop("nproc", 1)
    launcher = kwargs.pop("launcher", "launch")
    return TrainerProcess(job_dir, settings, nproc=nproc, launcher=launcher).wait(**kwargs)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def max_abs_diff(file_a: Path, file_b: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(file_a), load_file(file_b)
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
