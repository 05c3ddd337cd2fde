"""A warm trainer: built while the source still trains, resumed from the source's stop checkpoint
the moment the go file names it, and ending bit-identical to an uninterrupted run; the tokenized
dataset the source saved in the job's cache is loaded, not tokenized again."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.integration.trainer.trainer_process import TrainerProcess, max_abs_diff
from tests.waits import until
from worker.trainer.exit_codes import ExitCode


def wait_event(process: TrainerProcess, kind: str, timeout: float = 300) -> dict:
    def found() -> dict | None:
        events = [e for e in process.events() if e["event"] == kind]
        assert events or process.process.poll() is None, f"trainer exited before {kind!r}: {process.log.name}"
        return events[0] if events else None

    return until(found, f"a {kind!r} event", timeout, poll=0.05)


def test_a_warm_trainer_resumes_from_the_checkpoint_its_go_names_bit_identically(lora_runs, tmp_path):
    settings, reference = lora_runs.settings, lora_runs.reference
    cache = {"ADC_TOKENIZED_CACHE": str(tmp_path / "cache" / "tokenized")}
    source = TrainerProcess(tmp_path / "source", settings, extra_env=cache)
    wait_event(source, "started")  # the source tokenized the data and put it in the job's cache
    os.kill(source.process.pid, signal.SIGSTOP)  # held, so that it is mid-training when the target is ready
    [entry] = list((tmp_path / "cache" / "tokenized").iterdir())
    go = tmp_path / "warm" / "go"
    warm = TrainerProcess(
        tmp_path / "warm",
        {**settings, "output_dir": str(tmp_path / "source" / "out")},
        extra_env=cache | {"ADC_GO_FILE": str(go)},
    )
    try:
        _move(source, warm, go, settings, reference, entry, tmp_path)
    finally:  # a failed check leaves no trainer waiting for a go that will never come
        for process in (source, warm):
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait()


def _move(source, warm, go, settings, reference, entry, tmp_path) -> None:
    prepared = wait_event(warm, "prepared")
    # A trainer process of its own, on the host's clock: the second in which it may not start.
    time.sleep(1)  # not a wait: nothing is to happen in it
    assert not [e for e in warm.events() if e["event"] != "prepared"], "a warm trainer trains only after its go"

    source.stop_file.touch()  # the source checkpoint-stops while the target waits
    os.kill(source.process.pid, signal.SIGCONT)
    stopped = source.wait()
    assert stopped.returncode == ExitCode.STOPPED_AFTER_CHECKPOINT, stopped.log_tail()
    checkpoint = stopped.one("stopped")["checkpoint"]
    go.write_text(json.dumps({"resume_from": checkpoint}))
    resumed = warm.wait()

    assert resumed.returncode == ExitCode.SUCCEEDED, resumed.log_tail()
    step = stopped.one("stopped")["step"]
    started = resumed.one("started")
    assert started["step"] == step and started["resumed_from"] == checkpoint
    assert resumed.progress_steps() == list(range(step + 1, settings["max_steps"] + 1))
    assert prepared["ts"] <= stopped.one("stopped")["ts"]
    assert f"Loaded tokenized dataset from {entry}" in (tmp_path / "warm" / "trainer.log").read_text()
    weights = "adapter_model.safetensors"
    assert max_abs_diff(reference.output_dir / weights, tmp_path / "source" / "out" / weights) == 0.0
