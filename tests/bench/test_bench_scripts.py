"""Every script in bench/ runs at its smallest size and prints its figure lines (not their values).

Each case is the script's own command line, as its docstring documents it, with the sizes turned
down; the patterns are the lines a reader of its output looks for. A new script in bench/ must
get a case here (test_every_bench_script_has_a_smoke_run).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path

import asyncpg
import pytest

from tests.bench.conftest import BENCH, assert_completes, run_bench
from tests.conftest import PG_ADMIN_URL, REPO_ROOT
from tests.integration.trainer.trainer_process import EXAMPLES

SMALL_TRACE = REPO_ROOT / "tests" / "simulation" / "fixtures" / "itp_cluster02_first300.csv"
# Modules of bench/ that are not run on their own: the load the decider benches play, the paired statistics.
LIBRARIES = {
    "telemetry_load.py": ("decider_throughput.py", "scale.py"),
    "paired.py": ("security_cost.py", "pool_reset.py"),
}
NUMBER = r"[0-9][0-9,.]*"


def test_api():
    run = run_bench("api.py", "--rows", "2000", "--jobs", "40", "--clients", "4", "--queries", "3")
    assert_completes(
        run,
        "api.py",
        [
            rf"^submissions: 40 jobs, 4 concurrent clients, 1 api process: {NUMBER} jobs/s \(p50 {NUMBER} ms, p99 {NUMBER} ms\); api CPU {NUMBER} ms per submission",
            rf"^bulk load: 2,000 chained audit rows in {NUMBER} s",
            r"^audit queries over 2,000 rows",
            *(
                rf"^  {shape} +p50 +{NUMBER} ms +p99 +{NUMBER} ms +CPU +{NUMBER} ms"
                for shape in (
                    "by job",
                    "by kind \\(decision\\)",
                    "by rule",
                    "by actor",
                    "by node",
                    "one hour of time",
                    "deep cursor, no filter",
                    "the last 100",
                    "a user's team, by job",
                    "a user's team, all",
                )
            ),
            rf"^verify: 2,0[0-9][0-9] rows intact in {NUMBER} s",
        ],
    )


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout: no commit to compare with")
def test_api_beside_a_baseline():
    run = run_bench(
        "api.py",
        "--rows",
        "1000",
        "--jobs",
        "20",
        "--clients",
        "2",
        "--queries",
        "2",
        "--rounds",
        "1",
        "--baseline",
        "HEAD",
    )
    assert_completes(
        run,
        "api.py",
        [
            r"^submissions, 1 rounds alternating:",
            rf"^  [0-9a-f]+ \(HEAD\) +20 jobs, 2 concurrent clients, 1 api process: {NUMBER} jobs/s",
            rf"^  this tree +20 jobs, 2 concurrent clients, 1 api process: {NUMBER} jobs/s",
            rf"^  after / before: {NUMBER}x the rate, {NUMBER}x the api CPU per submission",
            r"^\(this tree's migrations applied after [0-9a-f]+ \(HEAD\)'s queries: ",
            r"^ +before: [0-9a-f]+ \(HEAD\) +after: this tree",
            rf"^  a user's team, all +p50 +{NUMBER} ms +p99 +{NUMBER} ms +CPU +{NUMBER} ms +p50 +{NUMBER} ms +p99 +{NUMBER} ms",
        ],
    )


def test_collector_overhead(tmp_path):
    run = run_bench(
        "collector_overhead.py",
        "--seconds",
        "2",
        "--gpus",
        "2",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--model-cache",
        str(tmp_path / "models"),
        "--traced",
    )
    assert_completes(
        run,
        "collector_overhead.py",
        [
            rf"^collector at 1 Hz on 2 simulated GPUs, /metrics scraped {NUMBER} times each in 2 s",
            rf"^  this tree +{NUMBER}% of one core",
            rf"^  this tree, traced \(1% of publishes\) +{NUMBER}% of one core",
            rf"^  this tree, traced \(every publish\) +{NUMBER}% of one core",
            rf"^without the probe +{NUMBER} +{NUMBER} +2$",
            rf"^with the probe +{NUMBER} +{NUMBER} +2$",
            rf"^step time with / without \(medians\): {NUMBER}",
            rf"^time inside the probe: {NUMBER} us = {NUMBER}% of a step",
        ],
    )


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout: no commit to compare with")
def test_collector_overhead_beside_a_baseline():
    run = run_bench("collector_overhead.py", "--seconds", "2", "--gpus", "1", "--skip-probe", "--baseline", "HEAD")
    assert_completes(
        run,
        "collector_overhead.py",
        [rf"^  [0-9a-f]+ \(HEAD\) +{NUMBER}% of one core", rf"^  this tree +{NUMBER}% of one core"],
    )


def test_decider_throughput(open_nats):
    run = run_bench(
        "decider_throughput.py",
        "--nodes",
        "24",
        "--seconds",
        "3",
        "--passes",
        "2",
        "--interval",
        "1",
        "--for-s",
        "1",
        env={"ADC_TEST_NATS_URL": open_nats},
    )
    assert_completes(
        run,
        "decider_throughput.py",
        [
            rf"^ingest \(in-process\): {NUMBER} node snapshots/s",
            r"^passes \(in-process, alternating, 2 each\): 24 nodes",
            r"^  every live job re-read \(before\): ",
            r"^  job view kept from the bus \(now\): ",
            r"^live: 24 nodes",
            rf"^  node snapshots ingested: {NUMBER}/s",
            r"^  pass, job view kept from the bus \(now\): ",
        ],
    )


def test_failover():
    run = run_bench("failover.py", "--tries", "1", timeout=600)
    assert_completes(
        run,
        "failover.py",
        [
            rf"^try 1: decider {NUMBER} s, executor {NUMBER} s",
            r"^lease [0-9.]+ s \(leases.lease_s\); decisions: ",
            r"^no decision lost or executed twice$",
        ],
    )


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"LLaMA-Factory examples not found at {EXAMPLES}")
def test_llamafactory_examples():
    # One trainer, and the one example through llamafactory-cli too: the hardware-only configs'
    # refusal on a node is tests/e2e/test_llamafactory_examples.py's (hqq), fp8 and fp16 are
    # tests/integration/trainer's.
    run = run_bench(
        "llamafactory_examples.py",
        "--examples",
        str(EXAMPLES),
        "--only",
        "train_lora/qwen3_lora_sft.yaml",
        "--steps",
        "1",
        "--workers",
        "1",
        "--no-hardware-configs",
        "--versus-cli",
        timeout=900,
    )
    assert_completes(
        run,
        "llamafactory_examples.py",
        [
            r"^trained +train_lora/qwen3_lora_sft.yaml ",
            r": 1 text-only training examples \+ 0 hardware-only configs: 1 trained, 0 refused naming a key, 0 bad;",
            # The same adapted config through llamafactory-cli on the host, side by side.
            r"^trained +trained +train_lora/qwen3_lora_sft.yaml ",
            r"^versus llamafactory-cli: 1 examples: ADC trained 1 .*llamafactory-cli trained 1 ",
            r"^LF trains, ADC does not: 0: -$",
        ],
    )


def test_migration():
    """Cold and warm moves on the built-in workers, and where a local Slurm can run (root with slurm-wlm
    and munge, as CI has) the same script's `--backend slurm`, which prints those rows and Slurm's beside them."""
    from cli.local_slurm import slurm_missing

    slurm = slurm_missing() is None
    # Its own NATS (as `adc up` starts one), a database of its own on the suite's Postgres (and the Slurm run's).
    name = f"adc_bench_migration_{secrets.token_hex(4)}"
    try:
        run = run_bench(
            "migration.py",
            "--sizes",
            "tiny",
            "--steps",
            "200" if slurm else "120",
            *(["--backend", "slurm"] if slurm else []),
            timeout=900,
            env={"DATABASE_URL": PG_ADMIN_URL.rpartition("/")[0] + f"/{name}"},
        )
    finally:
        asyncio.run(_drop_database(name))
        asyncio.run(_drop_database(f"{name}_slurm"))
    assert_completes(
        run,
        "migration.py",
        [
            r"^backend +model +move +decision->source stopped s +decision->target resumed s +training paused s +prepare s"
            r" +stop s +save s +go/start->step s +steps lost +weights$",
            rf"^local +tiny +cold +{NUMBER} +{NUMBER} +{NUMBER} +- +{NUMBER} +{NUMBER} +{NUMBER} +0 +identical$",
            rf"^local +tiny +warm +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +{NUMBER} +0 +identical$",
            *(
                [rf"^slurm +tiny +cold +{NUMBER} +{NUMBER} +{NUMBER} +- +{NUMBER} +{NUMBER} +{NUMBER} +0 +identical$"]
                if slurm
                else []
            ),
        ],
    )


async def _drop_database(name: str) -> None:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def test_scale(open_nats):
    run = run_bench(
        "scale.py",
        "--seconds",
        "6",
        "--nodes",
        "24",
        "--for-s",
        "1",
        "--interval",
        "1",
        "--hot-every",
        "1",
        "--core",
        "0",
        "--bandit",
        "active",  # the reaction budget must hold with the bandit in the loop: its memory point chooses
        env={"ADC_TEST_NATS_URL": open_nats},
    )
    assert_completes(
        run,
        "scale.py",
        [
            r"^scale: 24 nodes x 8 GPUs at 1 Hz.*; bandit active$",
            rf"^  reaction, window satisfied -> decision at the executor: p50 {NUMBER} ms",
            rf"^  bandit decisions by point: memory [1-9][0-9,]* \({NUMBER} on another arm than the rules'\)",
            rf"^  decider CPU: {NUMBER} % of one core",
            rf"^  decider RSS: start {NUMBER} MiB, end {NUMBER} MiB",
        ],
    )


def test_scheduling():
    run = run_bench(
        "scheduling.py", "--only", "--also", f"{SMALL_TRACE}:96", "--policy", "fifo", "--policy", "adc", "--digest"
    )
    assert_completes(
        run,
        "scheduling.py",
        [
            rf"^== {SMALL_TRACE.name}, 96 GPUs: 300 jobs, seed 0, 2 policies: wall {NUMBER} s, CPU {NUMBER} s",
            r"^ *fifo ",
            r"^ *adc ",
            r"^  digest fifo: [0-9a-f]+ \([0-9]+ passes, [0-9]+ starts\)",
            r"^  digest adc: [0-9a-f]+ \([0-9]+ passes, [0-9]+ starts\)",
        ],
    )


def test_bandit(tmp_path):
    run = run_bench("bandit.py", "--small", "--jobs", "120", "--block", "20", "--plot", str(tmp_path))
    assert_completes(
        run,
        "bandit.py",
        [
            r"^fixture-300-32: 120 jobs on 32 GPUs, seed 0, step model StepModel",
            *(
                rf"^  {name} +{NUMBER} +{NUMBER} +{NUMBER} +-?{NUMBER} +{NUMBER} +{NUMBER}$"
                for name in ("rules", "shadow \\(logging\\)", "bandit \\(cold\\)", "bandit \\(from shadow\\)")
            ),
            r"^  learning curve, mean reward per 20 decisions \(bandit cold \| bandit from shadow \| rules\):",
            rf"^ +{NUMBER}-{NUMBER} +-?{NUMBER} \| +-?{NUMBER} \| +-?{NUMBER}$",
            rf"^  OPE of the logged model from {NUMBER} logged decisions, {NUMBER} with support",
            rf"^  OPE bandit_ips +-?{NUMBER} \[-?{NUMBER}, -?{NUMBER}\]; active run reached -?{NUMBER}: (inside|outside)",
            rf"^  OPE bandit_dr +-?{NUMBER} \[-?{NUMBER}, -?{NUMBER}\]; active run reached -?{NUMBER}: (inside|outside)",
            rf"^  bandit \(from shadow\) vs rules: throughput per GPU {NUMBER} x, avg JCT {NUMBER} x",
            r"^  memory pressure: run +decisions +acted +mean reward +OOM deaths +GPU-s lost$",
            *(
                rf"^  memory pressure: {name} +{NUMBER} +{NUMBER} +(-?{NUMBER}|nan) +{NUMBER} +{NUMBER}$"
                for name in ("rules", "shadow \\(logging\\)", "bandit \\(cold\\)", "bandit \\(from shadow\\)")
            ),
            rf"^  memory pressure: bandit \(from shadow\) mean reward (-?{NUMBER}|nan) vs rules (-?{NUMBER}|nan)",
            r"^  queue knobs: run +windows +acted +mean reward +waiting GPU-h$",
            *(
                rf"^  queue knobs: {name} +{NUMBER} +{NUMBER} +(-?{NUMBER}|nan) +{NUMBER}$"
                for name in ("knobs \\(shadow\\)", "knobs \\(active\\)")
            ),
            rf"^  queue knobs: knobs \(active\) mean reward (-?{NUMBER}|nan) vs rules (-?{NUMBER}|nan)",
        ],
    )
    assert (tmp_path / "learning_fixture-300-32.png").stat().st_size > 0


def test_bandit_across_seeds():
    run = run_bench("bandit.py", "--small", "--jobs", "60", "--seeds", "6", "--processes", "2", "--slow-nodes", "0.25")
    ratios = rf"{NUMBER} \[{NUMBER}, {NUMBER}\] (better|worse|not told apart)"
    assert_completes(
        run,
        "bandit.py --seeds",
        [
            r"^across seeds 0-5: 6 paired runs per workload",
            r"^fixture-300-32:$",
            rf"^  bandit \(from shadow\) +throughput per GPU( {NUMBER}){{6}}$",
            rf"^ +avg JCT +( {NUMBER}){{6}}$",
            rf"^  bandit \(from shadow\) / rules over 6 seeds: throughput per GPU {ratios}, avg JCT {ratios}$",
            rf"^  shadow \(logging\) / rules over 6 seeds: throughput per GPU {ratios}, avg JCT {ratios}$",
            rf"^  fewest neighbours / rules over 6 seeds: throughput per GPU {ratios}, avg JCT {ratios}$",
            rf"^  slow nodes avoided / rules over 6 seeds: throughput per GPU {ratios}, avg JCT {ratios}$",
            r"^acceptance bar .*: (met|NOT met|not shown)",
        ],
    )


def test_bandit_seed_verdicts():
    from bench.bandit import _bar, _verdict

    lower = [0.97, 0.98, 0.975, 0.99, 0.985, 0.97]
    assert _verdict(lower, higher_is_better=True)[1] == "worse"
    assert _verdict(lower, higher_is_better=False)[1] == "better"  # a shorter JCT
    assert _verdict([0.99, 1.01, 1.0, 0.995, 1.005, 1.002], True)[1] == "not told apart"
    assert _verdict(lower[:5], True)[1].startswith("not judged")
    assert _bar(["not told apart", "better", "not told apart", "not told apart"]).startswith("met")
    assert _bar(["better", "worse"]).startswith("NOT met")
    assert _bar(["not told apart"] * 4).startswith("not shown")


def test_bandit_pass_cost():
    run = run_bench("bandit_pass_cost.py", "--nodes", "40", "--starts", "4", "--passes", "2")
    assert_completes(
        run,
        "bandit_pass_cost.py",
        [
            r"^pass cost: 40 nodes x 8 GPUs, 4 starts that fit a pass, 2 passes each",
            rf"^  bandit off +median {NUMBER} ms, p99 {NUMBER} ms",
            rf"^  bandit active median {NUMBER} ms, p99 {NUMBER} ms",
            rf"^  active / off: median {NUMBER} x; the bandit chose for [1-9][0-9.]* starts a pass",
        ],
    )


def test_pool_reset():
    run = run_bench("pool_reset.py", "--rounds", "2", "--calls", "5")
    per_call = rf"per call: asyncpg's reset +{NUMBER} us, ADC's pool +{NUMBER} us; ADC's / asyncpg's +{NUMBER}  \[{NUMBER}, {NUMBER}\]"
    assert_completes(
        run,
        "pool_reset.py",
        [
            r"^pool calls: 2 rounds of 5 calls per shape and arm",
            *(rf"^  {shape} +{what} +{per_call}" for shape in ("read", "write") for what in ("wall", "CPU")),
        ],
    )


def test_security_cost():
    # One training shape (the two-node one adds two trainer starts; its namespaces: tests/security).
    run = run_bench(
        "security_cost.py",
        "--rounds",
        "2",
        "--jobs",
        "10",
        "--clients",
        "2",
        "--decisions",
        "3",
        "--train-rounds",
        "6",
        "--train-processes",
        "2",
        "--shapes",
        "one",
        timeout=900,
    )
    ratio = rf"{NUMBER}  \[{NUMBER}, {NUMBER}\] \({NUMBER}% CI\)   <= {NUMBER}: "
    assert_completes(
        run,
        "security_cost.py",
        [
            rf"^  auth on +submissions +{NUMBER} jobs/s  CPU +{NUMBER} ms each +decision -> command p50 +{NUMBER} ms",
            rf"^  auth off +submissions +{NUMBER} jobs/s",
            r"^  on/off, median of 2 paired ratios",
            *(
                rf"^    {figure} +{ratio}"
                for figure in (
                    "wall time per submission",
                    "CPU per submission",
                    "CPU per submission, at once",
                    "decision -> command p50",
                    "CPU per decision",
                )
            ),
            rf"^    (bench|nats|postgres|api) +on +{NUMBER} +off +{NUMBER} +difference +[-+]{NUMBER} \[",
            rf"^  one node, 1 rank +in its namespace +{NUMBER} ms/step +on the host's network +{NUMBER} ms/step"
            rf" +ratio ns/host +{ratio}",
            rf"^ +\({NUMBER} pairs with steps in both slices, slices of {NUMBER} ms, {NUMBER} steps counted\)",
            rf"^ +over the 2 pairs of trainers: +{ratio}not judged",
        ],
    )


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"LLaMA-Factory examples not found at {EXAMPLES}")
def test_trainer_vs_llamafactory():
    # 20 steps: the example logs every 10, and the loop is measured between the first and the last log.
    # No warm-up round: two trainer runs, not four (the adc arm's path through the stack: tests/e2e).
    run = run_bench(
        "trainer_vs_llamafactory.py",
        "--rounds",
        "1",
        "--no-warmup",
        "--steps",
        "20",
        "--size",
        "tiny",
        "--presets",
        "lora_sft",
        "--arms",
        "lf,adc",
        "--nice",
        "0",
        timeout=900,
    )
    assert_completes(
        run,
        "trainer_vs_llamafactory.py",
        [
            rf"^lora_sft round 1 lf +samples/s +{NUMBER} .* loop [0-9]+ steps: CPU",
            rf"^lora_sft round 1 adc +samples/s +{NUMBER} .* loop [0-9]+ steps: CPU",
            r"^lora_sft: 1 rounds without warm-up, 20 steps, model tiny",
            rf"^  samples per loop CPU-s ADC job/LF +median {NUMBER}",
        ],
    )


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout: no commit to compare with")
def test_trainer_start():
    # One round: one warm trainer per tree (and the cold one that fills the cache).
    run = run_bench("trainer_start.py", "--rounds", "1", "--size", "tiny", timeout=900)
    assert_completes(
        run,
        "trainer_start.py",
        [
            rf"^round 1 baseline [0-9a-f]+ +start -> prepared +{NUMBER} s wall +{NUMBER} s CPU$",
            rf"^round 1 this tree +start -> prepared +{NUMBER} s wall +{NUMBER} s CPU$",
            rf"^  this tree / baseline +median +{NUMBER} wall +{NUMBER} CPU$",
        ],
    )


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.name for p in BENCH.glob("*.py")}
    here = Path(__file__).parent  # every module of this layer (bench/ui_scale.py has its own)
    tests = [
        name
        for module in here.glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", module.read_text(), re.M)
        if name != "test_every_bench_script_has_a_smoke_run"
    ]
    smoked = {s for s in scripts if any(t == f"test_{s[:-3]}" for t in tests)}
    assert scripts - LIBRARIES.keys() - smoked == set(), "bench scripts without a smoke run here"
    assert all(any(t.startswith(f"test_{s[:-3]}") for s in smoked) for t in tests), (
        "smoke runs of scripts that are gone"
    )
    for library, users in LIBRARIES.items():
        assert all(f"bench.{library.removesuffix('.py')}" in (BENCH / user).read_text() for user in users), library
