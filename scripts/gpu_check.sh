#!/usr/bin/env bash
# What ADC sees of a machine with NVIDIA GPUs, printed; on a machine without one it says so and
# exits 0 (nothing here can run on CPU only). Run from anywhere:  bash scripts/gpu_check.sh
#   1. the NVML collector: every dcgm-exporter field per GPU (None = not reported by this GPU),
#      the topology the worker registers (NVLink matrix, NUMA node, PCIe common ancestor), and
#      the /metrics lines the collector serves;
#   2. a CUDA LoRA step: ADC's trainer on the tiny Llama, 4 steps, on GPU 0;
#   3. the comm-latency probe with CUDA synchronisation (NCCL across two GPUs, else gloo on CUDA
#      tensors of GPU 0) beside the trainer's step, and the collector's CPU on the real GPUs
#      (bench/collector_overhead.py --device cuda --nvml; the collector part needs NATS).
# Needs a torch build with CUDA for 2 and 3 (scripts/install.sh pins the CPU build: install the
# matching CUDA wheel of torch==2.13.0 into .venv first); without one, those are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-.venv/bin/python}
case $PY in /*) ;; */*) PY="$REPO/$PY" ;; *) PY=$(command -v "$PY") ;; esac  # absolute: step 2 runs elsewhere
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import pynvml; pynvml.nvmlInit(); assert pynvml.nvmlDeviceGetCount() > 0' >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU or driver here (NVML does not answer); nothing to check, skipped"
  exit 0
fi
status=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "== 1. NVML collector"
"$PY" - <<'EOF' || status=1
import time
from services.collector import dcgm
from services.collector.sampler import NvmlGpus
from shared.contracts.messages import NodeMetrics
from worker.inventory import nvml_devices

gpus = NvmlGpus()
gpus.sample()
time.sleep(1.0)
samples = gpus.sample()
for s in samples:
    missing = [k for k, v in s.model_dump().items() if v is None]
    print(f"GPU {s.index} {s.name} {s.uuid} bus {s.pci_bus_id}: memory {s.memory_used_bytes / 2**20:.0f}"
          f"/{s.memory_total_bytes / 2**20:.0f} MiB, util {s.util_pct}%, copy util {s.mem_copy_util_pct}%, "
          f"SM {s.sm_clock_mhz} MHz, memory clock {s.mem_clock_mhz} MHz, {s.temperature_c} C (memory "
          f"{s.memory_temperature_c} C), {s.power_w} W, energy {s.energy_mj} mJ, PCIe replays {s.pcie_replay}, "
          f"ECC corrected/uncorrected {s.ecc_corrected}/{s.ecc_errors}, remapped rows "
          f"{s.remapped_rows_correctable}/{s.remapped_rows_uncorrectable} (failure {s.row_remap_failure}), "
          f"NVLink bandwidth {s.nvlink_bandwidth_total}, NVLink errors {s.nvlink_errors}, last XID {s.last_xid}, "
          f"processes {s.process_memory_bytes}")
    print(f"  not reported by this GPU: {', '.join(missing) or 'none'}")
devices = nvml_devices()
print("topology (as the worker registers it):")
for d in devices:
    links = " ".join(f"{j}:{v}" for j, v in sorted(d.topology.items())) or "(one GPU)"
    print(f"  GPU {d.index}: NVLink domain {d.nvlink_domain}, NUMA node {d.numa_node}, to others {links}")
node = NodeMetrics(node="gpu-check", ts=time.time(), gpus=samples)
text = dcgm.exposition(dcgm.families([node], lambda _n, _g: ("", ""))).decode()
series = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV")]
print(f"/metrics: {len(series)} DCGM series, e.g.")
for line in series[:6]:
    print("  " + line)
assert any(line.startswith("DCGM_FI_DEV_FB_USED{") for line in series), "no DCGM_FI_DEV_FB_USED"
EOF

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  echo "gpu_check: torch in $PY has no CUDA (the CPU build); the CUDA LoRA step and the probe are skipped"
  exit $status
fi

echo "== 2. CUDA LoRA step (ADC's trainer, tiny Llama, GPU 0)"
"$PY" -m worker.trainer.tiny_model --out "$WORK/tiny" >/dev/null || status=1
cat > "$WORK/train.yaml" <<EOF
model_name_or_path: $WORK/tiny
stage: sft
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: alpaca_en_demo
dataset_dir: $REPO/examples/data
cutoff_len: 128
max_samples: 32
per_device_train_batch_size: 2
max_steps: 4
logging_steps: 1
save_steps: 1000
output_dir: $WORK/out
EOF
if (cd "$WORK" && CUDA_VISIBLE_DEVICES=0 ADC_EVENTS_FILE="$WORK/events.jsonl" ADC_STOP_FILE="$WORK/STOP" \
      "$PY" -m worker.trainer --config "$WORK/train.yaml" >"$WORK/trainer.log" 2>&1); then
  "$PY" - "$WORK/events.jsonl" <<'EOF' || status=1
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
progress = [e for e in events if e.get("event") == "progress"]
for e in progress:
    print(f"  step {e['step']}: loss {e['loss']:.4f}, {e['tokens_per_s']:.0f} tokens/s, "
          f"peak GPU memory {e['peak_memory_bytes'] / 2**20:.0f} MiB")
assert progress, "no progress events"
assert events[-1].get("event") == "succeeded", events[-1]
print(f"  ended: succeeded (the trainer trains on cuda:0 whenever torch sees a GPU)")
EOF
else
  echo "  the trainer failed; its log:"; tail -30 "$WORK/trainer.log"; status=1
fi

echo "== 3. comm-latency probe (CUDA-synchronised) beside the step; collector CPU on NVML"
"$PY" bench/collector_overhead.py --device cuda --nvml --seconds 15 --steps 20 2>&1 \
  | grep -v -e "Writing model shards" -e "Loading weights" -e "warnings.warn" || status=1

echo "gpu_check: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
