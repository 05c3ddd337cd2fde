"""Run a node's worker: python -m worker --node NAME [--simulate-gpus N --gpu-memory 80GiB | --cpu-slots N]."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from shared.contracts.node_devices import node_name
from shared.infra.bus_auth import CredentialStore
from shared.infra.command_auth import SignatureVerifier
from shared.infra.service import ServiceContext, base_parser, run_service
from worker.agent import NodeAgent
from worker.backend import Backend, LocalBackend
from worker.inventory import discover, parse_size
from worker.slurm.backend import SlurmBackend
from worker.slurm.inventory import SlurmInventory


async def backend_and_devices(args) -> tuple[Backend, list]:
    """The built-in backend on this host's devices, or Slurm's node of this name with the GPUs Slurm has."""
    if args.backend == "local":
        return LocalBackend(), discover(args.simulate_gpus, args.gpu_memory, args.cpu_slots)
    inventory = SlurmInventory(args.node, parse_size(args.gpu_memory), args.simulate_gpus > 0, args.cpu_slots)
    node = await inventory.read()  # a node Slurm does not know is an error here, at start
    return SlurmBackend(args.node, inventory, args.slurm_signal_grace), inventory.devices_of(node)


async def serve(ctx: ServiceContext) -> None:
    args = ctx.args
    backend, devices = await backend_and_devices(args)
    root = Path(args.storage_root or ctx.config.storage.root).resolve()
    agent = NodeAgent(
        ctx.bus,
        args.node,
        devices,
        root,
        rack=args.rack,
        address=args.address,
        heartbeat_interval=ctx.config.worker.heartbeat_interval,
        trainer_memory_limit=parse_size(args.trainer_memory_limit) if args.trainer_memory_limit else None,
        tenancy=ctx.config.tenancy,
        data_root=Path(ctx.config.storage.data_root or Path.cwd()),
        node_timeout=ctx.config.worker.node_timeout,
        cores=args.cpu_cores,
        commands=SignatureVerifier.from_store(CredentialStore(ctx.config.bus.credentials_dir)),
        backend=backend,
        standby_trainers=ctx.config.worker.standby_trainers,
    )
    await agent.run(ctx.stop)


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


if __name__ == "__main__":
    parser = base_parser("adc-worker", "Runs a node's trainers for ADC")
    default_node = re.sub(r"[^a-z0-9_-]", "-", socket.gethostname().lower())[:63] or "node"
    parser.add_argument("--node", type=node_name, default=default_node, help="this node's name (default: hostname)")
    parser.add_argument("--rack", default="", help="rack label, for topology-aware placement")
    parser.add_argument(
        "--address",
        default="127.0.0.1",
        help="address other nodes reach this one at (rank 0 of a multi-node job listens here)",
    )
    parser.add_argument(
        "--simulate-gpus", type=int, default=0, metavar="N", help="present N simulated GPUs (for machines without them)"
    )
    parser.add_argument("--gpu-memory", default="80GiB", help="memory of each simulated GPU")
    parser.add_argument("--cpu-slots", type=int, default=1, help="job slots when the node has no GPU")
    parser.add_argument(
        "--cpu-cores",
        type=at_least_one,
        metavar="N",
        help="cores this node's trainers share (default: all this process may use); each rank "
        "gets an equal share per device as its thread count",
    )
    parser.add_argument(
        "--backend",
        choices=("local", "slurm"),
        default="local",
        help="local: run trainers as this worker's children (default); slurm: submit each to Slurm as a batch "
        "job on the Slurm node named --node, whose GPUs come from Slurm (with --simulate-gpus N > 0 they "
        "are taken as simulated, for gres device files that stand in for GPUs)",
    )
    parser.add_argument(
        "--slurm-signal-grace",
        type=at_least_one,
        default=120,
        metavar="S",
        help="with --backend slurm: Slurm asks for the checkpoint-stop this long before a job's time limit"
        " (--signal=B:USR1@S)",
    )
    parser.add_argument("--storage-root", help="job folders and checkpoints (default: storage.root)")
    parser.add_argument(
        "--trainer-memory-limit",
        metavar="SIZE",
        help="cap each trainer's address space (RLIMIT_AS), e.g. 6GiB: past it, it runs out of memory",
    )
    run_service("worker", parser, serve, needs_db=False)
