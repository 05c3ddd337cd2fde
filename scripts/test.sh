#!/usr/bin/env bash
# The test command: install, make sure NATS and Postgres run, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/services.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "$@"
