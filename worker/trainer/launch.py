"""Single-node launcher for N trainer ranks that keeps the trainer's exit codes.

    python -m worker.trainer.launch --nproc-per-node 2 --config /abs/job/train.yaml

torchrun turns any failing rank into exit 1 and dies on SIGUSR1, which hides the two outcomes
the worker cares most about (stopped-after-checkpoint, out-of-memory). This launcher starts the
ranks itself with the usual torch.distributed environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), forwards SIGUSR1 (stop request), SIGTERM and SIGINT to every rank,
and exits with the ranks' combined code:

    all 0 -> 0; any 76 -> 76; any 2 -> 2; only 75 and 0 -> 75; anything else -> 1.

When a rank fails (not 0, not 75) the others are terminated after a grace period, since they
would otherwise wait in a collective until ddp_timeout. A multi-node job runs one launcher per
node (--rank-offset, --world-size, --master-addr, --master-port), rendezvous set by the executor.

Importable without torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from worker.trainer.events import inherited_events_fd
from worker.trainer.exit_codes import ExitCode

FAILED_RANK_GRACE_S = 10.0


def combine_exit_codes(codes: list[int]) -> int:
    if all(code == ExitCode.SUCCEEDED for code in codes):
        return ExitCode.SUCCEEDED
    if ExitCode.OUT_OF_MEMORY in codes:
        return ExitCode.OUT_OF_MEMORY
    if ExitCode.CONFIG_ERROR in codes:
        return ExitCode.CONFIG_ERROR
    if set(codes) <= {ExitCode.STOPPED_AFTER_CHECKPOINT, ExitCode.SUCCEEDED}:
        return ExitCode.STOPPED_AFTER_CHECKPOINT
    return ExitCode.FAILED


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_environment(
    local_rank: int,
    nproc: int,
    port: int,
    *,
    rank_offset: int = 0,
    world_size: int | None = None,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank_offset + local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size or nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node_rank),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
    )
    # Like torchrun: N ranks sharing the cores must not each start one thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def launch(
    nproc: int,
    trainer_args: list[str],
    master_port: int | None = None,
    *,
    rank_offset: int = 0,
    world_size: int | None = None,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
) -> int:
    """Run this node's ranks. A multi-node job runs one launcher per node, all with the same
    master address and port (rank 0's node) and each with its own rank offset."""
    port = master_port or _free_port()
    command = [sys.executable, "-m", "worker.trainer", *trainer_args]
    events = inherited_events_fd()  # every rank writes to the worker's events file (failures from any rank)
    ranks = [
        subprocess.Popen(
            command,
            env=_rank_environment(
                r,
                nproc,
                port,
                rank_offset=rank_offset,
                world_size=world_size,
                node_rank=node_rank,
                master_addr=master_addr,
            ),
            pass_fds=(events,) if events is not None else (),
        )
        for r in range(nproc)
    ]

    def forward(signum, frame):  # noqa: ARG001 - signal handler signature
        for process in ranks:
            if process.poll() is None:
                process.send_signal(signum)

    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)

    failed_at: float | None = None
    terminated: set[int] = set()
    while any(p.poll() is None for p in ranks):
        codes = [p.returncode for p in ranks if p.returncode is not None]
        if failed_at is None and any(c not in (ExitCode.SUCCEEDED, ExitCode.STOPPED_AFTER_CHECKPOINT) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and not terminated and time.monotonic() - failed_at > FAILED_RANK_GRACE_S:
            terminated = {index for index, process in enumerate(ranks) if process.poll() is None}
            for index in terminated:
                ranks[index].terminate()
        time.sleep(0.05)
    # Ranks we terminated because another failed say nothing about the cause.
    codes = [p.returncode for index, p in enumerate(ranks) if index not in terminated]
    return int(combine_exit_codes(codes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.trainer.launch", description=__doc__.split("\n")[0])
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int)
    parser.add_argument("--master-addr", default="127.0.0.1", help="rank 0's node (multi-node jobs)")
    parser.add_argument("--rank-offset", type=int, default=0, help="global rank of this node's first rank")
    parser.add_argument("--world-size", type=int, help="ranks over all nodes (default: --nproc-per-node)")
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error("--nproc-per-node must be at least 1")
    if args.world_size is not None and args.rank_offset + args.nproc_per_node > args.world_size:
        parser.error("--rank-offset + --nproc-per-node exceeds --world-size")
    if args.world_size and args.world_size > args.nproc_per_node and not args.master_port:
        parser.error("a multi-node job needs --master-port (the same on every node)")
    return launch(
        args.nproc_per_node,
        ["--config", args.config],
        args.master_port,
        rank_offset=args.rank_offset,
        world_size=args.world_size,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
    )


if __name__ == "__main__":
    sys.exit(main())
