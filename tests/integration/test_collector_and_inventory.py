"""Device inventory and the collector's telemetry, published on the real bus."""

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from shared.contracts.messages import NodeMetrics
from worker.inventory import cpu_slots, discover, parse_size, simulated_devices


@pytest.mark.parametrize(
    "text,expected",
    [
        ("80GiB", 80 * 2**30),
        ("24GB", 24 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5TiB", int(1.5 * 2**40)),
        ("1024", 1024),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "80XB", "-1GiB"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_inventory_simulated_or_cpu_slots():
    sim = discover(simulate_gpus=16, gpu_memory="80GiB")
    assert len(sim) == 16 and all(d.simulated and d.memory_total_bytes == 80 * 2**30 for d in sim)
    assert [d.nvlink_domain for d in sim] == [0] * 8 + [1] * 8
    # The test host has no NVIDIA driver: without simulation the worker offers CPU slots.
    assert discover(cpu_slot_count=3) == cpu_slots(3)
    assert simulated_devices(2, 10)[1].index == 1


async def test_collector_publishes_host_and_simulated_gpu_metrics_each_second(isolated, tmp_path):
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps({"0": 0.93, "1": 0.10}))
    bus = await isolated.bus("decider")  # reads metrics, as the decider does
    received: list[NodeMetrics] = []

    async def on_metrics(msg):
        received.append(NodeMetrics.decode(msg.data))

    sub = await bus.nc.subscribe(bus.subjects.metrics("n1"), cb=on_metrics)
    env = os.environ | isolated.service_env("collector-n1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.collector",
            "--node",
            "n1",
            "--simulate-gpus",
            "2",
            "--gpu-memory",
            "80GiB",
            "--simulated-usage",
            str(usage),
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while len(received) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0  # drains and exits cleanly on SIGTERM
        await sub.unsubscribe()
        await bus.close()
    assert len(received) >= 3
    last = received[-1]
    assert last.node == "n1" and last.mem_total_bytes > 0 and 0 <= last.cpu_pct <= 100
    gpu0 = last.gpus[0]
    assert gpu0.simulated and gpu0.memory_used_bytes / gpu0.memory_total_bytes == pytest.approx(0.93, abs=1e-6)
    gaps = [b.ts - a.ts for a, b in zip(received, received[1:])]
    assert all(0.5 < g < 2.0 for g in gaps), gaps
