#!/usr/bin/env bash
# The test command: install, make sure NATS and Postgres run, run every test.
#
# With arguments, one pytest process runs exactly what they name (`bash scripts/test.sh tests/unit`).
# Without, the whole suite runs as two pytest processes side by side: tests/e2e with the migration
# benchmark's smoke run in one (it starts a local Slurm like tests/e2e, and two must not run at once),
# everything else in the other (the two take about as long). CI has two cores, and one process leaves one of them mostly idle while a
# trainer imports LLaMA-Factory (single-threaded, ~8 s a start) or a test waits on a stack. Each
# process has its own nats-server, and every test its own database and bus prefix, so the two never
# share state. The e2e process's output is printed when both are done; either failing fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Lint and format first: a finding fails the run before any test starts (rules: pyproject.toml).
.venv/bin/ruff check --quiet . || { echo "ruff check found the problems above (fix: .venv/bin/ruff check --fix .)" >&2; exit 1; }
.venv/bin/ruff format --check --quiet . || { echo "ruff format would change the files above (fix: .venv/bin/ruff format .)" >&2; exit 1; }
bash scripts/services.sh
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi

e2e_log=$(mktemp -t adc-tests-e2e.XXXXXX.log)
beside_e2e=(tests/bench/test_bench_scripts.py::test_migration)
"${pytest[@]}" tests/e2e "${beside_e2e[@]}" >"$e2e_log" 2>&1 &
e2e_pid=$!
# Interrupted: stop the e2e process too (tests/conftest.py turns SIGTERM into an interrupt, so its
# stacks are torn down rather than left running).
trap 'kill -TERM "$e2e_pid" 2>/dev/null || true' INT TERM
echo "tests/e2e and the migration benchmark smoke run beside the rest (pid $e2e_pid, log $e2e_log); their results follow at the end"
started=$SECONDS
rest=0
"${pytest[@]}" --ignore=tests/e2e "${beside_e2e[@]/#/--deselect=}" tests || rest=$?
e2e=0
wait "$e2e_pid" || e2e=$?
trap - INT TERM
echo
echo "============= tests/e2e and the migration benchmark smoke (ran beside the rest) ============="
cat "$e2e_log"
echo "======================================================================="
echo "whole suite: $((SECONDS - started)) s; rest exit $rest, tests/e2e and its smoke exit $e2e"
[ "$rest" -eq 0 ] && [ "$e2e" -eq 0 ]
