"""Bandit benchmark: the learned placement policy (`adc-bandit`) against the rules (`adc`) in the
simulator, with placement quality changing step time (sim/step_model.py: co-location, NUMA,
racks; the same model for every run), on several traces and cluster sizes.

    .venv/bin/python bench/bandit.py [--small] [--jobs N] [--block N] [--seed N] [--plot FOLDER] [--traces DIR]

Per workload, three runs on the same enriched jobs:
- rules: `adc-bandit-shadow`, which decides exactly as `adc` (the bandit only watches) while it
  logs the rules' placements and their rewards and learns from them;
- bandit (cold): `adc-bandit` from an empty model, learning online across the trace;
- bandit (from shadow): `adc-bandit` starting from the shadow run's model, the path an operator
  takes (shadow first, then active).
Prints per run the decisions, mean reward, throughput per GPU (work done, in GPU-seconds at each
job's nominal speed, per GPU-second held) and average JCT; the learning curve (mean reward per
`--block` decisions, bandit (cold) vs rules); and the off-policy estimate (IPS and DR, 95 %
intervals) of the shadow model's value from the shadow log, beside the value the active run
from that model reached. `--plot` writes learning_<workload>.png. `--small` runs the 300-job
fixture at one size (the smoke test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.decider.bandit.evaluation import evaluate  # noqa: E402
from services.decider.bandit.learner import Learner  # noqa: E402
from shared.infra.config import load_config  # noqa: E402
from sim.cluster import Topology  # noqa: E402
from sim.metrics import figures  # noqa: E402
from sim.policies import policy_config  # noqa: E402
from sim.simulator import SimOptions, Simulation  # noqa: E402
from sim.step_model import StepModel  # noqa: E402
from sim.traces import read_trace, window  # noqa: E402
from sim.workload import Enrichment, enrich  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"  # the reference traces beside the checkout (--traces elsewhere)
FIXTURE = REPO / "tests" / "simulation" / "fixtures" / "itp_cluster02_first300.csv"
WORKLOADS = [  # (name, trace under the traces folder, GPUs, days)
    ("itp-cluster01-64", "msr_itp_elasticflow/cluster01.csv", 64, None),
    ("itp-cluster01-128", "msr_itp_elasticflow/cluster01.csv", 128, None),
    ("itp-cluster06-64", "msr_itp_elasticflow/cluster06.csv", 64, None),
    ("itp-cluster06-128", "msr_itp_elasticflow/cluster06.csv", 128, None),
]
SMALL = [("fixture-300-32", FIXTURE, 32, None)]


def throughput_per_gpu(result, specs) -> float:
    """Work done (GPU-seconds at each job's nominal speed on the devices it asked for) per GPU-second held."""
    by_id = {s.id: s for s in specs}
    work = sum(by_id[j.id].max_steps * by_id[j.id].step_s * by_id[j.id].gpus for j in result.jobs if j.finish_s)
    end = max((j.finish_s for j in result.jobs if j.finish_s), default=0.0)
    held = 0.0
    points = result.timeline + [(end, 0, 0)]
    for (t0, h, _), (t1, _, _) in zip(points, points[1:]):
        held += h * max(0.0, min(t1, end) - t0)
    return work / held if held else 0.0


def rewards(result) -> list[float]:
    return [log.reward for log in result.bandit.history if log.reward is not None]


def curve(values: list[float], block: int) -> list[float]:
    return [sum(values[i : i + block]) / len(values[i : i + block]) for i in range(0, len(values), block)]


def run(specs, topology, config, name, options, learner: Learner | None = None):
    sim = Simulation(specs, topology, config, name, options)
    if learner is not None:
        sim.core.bandit.restore(learner, None)
    return sim.run()


def workload(label, trace, gpus, days, seed, block, plot_dir, jobs=None) -> dict:
    base = load_config()
    topology = Topology(gpus)
    enrichment = Enrichment(seed=seed)
    specs = enrich(window(read_trace(trace, seed), 0.0, days)[:jobs], topology.gpus_per_node, enrichment)
    options = SimOptions(enrichment=enrichment, step_model=StepModel())
    shadow_cfg, active_cfg = policy_config(base, "adc-bandit-shadow"), policy_config(base, "adc-bandit")
    rules = run(specs, topology, shadow_cfg, "rules", options)
    shadow_model = rules.bandit.learner
    cold = run(specs, topology, active_cfg, "bandit (cold)", options)
    warm = run(
        specs, topology, active_cfg, "bandit (from shadow)", options, Learner(0.1, model=shadow_model.to_bytes())
    )
    print(f"{label}: {len(specs)} jobs on {gpus} GPUs, seed {seed}, step model {StepModel()}")
    print(f"  {'run':<22}{'decisions':>10}{'explored':>9}{'mean reward':>12}{'thr/GPU':>9}{'avg JCT s':>11}")
    rows = {}
    for result in (rules, cold, warm):
        f, got = figures(result), rewards(result)
        stats = result.bandit.stats
        mean = sum(got) / len(got) if got else float("nan")
        rows[result.policy] = {"thr": throughput_per_gpu(result, specs), "jct": f["jct_s"]["avg"], "reward": mean}
        print(
            f"  {result.policy:<22}{stats.decisions:>10,}{stats.explored:>9,}{mean:>12.4f}"
            f"{rows[result.policy]['thr']:>9.4f}{f['jct_s']['avg']:>11,.0f}"
        )
    ours, theirs = rewards(cold), rewards(rules)
    print(f"  learning curve, mean reward per {block} decisions (bandit cold | rules):")
    for i, (a, b) in enumerate(zip(curve(ours, block), curve(theirs, block))):
        print(f"    {i * block:>7,}-{(i + 1) * block:<7,} {a:>9.4f} | {b:>9.4f}")
    ope = evaluate([log.record() | {"reward": log.reward} for log in rules.bandit.history], shadow_model, seed)
    value = rows["bandit (from shadow)"]["reward"]
    for est in ("bandit_ips", "bandit_dr", "rules_dr"):
        e = ope[est]
        inside = e["low"] is not None and e["low"] <= value <= e["high"]
        note = f"; active run reached {value:.4f}: {'inside' if inside else 'outside'}" if est != "rules_dr" else ""
        print(
            f"  OPE {est:<11} {e['value']:.4f} [{e['low']:.4f}, {e['high']:.4f}] from {ope['decisions']:,} logged{note}"
        )
    r, w = rows["rules"], rows["bandit (from shadow)"]
    print(
        f"  bandit (from shadow) vs rules: throughput per GPU {w['thr'] / r['thr']:.4f} x, "
        f"avg JCT {w['jct'] / r['jct']:.4f} x"
    )
    if plot_dir:
        _plot(plot_dir, label, curve(ours, block), curve(theirs, block), block)
    return rows


def _plot(folder: str, label: str, ours: list[float], theirs: list[float], block: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(folder).mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # Each point is the mean over the `block` decisions ending there (markers: a short run has few).
    ax.plot([(i + 1) * block for i in range(len(ours))], ours, marker="o", label="bandit (cold)")
    ax.plot([(i + 1) * block for i in range(len(theirs))], theirs, marker="s", label="rules")
    ax.set_xlabel("decisions")
    ax.set_ylabel(f"mean reward per {block}")
    ax.set_title(label)
    ax.legend()
    path = Path(folder) / f"learning_{label}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the 300-job fixture on 32 GPUs only")
    parser.add_argument("--jobs", type=int, default=None, help="only the first N jobs of each trace")
    parser.add_argument("--block", type=int, default=1000, help="decisions per learning-curve point")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", metavar="FOLDER", help="write learning_<workload>.png there")
    parser.add_argument("--traces", type=Path, default=TRACES, help=f"the traces folder (default: {TRACES})")
    args = parser.parse_args(argv)
    for label, trace, gpus, days in SMALL if args.small else WORKLOADS:
        workload(label, args.traces / trace, gpus, days, args.seed, args.block, args.plot, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
