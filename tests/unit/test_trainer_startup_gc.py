"""The trainer gets ready with the cyclic garbage collector off (importing torch, transformers and
LLaMA-Factory walks a million long-lived objects otherwise), and trains with it on."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT

PROBE = """
import gc
import worker.trainer.__main__
print(gc.isenabled())
from worker.trainer.training_run import resume_garbage_collection
resume_garbage_collection()
print(gc.isenabled(), gc.get_freeze_count() > 0)
"""


def test_the_collector_is_off_from_the_trainers_start_and_back_on_for_training():
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert probe.stdout.split() == ["False", "True", "True"], probe.stdout + probe.stderr
