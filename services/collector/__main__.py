"""Run a node's collector: python -m services.collector --node NAME [--simulate-gpus N] [--metrics-port P].

Each `collector.interval` it samples the host and the GPUs and publishes the sample on
`adc.metrics.<node>`. With `--metrics-port` it also serves the latest sample on `/metrics`
with dcgm-exporter's names (shared/contracts/dcgm.py), each GPU labelled with the ADC job
its worker's heartbeat says holds it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry, start_http_server

from services.collector.publish import publish_sample
from services.collector.sampler import HostSampler, NvmlGpus, SimulatedGpus
from shared.contracts import dcgm
from shared.contracts.messages import Heartbeat, NodeMetrics
from shared.contracts.node_devices import node_name, parse_size, simulated_devices
from shared.infra.service import ServiceContext, base_parser, run_service

log = logging.getLogger("collector")


class NodeView:
    """The node's latest sample and which job holds each GPU, for /metrics."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.latest: NodeMetrics | None = None
        self.holders: dict[int, str] = {}
        self.holder_pids: dict[int, int] = {}
        self.trainer_pids: dict[int, str] = {}

    def on_heartbeat(self, beat: Heartbeat) -> None:
        self.holders = {g: t.job_id for t in beat.running for g in t.gpus}
        self.holder_pids = {g: t.pid for t in beat.running for g in t.gpus if t.pid}
        self.trainer_pids = {t.pid: t.job_id for t in beat.running if t.pid}

    def owner(self, _node: str, pid: int) -> str | None:
        """The job whose trainer is this process or one of its ancestors (ranks are its children)."""
        try:
            proc: psutil.Process | None = psutil.Process(pid)
            while proc is not None:
                if proc.pid in self.trainer_pids:
                    return self.trainer_pids[proc.pid]
                proc = proc.parent()
        except psutil.Error:
            pass
        return None

    def collect(self):
        if self.latest is None:
            return iter(())
        return iter(dcgm.families([self.latest], lambda _n, g: self.holders.get(g, ""), self.owner))


def open_gpus(args, view: NodeView):
    if args.simulate_gpus:
        return SimulatedGpus(
            simulated_devices(args.simulate_gpus, parse_size(args.gpu_memory)),
            Path(args.simulated_usage) if args.simulated_usage else None,
            holders=lambda: view.holder_pids,
        )
    try:
        return NvmlGpus()
    except Exception as err:
        log.info("no NVML here (%s): host metrics only", type(err).__name__)
        return None


async def serve(ctx: ServiceContext) -> None:
    args = ctx.args
    host = HostSampler()
    view = NodeView(args.node)
    gpus = open_gpus(args, view)
    if args.metrics_port is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(view)
        server, _ = start_http_server(args.metrics_port, addr=args.metrics_address, registry=registry)
        log.info("serving /metrics on %s:%d", args.metrics_address, server.server_port)

    async def on_heartbeat(msg) -> None:
        try:
            view.on_heartbeat(Heartbeat.decode(msg.data))
        except ValueError:
            pass

    sub = await ctx.bus.nc.subscribe(ctx.bus.subjects.heartbeat(args.node), cb=on_heartbeat)
    interval = ctx.config.collector.interval
    try:
        while not ctx.stop.is_set():
            metrics = host.sample(args.node, time.time())
            if gpus is not None:
                try:
                    metrics.gpus = gpus.sample()
                except Exception as err:  # a driver that fails mid-run: say so once, keep the host metrics
                    log.error("NVML failed (%s: %s): host metrics only from now on", type(err).__name__, err)
                    gpus = None
            view.latest = metrics
            try:
                await publish_sample(ctx.bus, metrics)
            except Exception as err:
                log.warning("metrics not sent: %s", err)
            try:
                await asyncio.wait_for(ctx.stop.wait(), interval)
            except TimeoutError:
                pass
    finally:
        await sub.unsubscribe()


if __name__ == "__main__":
    parser = base_parser("adc-collector", "Publishes a node's GPU and host telemetry each second")
    parser.add_argument("--node", type=node_name, required=True)
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--gpu-memory", default="80GiB")
    parser.add_argument(
        "--simulated-usage",
        help="JSON file of per-GPU memory use fractions, re-read each sample;"
        " a GPU it lists reads that, the others the load of the trainer holding them",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve /metrics (dcgm-exporter names) on this port; 9400 is dcgm-exporter's; 0 picks one",
    )
    parser.add_argument("--metrics-address", default="127.0.0.1", help="address /metrics listens on")
    run_service("collector", parser, serve, needs_db=False)
