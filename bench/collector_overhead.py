"""What watching costs: the collector's CPU at 1 Hz, and the comm-latency probe's share of a step.

    .venv/bin/python bench/collector_overhead.py [--seconds 30] [--gpus 8 | --nvml] [--steps 40] [--device cpu|cuda]
                                                 [--baseline REV] [--traced]
  smallest: --seconds 10 --gpus 1 --skip-probe --baseline HEAD~1 --traced

1. The collector, as a node runs it (its own process, 1 Hz, publishing to a NATS with ADC's
   authorization started here, as its node's collector role, and serving /metrics scraped here once a second), on a
   simulated 8-GPU inventory or on the node's real GPUs through NVML (`--nvml`). Its CPU time
   (user + system, from /proc) over the window, as a share of one core. ADC's target: <= 1 %.
   `--baseline REV` runs commit REV's collector beside this tree's (`git archive`), and `--traced`
   two more of this tree's with tracing on, exporting OTLP to a sink started here: one sampling 1 %
   of its publishes (as a large cluster would), one every publish (the worst case). All run at
   once, each as its own node, so they share the same moments of the host; each prints its share.
2. Two ranks (gloo on CPU; NCCL with --device cuda on a machine with two GPUs, else gloo on
   CUDA tensors) train LoRA on the ~13M-parameter tiny Llama, gradients all-reduced each step as
   DDP does. The trainer's own comm-latency probe (ADCCallback._comm_latency_us, with its CUDA
   synchronisation) runs on odd steps only, so steps with and without it share process, model,
   data and machine load; both kinds are printed side by side with their ratio, and the time
   inside the probe is also measured directly, which stays exact on a noisy machine. The probe
   runs once per logging step; here every step, its worst case. ADC's target: <= 1 % of a step.

Figures to read, not a test: nothing here asserts on wall time.
"""

from __future__ import annotations

import argparse
import http.server
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- 1. the collector ------------------------------------------------------------------


@dataclass
class Collector:
    """One collector process: `tree`'s code, as node `node`, with `env` (tracing on, or not)."""

    label: str
    tree: Path
    node: str
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    share: float = 0.0  # of one core, once measured


class _Sink(http.server.BaseHTTPRequestHandler):
    """Takes OTLP/HTTP exports and drops them: what a tracing backend costs is not the collector's."""

    def do_POST(self) -> None:  # noqa: N802 (the handler's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def _serving(c: Collector, httpx) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{c.port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def collector_cpu(seconds: float, gpus: int, nvml: bool, collectors: list[Collector], warmup: float = 5.0) -> int:
    """Each collector's share of one core over the same `seconds` (its `share`); /metrics scrapes of each."""
    import httpx
    import psutil

    from cli.local_services import LocalNats, free_port
    from shared.infra.bus_auth import BusDeployment, CredentialStore

    work = Path(tempfile.mkdtemp(prefix="adc-bench-collector-"))
    bus = BusDeployment(
        f"bench{secrets.token_hex(3)}", tuple(c.node for c in collectors), CredentialStore(work / "keys")
    )
    nats_server = LocalNats(work / "nats", work / "nats.log")
    nats_url = nats_server.start(bus)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    inventory = [] if nvml else ["--simulate-gpus", str(gpus)]
    for c in collectors:
        c.port = free_port()
        env = os.environ | {
            "NATS_URL": nats_url,
            "ADC_BUS_PREFIX": bus.prefix,
            "ADC_BUS_CREDENTIALS_DIR": str(bus.keys.directory),
            "PYTHONPATH": str(c.tree),
        }
        env |= {k: v.format(sink=f"http://127.0.0.1:{sink.server_port}") for k, v in c.env.items()}
        c.proc = subprocess.Popen(
            [sys.executable, "-m", "services.collector", "--node", c.node, "--metrics-port", str(c.port), *inventory],
            env=env,
            cwd=str(c.tree),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    scrapes = 0
    try:
        for c in collectors:  # serving /metrics: imported and sampling (slow to start on a busy host)
            deadline = time.monotonic() + 120
            while not _serving(c, httpx):
                if c.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{c.label}'s collector did not start: {c.proc.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        time.sleep(warmup)  # the first samples are not the steady state
        watched = [psutil.Process(c.proc.pid) for c in collectors]
        before, started = [w.cpu_times() for w in watched], time.monotonic()
        with httpx.Client(timeout=5) as http_client:
            while time.monotonic() - started < seconds:
                for c in collectors:
                    if http_client.get(f"http://127.0.0.1:{c.port}/metrics").status_code == 200:
                        scrapes += 1
                time.sleep(1.0)
        after, elapsed = [w.cpu_times() for w in watched], time.monotonic() - started
    finally:
        for c in collectors:
            c.proc.terminate()
            c.proc.wait(timeout=15)
        sink.shutdown()
        nats_server.stop()
        shutil.rmtree(work, ignore_errors=True)
    for c, b, a in zip(collectors, before, after):
        c.share = ((a.user - b.user) + (a.system - b.system)) / elapsed
    return scrapes // len(collectors)


# --- 2. the comm-latency probe ---------------------------------------------------------


def _rank(rank: int, world: int, port: int, model_dir: str, steps: int, warmup: int, device_kind: str, out: str):
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from worker.trainer.adc_callback import ADCCallback

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    cuda = device_kind == "cuda"
    gpus = torch.cuda.device_count() if cuda else 0
    device = torch.device("cuda", rank % gpus) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda and gpus >= world else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    batch = torch.randint(0, model.config.vocab_size, (2, 128), device=device)
    probe_self = SimpleNamespace(world_size=world, device=device)  # what the probe reads of the callback
    with_probe, without, inside = [], [], []

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    for step in range(warmup + steps):
        sync()
        begin = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)  # what DDP does with the gradients
        flat /= world
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probed = step % 2 == 1
        if probed:  # at the step boundary, where the callback's on_log runs it
            t = time.perf_counter()
            ADCCallback._comm_latency_us(probe_self)
            inside.append(time.perf_counter() - t)
        sync()
        if step >= warmup:
            (with_probe if probed else without).append(time.perf_counter() - begin)
    if rank == 0:
        Path(out).write_text(
            repr(
                {
                    "with": with_probe,
                    "without": without,
                    "inside": inside[warmup // 2 :],
                    "backend": backend,
                    "device": str(device),
                }
            )
        )
    dist.destroy_process_group()


def probe_overhead(steps: int, warmup: int, device_kind: str, model_cache: Path) -> dict:
    import torch.multiprocessing as mp

    from cli.local_services import free_port
    from worker.trainer.tiny_model import SIZES, build_tiny_llama

    model_dir = build_tiny_llama(model_cache / "llama-13m", SIZES["13m"])
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "rank0.txt"
        mp.spawn(_rank, args=(2, free_port(), str(model_dir), steps, warmup, device_kind, str(out)), nprocs=2)
        import ast

        return ast.literal_eval(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="collector measurement window")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs on the collector's node")
    parser.add_argument("--nvml", action="store_true", help="the node's real GPUs through NVML instead")
    parser.add_argument("--steps", type=int, default=40, help="timed training steps (half with the probe)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--baseline", metavar="REV", help="also run commit REV's collector, beside this tree's")
    parser.add_argument("--traced", action="store_true", help="also run this tree's with 1 %% and all publishes traced")
    parser.add_argument("--skip-collector", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "adc-bench-models"))
    args = parser.parse_args(argv)

    if not args.skip_collector:
        collectors = [Collector("this tree", REPO, "bench")]
        if args.baseline:
            from bench.api import export_tree

            rev = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline], capture_output=True, text=True
            ).stdout.strip()
            tree = export_tree(args.baseline, Path(tempfile.mkdtemp(prefix="adc-bench-baseline-")) / "tree")
            collectors.insert(0, Collector(f"{rev or args.baseline} ({args.baseline})", tree, "bench-baseline"))
        if args.traced:
            for label, node, sampler in (
                ("this tree, traced (1% of publishes)", "bench-ratio", {"OTEL_TRACES_SAMPLER_ARG": "0.01"}),
                ("this tree, traced (every publish)", "bench-traced", {"OTEL_TRACES_SAMPLER_ARG": "1"}),
            ):
                traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": "{sink}", "OTEL_TRACES_SAMPLER": "traceidratio"} | sampler
                collectors.append(Collector(label, REPO, node, traced))
        scrapes = collector_cpu(args.seconds, args.gpus, args.nvml, collectors)
        what = "the node's GPUs (NVML)" if args.nvml else f"{args.gpus} simulated GPUs"
        print(
            f"collector at 1 Hz on {what}, /metrics scraped {scrapes} times each in {args.seconds:.0f} s (target <= 1%)"
        )
        for c in collectors:
            print(f"  {c.label:<40}{c.share * 100:>7.2f}% of one core")
    if not args.skip_probe:
        r = probe_overhead(args.steps, args.warmup, args.device, Path(args.model_cache))
        med_with, med_without = statistics.median(r["with"]), statistics.median(r["without"])
        probe = statistics.median(r["inside"])
        print(
            f"\n2 ranks ({r['backend']} on {r['device']}), LoRA on the 13M tiny Llama, batch 2 x 128, "
            f"probe every step (its worst case)"
        )
        print(f"{'':<22}{'median ms':>12}{'mean ms':>12}{'steps':>8}")
        for name, values in (("without the probe", r["without"]), ("with the probe", r["with"])):
            print(
                f"{name:<22}{statistics.median(values) * 1e3:>12.2f}{statistics.fmean(values) * 1e3:>12.2f}"
                f"{len(values):>8}"
            )
        print(
            f"step time with / without (medians): {med_with / med_without:.4f}  "
            f"({(med_with / med_without - 1) * 100:+.2f}%, noisy on a shared machine)"
        )
        print(
            f"time inside the probe: {probe * 1e6:.0f} us = {probe / med_without * 100:.3f}% of a step   (target <= 1%)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
