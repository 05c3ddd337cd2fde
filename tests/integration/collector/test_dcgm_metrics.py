"""A collector on a simulated inventory serves dcgm-exporter's names, labelled with the job
its worker's heartbeat names, with values that follow the driven memory use."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.local_services import free_port
from shared.contracts.messages import Heartbeat, RunningTrainer
from worker.inventory import simulated_devices

GIB = 2**30


def samples(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def scrape_until(url: str, ready, timeout: float = 30) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    got: dict[str, list] = {}
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                got = samples((await http.get(url)).text)
                if ready(got):
                    return got
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} never matched; last scrape: {got.get('DCGM_FI_DEV_FB_USED')}")


def collector(env, node: str, port: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "services.collector", "--node", node, "--metrics-port", str(port), *extra],
        env=os.environ | env.service_env(f"collector-{node}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def fb_used(got: dict, gpu: str) -> float | None:
    return next((s.value for s in got.get("DCGM_FI_DEV_FB_USED", []) if s.labels["gpu"] == gpu), None)


async def test_collector_metrics_have_dcgm_names_labels_and_follow_memory_use(isolated, tmp_path):
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps({"0": 0.25, "1": 0.5}))
    port = free_port()
    bus = await isolated.bus("worker-n1")  # heartbeats as n1's worker sends them
    proc = collector(
        isolated, "n1", port, "--simulate-gpus", "2", "--gpu-memory", "8GiB", "--simulated-usage", str(usage)
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        # The worker's heartbeat says job j1 runs on GPU 1.
        beat = Heartbeat(
            node="n1",
            ts=time.time(),
            started_at=time.time(),
            devices=simulated_devices(2, 8 * GIB),
            running=[RunningTrainer(job_id="j1", attempt=1, pid=os.getpid(), gpus=[1])],
        )

        async def beating() -> None:
            while True:
                await bus.nc.publish(bus.subjects.heartbeat("n1"), beat.encode())
                await asyncio.sleep(0.3)

        beats = asyncio.create_task(beating())
        got = await scrape_until(
            url, lambda g: any(s.labels.get("hpc_job") == "j1" for s in g.get("DCGM_FI_DEV_FB_USED", []))
        )
        used = {s.labels["gpu"]: s for s in got["DCGM_FI_DEV_FB_USED"]}
        free = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_FB_FREE"]}
        util = {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_GPU_UTIL"]}
        assert used["0"].value == 0.25 * 8192 and free["0"] == 0.75 * 8192 and util["0"] == 25.0
        assert used["1"].value == 0.5 * 8192 and util["1"] == 50.0
        assert used["1"].labels == {
            "gpu": "1",
            "UUID": "GPU-simulated-0001",
            "pci_bus_id": "00000000:02:00.0",
            "device": "nvidia1",
            "modelName": "Simulated-GPU",
            "Hostname": "n1",
            "DCGM_FI_DRIVER_VERSION": "",
            "hpc_job": "j1",
        }
        assert used["0"].labels["hpc_job"] == ""
        assert got["adc_node_memory_total_bytes"][0].value > 0

        usage.write_text(json.dumps({"0": 0.9, "1": 0.5}))  # drive GPU 0's memory up
        got = await scrape_until(url, lambda g: fb_used(g, "0") == pytest.approx(0.9 * 8192, abs=1e-3))
        assert {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_FB_FREE"]}["0"] == pytest.approx(
            0.1 * 8192, abs=1e-3
        )
        assert {s.labels["gpu"]: s.value for s in got["DCGM_FI_DEV_GPU_UTIL"]}["0"] == pytest.approx(90.0)
        beats.cancel()
    finally:
        proc.terminate()
        assert proc.wait(timeout=15) == 0
        await bus.close()


async def test_without_nvml_the_collector_serves_host_metrics_and_says_why_once(isolated):
    port = free_port()
    proc = collector(isolated, "n2", port)
    try:
        got = await scrape_until(f"http://127.0.0.1:{port}/metrics", lambda g: bool(g.get("adc_node_cpu_percent")))
        assert not got.get("DCGM_FI_DEV_FB_USED")  # the test host has no NVIDIA driver
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert out.count("no NVML here") == 1, out


# A stand-in trainer: a process tree (a parent and one rank) holding 256 MiB and spinning one core.
_BUSY_TRAINER = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "b = bytearray(256 * 2**20)\\nwhile True: b[0] = (b[0] + 1) % 256"])
rank.wait()
"""


async def test_simulated_gpus_carry_the_load_of_the_trainer_holding_them(isolated, tmp_path):
    usage = tmp_path / "usage.json"
    usage.write_text(json.dumps({"0": 0.25}))  # GPU 0 is driven; GPU 1 follows its trainer
    trainer = subprocess.Popen([sys.executable, "-c", _BUSY_TRAINER], start_new_session=True)
    port = free_port()
    bus = await isolated.bus("worker-n1")
    proc = collector(
        isolated, "n1", port, "--simulate-gpus", "2", "--gpu-memory", "8GiB", "--simulated-usage", str(usage)
    )
    url = f"http://127.0.0.1:{port}/metrics"
    beat = Heartbeat(
        node="n1",
        ts=time.time(),
        started_at=time.time(),
        devices=simulated_devices(2, 8 * GIB),
        running=[RunningTrainer(job_id="j1", attempt=1, pid=trainer.pid, gpus=[1])],
    )

    async def beating() -> None:
        while True:
            await bus.nc.publish(bus.subjects.heartbeat("n1"), beat.encode())
            await asyncio.sleep(0.3)

    beats = asyncio.create_task(beating())
    try:

        def util(got: dict, gpu: str) -> float:
            return next((s.value for s in got.get("DCGM_FI_DEV_GPU_UTIL", []) if s.labels["gpu"] == gpu), 0.0)

        # FB_USED is in MiB: the rank's 256 MiB (and the interpreters around it) show on GPU 1.
        got = await scrape_until(url, lambda g: (fb_used(g, "1") or 0) >= 256 and util(g, "1") >= 50)
        assert fb_used(got, "1") < 1024  # the tree's resident memory, not the device's size
        assert fb_used(got, "0") == 0.25 * 8192 and util(got, "0") == 25.0  # the driven value wins

        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        beat.running = []  # the worker's next heartbeat: the trainer ended
        got = await scrape_until(url, lambda g: fb_used(g, "1") == 0 and util(g, "1") == 0)
    finally:
        beats.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGKILL)
        proc.terminate()
        assert proc.wait(timeout=15) == 0
        await bus.close()
