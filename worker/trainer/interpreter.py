"""Which Python runs the trainer: its own environment, apart from ADC's services.

LLaMA-Factory 0.9.5 pins transformers, peft, accelerate, datasets and trl below what ADC's
services use, and needs torchaudio/torchvision builds that do not load beside the CPU torch of
ADC's environment; scripts/install.sh therefore builds `.venv-trainer` (see README.md). The
worker and the tests launch `python -m worker.trainer` with this interpreter.

Importable without torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TRAINER_PYTHON_ENV = "ADC_TRAINER_PYTHON"
REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINER_VENV = REPO_ROOT / ".venv-trainer"


def trainer_python() -> str:
    """$ADC_TRAINER_PYTHON, else the repo's .venv-trainer, else this interpreter."""
    chosen = os.environ.get(TRAINER_PYTHON_ENV)
    if chosen:
        return chosen
    # The environment's real folder (.venv-trainer links to a cache shared by checkouts): compiled
    # ops (DeepSpeed's, built by install.sh) are keyed by the paths they were built with.
    candidate = TRAINER_VENV.resolve() / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable
