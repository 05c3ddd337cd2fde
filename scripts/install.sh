#!/usr/bin/env bash
# Installs ADC and everything its tests need into .venv, from the repo's own files.
# torch comes first, pinned to the CPU build: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0
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
echo "installed: $(.venv/bin/python -c 'import torch, transformers, peft; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)')"
