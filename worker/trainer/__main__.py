"""`python -m worker.trainer --config /abs/job_dir/train.yaml` (see README.md for the contract)."""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import socket
import sys


def _end_without_teardown() -> None:
    """Registered first, so it runs last of the exit handlers: once main() has returned (its code in
    `_EXIT_CODE`), every thread is joined and every other exit handler has run, and what is left is
    the interpreter's module teardown, which adds nothing the job keeps but raised the trainer's peak
    resident memory by about 120 MiB (tiny Llama on CPU: wait4's ru_maxrss 1,192 MiB against
    1,068 MiB at the last exit handler). Skipped: logs and stdio flushed, then _exit with main's code
    (LLaMA-Factory and transformers write their output files inside `with` blocks, closed by then).
    An exception out of main() leaves `_EXIT_CODE` unset, and Python ends as usual."""
    if _EXIT_CODE is None:
        return
    import logging

    logging.shutdown()  # LLaMA-Factory's running_log.txt handler (a no-op if logging already shut down)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_CODE)


_EXIT_CODE: int | None = None
atexit.register(_end_without_teardown)  # before any other module registers one: runs last

# Importing torch, transformers and LLaMA-Factory makes about a million objects that live until the
# exit, and the cyclic collector walked them some 1,800 times on the way (a fifth of the imports' CPU
# time, docs/benchmarks.md "Trainer start"). Off until the model and the dataset are built:
# training_run.resume_garbage_collection turns it back on before the first step.
gc.disable()

# The stop request must be caught from the first instant: SIGUSR1's default action kills the
# process, and importing torch/transformers/LLaMA-Factory takes seconds.
from worker.trainer.stop_request import StopRequest

_STOP_REQUEST = StopRequest.from_environment()
_STOP_REQUEST.install_signal_handler()

# Nothing may be fetched from a hub on ADC's nodes: fail fast instead of hanging on the network.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _single_rank_distributed_environment() -> None:
    """DeepSpeed runs only inside torch.distributed (LLaMA-Factory demands FORCE_TORCHRUN, and
    DeepSpeed without the variables tries MPI): give a one-rank run the variables torchrun would."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _torch_extensions_dir() -> None:
    """Where DeepSpeed's compiled CPU op is found: prebuilt in the trainer env by scripts/install.sh.
    torch's loader opens a lock file beside the op even when nothing needs building, which a
    trainer running as another uid, or under bwrap's read-only view, may not write: such a trainer
    gets a copy (about 1 MB, times kept so nothing rebuilds) in its own cache, once per job folder."""
    # torch runs `ninja` from PATH to see that nothing needs building: the env's own ninja, the one
    # install.sh built the op with (another version rewrites ninja's log and rebuilds everything).
    os.environ["PATH"] = os.pathsep.join([os.path.join(sys.prefix, "bin"), os.environ.get("PATH", "")])
    if "TORCH_EXTENSIONS_DIR" in os.environ:
        return
    prebuilt = os.path.join(sys.prefix, "torch_extensions")
    locks = [os.path.join(prebuilt, name, "lock") for name in (os.listdir(prebuilt) if os.path.isdir(prebuilt) else ())]
    if os.access(prebuilt, os.W_OK) and all(os.access(lock, os.W_OK) for lock in locks if os.path.exists(lock)):
        os.environ["TORCH_EXTENSIONS_DIR"] = prebuilt
        return
    import shutil
    import tempfile

    cache = os.environ.get("XDG_CACHE_HOME") or tempfile.gettempdir()
    copy = os.path.join(cache, "torch_extensions")
    if os.path.isdir(prebuilt) and not os.path.isdir(copy):
        os.makedirs(cache, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".torch_extensions-", dir=cache)
        shutil.copytree(prebuilt, os.path.join(staging, "t"), dirs_exist_ok=True)  # copy2: times kept
        try:
            os.rename(os.path.join(staging, "t"), copy)  # several ranks may race: the first copy wins
        except OSError:
            pass
        shutil.rmtree(staging, ignore_errors=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.trainer", description="ADC's fine-tuning trainer")
    parser.add_argument("--config", required=True, help="train.yaml with LLaMA-Factory keys")
    args = parser.parse_args(argv)

    from worker.trainer.events import EventWriter
    from worker.trainer.job_config import load_train_args
    from worker.trainer.training_run import run_and_report

    def load():
        train, adc = load_train_args(args.config)
        if train.get("deepspeed"):
            from worker.trainer.safe_load import load_checkpoints_as_data

            _single_rank_distributed_environment()
            _torch_extensions_dir()
            load_checkpoints_as_data()  # DeepSpeed's resume unpickles with weights_only=False
        return train, adc

    events = EventWriter.from_environment(rank=int(os.environ.get("RANK", "0")))
    try:
        code = run_and_report(load, events, _STOP_REQUEST)
    finally:
        events.close()
        _shutdown_process_group()
    return int(code)


def _shutdown_process_group() -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; a failed teardown must not change the exit code
        pass


if __name__ == "__main__":
    _EXIT_CODE = main()
    sys.exit(_EXIT_CODE)
