"""`python -m worker.trainer --config /abs/job_dir/train.yaml` (see README.md for the contract)."""

from __future__ import annotations

import argparse
import os
import socket
import sys

# The stop request must be caught from the first instant: SIGUSR1's default action kills the
# process, and importing torch/transformers/LLaMA-Factory takes seconds.
from worker.trainer.stop_request import StopRequest

_STOP_REQUEST = StopRequest.from_environment()
_STOP_REQUEST.install_signal_handler()

# Nothing may be fetched from a hub on ADC's nodes: fail fast instead of hanging on the network.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# DeepSpeed's compiled ops live in the trainer env, prebuilt by scripts/install.sh.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def _single_rank_distributed_environment() -> None:
    """DeepSpeed runs only inside torch.distributed (LLaMA-Factory demands FORCE_TORCHRUN, and
    DeepSpeed without the variables tries MPI): give a one-rank run the variables torchrun would."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


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
            _single_rank_distributed_environment()
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
    sys.exit(main())
