"""Export through LLaMA-Factory's export, from the command line. That a trained LoRA job becomes a
standard model folder with the outputs of base + adapter is shown through the whole stack (a worker
runs the export job): tests/e2e/test_llamafactory_examples.py."""

from __future__ import annotations

import subprocess

from tests.integration.trainer.trainer_process import REPO
from worker.trainer.interpreter import trainer_python


def export(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [trainer_python(), "-m", "worker.trainer.export", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_export_refuses_a_folder_without_adapter_or_model(tmp_path):
    done = export("--job-output", str(tmp_path), "--out", str(tmp_path / "x"))
    assert done.returncode == 2 and "neither a LoRA adapter" in done.stderr
