#!/usr/bin/env bash
# The test command: install, make sure NATS and Postgres run, run every test.
# Two pytest processes share the tests (ADC_TEST_PROCESSES; 1 runs them in one): most of the suite
# waits on trainers and services rather than computing. Each test file stays in one process
# (--dist loadfile), so a module's stack starts once and its tests keep their order.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/services.sh
processes=${ADC_TEST_PROCESSES:-2}
parallel=(); [ "$processes" -gt 1 ] && parallel=(-n "$processes" --dist loadfile)
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "$@"
