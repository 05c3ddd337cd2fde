#!/usr/bin/env bash
# Installs ADC and everything its tests need, from the repo's own files:
# - .venv: ADC's services, CLI and tests. torch comes first, pinned to the CPU build: an
#   unpinned torch would pull a multi-GB CUDA build.
# - .venv-trainer: the training program's own environment, LLaMA-Factory and the versions it
#   pins (worker/trainer/requirements.txt; README.md says why it is separate), with the argument
#   schema the api validates against, exported from LLaMA-Factory. It is built once per content
#   of that file under $ADC_ENV_CACHE (default ~/.cache/adc) and linked here, so a
#   second checkout on the same machine (CI) reuses it instead of installing 7 GB again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"
# Headless Chromium for tests/browser: Debian's package, driven by Playwright (which never downloads one).
# CI must have it; elsewhere a machine without it (no root, no apt) only skips the browser tests.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
      || { [ -n "${CI:-}" ] && { echo "install.sh: cannot install chromium" >&2; exit 1; }; true; }
  fi
  [ -x /usr/bin/chromium ] || echo "install.sh: no /usr/bin/chromium; tests/browser will be skipped" >&2
fi
# bubblewrap: each trainer's file-system sandbox (read-only root, private /tmp, only its job folder
# writable; worker/sandbox.py). Without it trainers still run as an unprivileged uid with an allowlisted
# environment; tenancy.sandbox.bubblewrap: required refuses to start them.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q bubblewrap >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
      || { [ -n "${CI:-}" ] && { echo "install.sh: cannot install bubblewrap" >&2; exit 1; }; true; }
  fi
  command -v bwrap >/dev/null || echo "install.sh: no bwrap; trainers run without a file-system sandbox" >&2
fi
# slurm-wlm and munge: the Slurm backend (worker/slurm/, `adc up --backend slurm`) and its tests, which
# start a one-host Slurm (cli/local_slurm.py). Without them those tests are skipped, saying why.
if ! command -v slurmctld >/dev/null && [ ! -x /usr/sbin/slurmctld ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q slurm-wlm munge >/dev/null 2>&1; } \
      || { [ -n "${CI:-}" ] && { echo "install.sh: cannot install slurm-wlm and munge" >&2; exit 1; }; true; }
  fi
  [ -x /usr/sbin/slurmctld ] || echo "install.sh: no Slurm; the Slurm backend's tests will be skipped" >&2
fi
echo "installed: $(.venv/bin/python -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)')"

requirements=worker/trainer/requirements.txt
key=$(cat "$requirements" worker/trainer/schema_export.py | sha256sum | cut -c1-16)  # the pins and the schema's maker
trainer_env="${ADC_ENV_CACHE:-$HOME/.cache/adc}/trainer-$key"
if [ ! -f "$trainer_env/.adc-complete" ]; then
  rm -rf "$trainer_env"
  mkdir -p "$(dirname "$trainer_env")"
  "$PY" -m venv "$trainer_env"
  "$trainer_env/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # torch first, from the same pins, so no other package pulls a different build.
  "$trainer_env/bin/python" -m pip install -q $(grep -E '^torch(vision|audio)?==' "$requirements")
  "$trainer_env/bin/python" -m pip install -q -r "$requirements"
  PYTHONPATH=. "$trainer_env/bin/python" -m worker.trainer.schema_export --out "$trainer_env/adc_llamafactory_schema.json"
  touch "$trainer_env/.adc-complete"
fi
ln -sfn "$trainer_env" .venv-trainer
# DeepSpeed compiles its CPU shared-memory communication op on first use (26 s on two idle cores,
# minutes on loaded ones): built once here, inside the trainer env, where the trainer looks for it
# (TORCH_EXTENSIONS_DIR, set by worker/trainer/__main__.py), so no job or test pays for it.
if [ ! -f "$trainer_env/torch_extensions/.adc-built" ]; then
  # With the env's own ninja first on PATH, as the trainer runs it (another ninja version would rebuild).
  if PATH="$trainer_env/bin:$PATH" TORCH_EXTENSIONS_DIR="$trainer_env/torch_extensions" "$trainer_env/bin/python" -c \
       'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()' >/dev/null 2>&1; then
    touch "$trainer_env/torch_extensions/.adc-built"
  else
    echo "install.sh: DeepSpeed's CPU op not prebuilt; the first DeepSpeed job on CPU builds it" >&2
  fi
fi
echo "trainer: $(.venv-trainer/bin/python -c 'import llamafactory, torch, transformers; print("llamafactory", llamafactory.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' 2>/dev/null)"
