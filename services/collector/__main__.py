"""Run a node's collector: python -m services.collector --node NAME [--simulate-gpus N]."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from services.collector.sampler import HostSampler, NvmlGpus, SimulatedGpus
from shared.service import ServiceContext, base_parser, run_service
from worker.__main__ import node_name
from worker.inventory import parse_size, simulated_devices

log = logging.getLogger("collector")


async def serve(ctx: ServiceContext) -> None:
    args = ctx.args
    host = HostSampler()
    gpus = None
    if args.simulate_gpus:
        gpus = SimulatedGpus(simulated_devices(args.simulate_gpus, parse_size(args.gpu_memory)),
                             Path(args.simulated_usage) if args.simulated_usage else None)
    else:
        try:
            gpus = NvmlGpus()
        except Exception as err:
            log.info("no NVML here (%s): host metrics only", type(err).__name__)
    subject = ctx.bus.subjects.metrics(args.node)
    interval = ctx.config.collector.interval
    while not ctx.stop.is_set():
        metrics = host.sample(args.node, time.time())
        if gpus is not None:
            metrics.gpus = gpus.sample()
        try:
            await ctx.bus.nc.publish(subject, metrics.encode())
        except Exception as err:
            log.warning("metrics not sent: %s", err)
        try:
            await asyncio.wait_for(ctx.stop.wait(), interval)
        except asyncio.TimeoutError:
            pass


if __name__ == "__main__":
    parser = base_parser("adc-collector", "Publishes a node's GPU and host telemetry each second")
    parser.add_argument("--node", type=node_name, required=True)
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--gpu-memory", default="80GiB")
    parser.add_argument("--simulated-usage", help="JSON file of per-GPU memory use fractions, re-read each sample")
    run_service("collector", parser, serve, needs_db=False)
