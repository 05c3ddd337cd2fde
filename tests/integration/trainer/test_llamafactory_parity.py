"""ADC's trainer against `llamafactory-cli train` alone, on the same train section: what LLaMA-Factory
logs (its trainer_state.json) is the same, step by step, with ADC's hooks in."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from worker.trainer.interpreter import trainer_python


def _log_by_step(output_dir: Path) -> dict[int, dict]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return {entry["step"]: entry for entry in state["log_history"] if "loss" in entry}


def test_tokens_seen_and_losses_match_llamafactory_alone(lora_runs, tmp_path):
    """ADC counts the tokens for tokens/s itself, adding them up at log and save points only
    (token_count.py); LLaMA-Factory alone, asked for the same count, takes transformers' own
    per-micro-batch count. Both logs hold the same numbers at every step."""
    settings = {
        **lora_runs.settings,
        "include_num_input_tokens_seen": "non_padding",
        "disable_tqdm": True,
        "output_dir": str(tmp_path / "out"),
    }
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no ADC code in LLaMA-Factory's run
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", ACCELERATE_TORCH_DEVICE="cpu")
    with open(tmp_path / "run.log", "w") as log:
        done = subprocess.run(
            [str(Path(trainer_python()).parent / "llamafactory-cli"), "train", str(config)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    assert done.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]

    theirs = _log_by_step(tmp_path / "out")
    ours = _log_by_step(lora_runs.reference.output_dir)
    assert sorted(ours) == sorted(theirs) == list(range(1, settings["max_steps"] + 1))
    for step, entry in theirs.items():
        assert ours[step]["num_input_tokens_seen"] == entry["num_input_tokens_seen"] > 0, step
        assert abs(ours[step]["loss"] - entry["loss"]) <= 1e-4 * abs(entry["loss"]), (step, ours[step], entry)
    counts = [theirs[s]["num_input_tokens_seen"] for s in sorted(theirs)]
    assert counts == sorted(set(counts))  # grows every step: counted per step, not once at the end
