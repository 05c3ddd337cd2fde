"""Bandit benchmark: the learned placement policy (`adc-bandit`) against the rules (`adc`) in the
simulator, with placement quality changing step time (sim/step_model.py: co-location, NUMA,
racks; the same model for every run), on several traces and cluster sizes.

    .venv/bin/python bench/bandit.py [--small] [--jobs N] [--block N] [--seed N] [--plot FOLDER] [--traces DIR]
                                     [--shadow-explore S] [--act-margin M] [--act-after N] [--only LABEL]
                                     [--seeds N [--processes P]] [--slow-nodes SHARE [--slow-factor F]]

Per workload, four runs on the same enriched jobs:
- rules: `adc-bandit-shadow`, which decides exactly as `adc` (the bandit only watches);
- shadow (logging): `adc-bandit-shadow` with `shadow_explore` S: the rules decide, except that a
  share S of the starts the bandit could choose for, within the exploration budget, go to an arm
  drawn uniformly, logged with that propensity; the bandit learns from this log;
- bandit (cold): `adc-bandit` from an empty model, learning online across the trace;
- bandit (from shadow): `adc-bandit` starting from the logging run's model, the path an operator
  takes (shadow first, then active): the run after warm-up.
Prints per run the decisions, how many explored (drawn, in the logging run), how many were placed
off the rules' pick (moved: the confident learner's arm or an exploring draw), mean reward,
throughput per GPU (work done, in GPU-seconds at each job's nominal speed, per GPU-second held)
and average JCT; decision point 2 (memory pressure) per run: its decisions, how many acted on
another response than the rule's, mean reward, out-of-memory deaths and GPU-seconds lost (what the
responses cost by their rewards plus the progress out-of-memory deaths threw away); decision point 3
(queue knobs) in two more runs with `bandit.knobs` on, shadow (the rules' values, the baseline)
and active (learning from an empty model): windows, windows acted on another setting than the
configured one, mean reward, and the queue's waiting GPU-hours over the windows; the learning curve (mean reward per `--block` decisions, bandit vs rules); and
the off-policy estimate (IPS and DR, 95 % intervals) of the logged model's value from the
logging run's log, beside the value the active run from that model reached. `--plot` writes
learning_<workload>.png. `--small` runs the 300-job fixture at one size (the smoke test).

A run's average JCT moves by up to a tenth with a few perturbed starts, so one seed cannot judge a
policy. `--seeds N` runs each workload at N seeds (each its own job enrichment), only the runs the bar
and its references need (rules, logging, from shadow, fewest neighbours: no cold run, no knob runs),
P simulations at once, and judges the paired ratios
run / rules over the seeds: their median with a distribution-free interval (bench/paired.py), each
figure better, worse or not told apart, and the bar (no figure worse, one better) read from them. Two
references beside it: the logging run (the rules with a few random placements, nothing learned), and
a fixed choice at the other extreme from the rules' best fit (`fewest neighbours`: always the arm on
the node others hold the least of, among those that keep no waiting job back): what any choice among
the point's arms can be worth on that workload.

`--slow-nodes SHARE` makes that share of the nodes (drawn per seed) run every step `--slow-factor`
times slower (sim/step_model.py), a cause no policy is told of: what the rules cannot know in
advance and the bandit can learn from its rewards (each arm names its node). With `--seeds` one more
reference runs: a fixed choice told which nodes are slow (`slow nodes avoided`).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.paired import median_ci  # noqa: E402
from services.decider.bandit.arms import node_feature  # noqa: E402
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
    # The ITP trace with the most jobs of 2-4 devices (1,907 of 12,699), whose step time co-location
    # slows in full (one-device jobs feel half, whole-node jobs have no choice): where placement matters.
    # Its first 10 days (1,376 jobs, 536 of 2-4 devices) on 256 GPUs; on 64 its queue grows for days.
    ("itp-cluster07-256", "msr_itp_elasticflow/cluster07.csv", 256, 10.0),
]
SMALL = [("fixture-300-32", FIXTURE, 32, None)]
NO_SLOW_NODES = (0.0, 1.0)  # (share of nodes slower than the rest, their step-time factor)


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


def run(specs, topology, config, name, options, learner: Learner | None = None, memory: Learner | None = None):
    sim = Simulation(specs, topology, config, name, options)
    if learner is not None:
        sim.core.bandit.restore(learner, None)
    if memory is not None:  # decision point 2's own learner
        sim.core.bandit.memory.learner = memory
    return sim.run()


def _logging(config, share: float):
    """The shadow config with `shadow_explore` set: the logging policy of the off-policy estimate."""
    return config.model_copy(update={"bandit": config.bandit.model_copy(update={"shadow_explore": share})})


def _confidence(config, margin: float | None, after: int | None):
    """The config with `act_margin` / `act_after` set where asked (None: the config's own)."""
    update = {k: v for k, v in (("act_margin", margin), ("act_after", after)) if v is not None}
    return config.model_copy(update={"bandit": config.bandit.model_copy(update=update)}) if update else config


def _setup(trace, gpus, days, seed, jobs, margin, after, slow=NO_SLOW_NODES):
    """One workload's enriched jobs, cluster, options and the two configs (rules, bandit); `slow`: the
    share of nodes that run slower and by what factor (drawn per seed, the same for every run)."""
    base = load_config()
    topology = Topology(gpus)
    enrichment = Enrichment(seed=seed)
    specs = enrich(window(read_trace(trace, seed), 0.0, days)[:jobs], topology.gpus_per_node, enrichment)
    step_model = StepModel().with_slow_nodes(topology.node_names(), *slow, seed=seed)
    options = SimOptions(enrichment=enrichment, step_model=step_model)
    shadow_cfg, active_cfg = (
        _confidence(policy_config(base, p), margin, after) for p in ("adc-bandit-shadow", "adc-bandit")
    )
    return specs, topology, options, shadow_cfg, active_cfg


def _from_shadow(specs, topology, active_cfg, options, logging):
    """The bandit after warm-up: active, starting from the logging run's two learners."""
    epsilon = active_cfg.bandit.epsilon
    placement, memory = logging.bandit.learner, logging.bandit.memory.learner
    return run(
        specs,
        topology,
        active_cfg,
        "bandit (from shadow)",
        options,
        Learner(epsilon, model=placement.to_bytes(), version=placement.version),
        Learner(epsilon, model=memory.to_bytes(), version=memory.version),
    )


def workload(
    label, trace, gpus, days, seed, block, plot_dir, jobs=None, share=0.3, margin=None, after=None, slow=NO_SLOW_NODES
) -> dict:
    specs, topology, options, shadow_cfg, active_cfg = _setup(trace, gpus, days, seed, jobs, margin, after, slow)
    rules = run(specs, topology, shadow_cfg, "rules", options)
    logging = run(specs, topology, _logging(shadow_cfg, share), "shadow (logging)", options)
    shadow_model = logging.bandit.learner
    cold = run(specs, topology, active_cfg, "bandit (cold)", options)
    warm = _from_shadow(specs, topology, active_cfg, options, logging)
    print(f"{label}: {len(specs)} jobs on {gpus} GPUs, seed {seed}, step model {options.step_model}")
    print(
        f"  {'run':<22}{'decisions':>10}{'explored':>9}{'moved':>6}{'mean reward':>12}{'thr/GPU':>9}{'avg JCT s':>11}"
    )
    rows = {}
    for result in (rules, logging, cold, warm):
        f, got = figures(result), rewards(result)
        stats = result.bandit.stats
        mean = sum(got) / len(got) if got else float("nan")
        rows[result.policy] = {"thr": throughput_per_gpu(result, specs), "jct": f["jct_s"]["avg"], "reward": mean}
        moved = sum(1 for log in result.bandit.history if log.acted and log.taken != 0)  # off the rules' pick
        print(
            f"  {result.policy:<22}{stats.decisions:>10,}{stats.explored:>9,}{moved:>6,}{mean:>12.4f}"
            f"{rows[result.policy]['thr']:>9.4f}{f['jct_s']['avg']:>11,.0f}"
        )
    ours, warmed, theirs = rewards(cold), rewards(warm), rewards(rules)
    print(f"  learning curve, mean reward per {block} decisions (bandit cold | bandit from shadow | rules):")
    for i, (a, w, b) in enumerate(zip(curve(ours, block), curve(warmed, block), curve(theirs, block))):
        print(f"    {i * block:>7,}-{(i + 1) * block:<7,} {a:>9.4f} | {w:>9.4f} | {b:>9.4f}")
    logged = [log.record() | {"reward": log.reward} for log in logging.bandit.history]
    confidence = active_cfg.bandit.act_margin, active_cfg.bandit.act_after  # the rule the active run plays
    ope = evaluate(logged, shadow_model, seed, margin=confidence[0], after=confidence[1])
    value = rows["bandit (from shadow)"]["reward"]
    print(
        f"  OPE of the logged model from {ope['decisions']:,} logged decisions, {ope['supported']:,} with support "
        f"(logged with the budget left: every arm had propensity >= {share}/arms; IPS is unbiased on those); "
        f"DR's reward model: vowpalwabbit's cb_adf regression, cross-fitted; the policy evaluated plays "
        f"act_margin {confidence[0]}, act_after {confidence[1]} as the active run does"
    )
    for est in ("bandit_ips", "bandit_dr", "rules_ips", "rules_dr"):
        e = ope[est]
        inside = e["low"] is not None and e["low"] <= value <= e["high"]
        note = f"; active run reached {value:.4f}: {'inside' if inside else 'outside'}" if est.startswith("b") else ""
        print(f"  OPE {est:<11} {e['value']:.4f} [{e['low']:.4f}, {e['high']:.4f}]{note}")
    _memory(rules, logging, cold, warm)
    _knobs(specs, topology, shadow_cfg, active_cfg, options)
    r = rows["rules"]
    for name in ("bandit (cold)", "bandit (from shadow)"):
        w = rows[name]
        print(f"  {name} vs rules: throughput per GPU {w['thr'] / r['thr']:.4f} x, avg JCT {w['jct'] / r['jct']:.4f} x")
    if plot_dir:
        _plot(plot_dir, label, {"bandit (cold)": ours, "bandit (from shadow)": warmed, "rules": theirs}, block)
    return rows


class FixedChoice:
    """A fixed choice in a learner's place, for reference; it learns nothing."""

    epsilon, seed, version = 0.0, 0, 0

    def __init__(self, pick) -> None:
        self.pick = pick  # arms' features -> the arm taken

    def with_epsilon(self, epsilon: float) -> FixedChoice:
        return self

    def draw(self, shared, arms, rng, may_explore, margin=0.0, after=0) -> tuple[int, float, int]:
        chosen = self.pick(arms)
        return chosen, 1.0, chosen

    def learn(self, *outcome) -> None:
        self.version += 1


def fewest_neighbours(arms) -> int:
    """Of the arms that keep no waiting job back, the one on the node others hold the least of (the
    rules' best fit takes the most): the other extreme from the rules at the placement point."""
    free = [i for i, arm in enumerate(arms) if arm.get("log2_blocked", 0.0) == 0.0]
    return min(free, key=lambda i: (arms[i]["neighbours"], i))


def avoiding(slow_nodes):
    """A fixed choice that knows which nodes are slow, as no policy does: the rules' arm unless it is on
    one of them, else the first arm on another node that keeps no waiting job back (the rules' arm when
    none does). What knowing the slow nodes is worth at the placement point."""

    def pick(arms) -> int:
        slow = [node_feature(name) for name in slow_nodes]
        fast = [i for i, arm in enumerate(arms) if not any(key in arm for key in slow)]
        if 0 in fast:
            return 0
        return next((i for i in fast if arms[i].get("log2_blocked", 0.0) == 0.0), 0)

    return pick


RUNS_OVER_SEEDS = ("bandit (from shadow)", "shadow (logging)", "fewest neighbours")
SLOW_NODES_AVOIDED = "slow nodes avoided"


def one_seed(_label, trace, gpus, days, seed, jobs, share, margin, after, slow) -> dict[str, tuple[float, float]]:
    """One workload at one seed: the rules, the logging run, the bandit from its model and the fixed
    fewest-neighbours choice; each run's throughput per GPU and average JCT."""
    specs, topology, options, shadow_cfg, active_cfg = _setup(trace, gpus, days, seed, jobs, margin, after, slow)
    rules = run(specs, topology, shadow_cfg, "rules", options)
    logging = run(specs, topology, _logging(shadow_cfg, share), "shadow (logging)", options)
    warm = _from_shadow(specs, topology, active_cfg, options, logging)
    # The memory point keeps the rules' response, so only placement differs from the rules' run.
    rules_response = FixedChoice(lambda arms: 0)
    fixed = run(
        specs, topology, active_cfg, "fewest neighbours", options, FixedChoice(fewest_neighbours), rules_response
    )
    runs = [rules, logging, warm, fixed]
    if options.step_model.slow_nodes:
        picker = FixedChoice(avoiding(options.step_model.slow_nodes))
        runs.append(run(specs, topology, active_cfg, SLOW_NODES_AVOIDED, options, picker, rules_response))
    return {r.policy: (throughput_per_gpu(r, specs), figures(r)["jct_s"]["avg"]) for r in runs}


def _verdict(ratios: list[float], higher_is_better: bool) -> tuple[str, str]:
    """The median of paired ratios run / rules with its interval, and what it says."""
    median, low, high, coverage = median_ci(ratios)
    text = f"{median:.4f} [{low:.4f}, {high:.4f}]"
    if coverage < 0.95:
        return text, "not judged (6 seeds or more)"
    if low > 1.0:
        return text, "better" if higher_is_better else "worse"
    if high < 1.0:
        return text, "worse" if higher_is_better else "better"
    return text, "not told apart"


def _bar(verdicts: list[str]) -> str:
    """The acceptance bar from the bandit's verdicts (two a workload): no figure worse, one better."""
    if any(v.startswith("not judged") for v in verdicts):
        return "not judged: 6 seeds or more"
    if "worse" in verdicts:
        return "NOT met: worse than the rules on a figure"
    if "better" in verdicts:
        return "met: no figure worse on any workload, better on at least one"
    return "not shown: nothing told apart from the rules"


def across_seeds(workloads, seeds: list[int], processes: int, jobs, share, margin, after, slow=NO_SLOW_NODES) -> str:
    """Each workload at each seed (a seed draws its own job enrichment: model sizes, spikes), the
    bandit after warm-up, the logging run and the fixed fewest-neighbours choice against the rules as
    paired ratios, the median of those over seeds with its distribution-free interval (bench/paired.py),
    and the acceptance bar read from the bandit's: no figure worse on any workload, and one better
    somewhere. Returns the bar's verdict."""
    tasks = [(w, seed) for w in workloads for seed in seeds]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(one_seed, *t[0], t[1], jobs, share, margin, after, slow): t for t in tasks}
        done = {}
        for future in as_completed(futures):
            (label, *_), seed = task = futures[future]
            done[task] = future.result()
            print(f"  {label} seed {seed} done ({len(done)}/{len(tasks)})", file=sys.stderr, flush=True)
    print(
        f"across seeds {seeds[0]}-{seeds[-1]}: {len(seeds)} paired runs per workload; run / rules per seed, "
        "then the median of the ratios [its interval, 95 % or more]"
        + (
            f"; {slow[0]:.1%} of the nodes (drawn per seed, hidden from every policy) run steps {slow[1]} x slower"
            if slow[0] > 0
            else ""
        )
    )
    verdicts = []
    for w in workloads:
        label = w[0]
        print(f"{label}:")
        for name in RUNS_OVER_SEEDS + ((SLOW_NODES_AVOIDED,) if slow[0] > 0 else ()):
            thr = [done[w, s][name][0] / done[w, s]["rules"][0] for s in seeds]
            jct = [done[w, s][name][1] / done[w, s]["rules"][1] for s in seeds]
            (thr_text, thr_says), (jct_text, jct_says) = _verdict(thr, True), _verdict(jct, False)
            print(f"  {name:<22} throughput per GPU {' '.join(f'{x:.4f}' for x in thr)}")
            print(f"  {'':<22} avg JCT            {' '.join(f'{x:.4f}' for x in jct)}")
            print(
                f"  {name} / rules over {len(seeds)} seeds: throughput per GPU {thr_text} {thr_says}, "
                f"avg JCT {jct_text} {jct_says}"
            )
            if name == "bandit (from shadow)":
                verdicts += [thr_says, jct_says]
    bar = _bar(verdicts)
    print(
        f"acceptance bar (after warm-up at least the rules' throughput per GPU and average JCT on every "
        f"workload, better on one): {bar}"
    )
    return bar


def _memory(*results) -> None:
    """Decision point 2 per run: its decisions, mean reward, out-of-memory deaths, GPU-seconds lost."""
    print(
        f"  memory pressure: {'run':<22}{'decisions':>10}{'acted':>7}{'mean reward':>12}{'OOM deaths':>11}{'GPU-s lost':>11}"
    )
    means = {}
    for result in results:
        logs = result.bandit.memory.history
        got = [log.reward for log in logs if log.reward is not None]
        means[result.policy] = mean = sum(got) / len(got) if got else float("nan")
        acted = sum(1 for log in logs if log.acted and log.taken != 0)
        c = result.counters
        # What the responses cost, as their rewards measured it, and the progress out-of-memory deaths threw away.
        lost = sum(log.lost_gpu_s for log in logs if log.lost_gpu_s is not None and not math.isnan(log.lost_gpu_s))
        print(
            f"  memory pressure: {result.policy:<22}{len(logs):>10,}{acted:>7,}{mean:>12.4f}{c.oom_crashes:>11,}"
            f"{lost + c.oom_lost_gpu_s:>11,.0f}"
        )
    for name in ("bandit (cold)", "bandit (from shadow)"):
        print(f"  memory pressure: {name} mean reward {means[name]:.4f} vs rules {means['rules']:.4f}")


def _with_knobs(config):
    return config.model_copy(update={"bandit": config.bandit.model_copy(update={"knobs": True})})


def _knobs(specs, topology, shadow_cfg, active_cfg, options) -> None:
    """Decision point 3 in its own two runs: windows, acted, mean reward, waiting GPU-hours."""
    print(f"  queue knobs: {'run':<22}{'windows':>10}{'acted':>7}{'mean reward':>12}{'waiting GPU-h':>14}")
    means = {}
    for name, config in (("knobs (shadow)", shadow_cfg), ("knobs (active)", active_cfg)):
        logs = run(specs, topology, _with_knobs(config), name, options).bandit.knobs.history
        got = [log.reward for log in logs if log.reward is not None]
        means[name] = mean = sum(got) / len(got) if got else float("nan")
        acted = sum(1 for log in logs if log.acted and log.taken != 0)
        waited = sum(log.waiting_gpu_s for log in logs if log.waiting_gpu_s is not None) / 3600.0
        print(f"  queue knobs: {name:<22}{len(logs):>10,}{acted:>7,}{mean:>12.4f}{waited:>14,.1f}")
    print(
        f"  queue knobs: knobs (active) mean reward {means['knobs (active)']:.4f} vs rules {means['knobs (shadow)']:.4f}"
    )


def _plot(folder: str, label: str, series: dict[str, list[float]], block: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(folder).mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # Each point is the mean over the `block` decisions ending there (markers: a short run has few).
    for (name, values), marker in zip(series.items(), "o^s"):
        points = curve(values, block)
        ax.plot([(i + 1) * block for i in range(len(points))], points, marker=marker, label=name)
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
    parser.add_argument("--shadow-explore", type=float, default=0.3, help="the logging run's shadow_explore")
    parser.add_argument("--act-margin", type=float, default=None, help="bandit.act_margin (default: the config's)")
    parser.add_argument("--act-after", type=int, default=None, help="bandit.act_after (default: the config's)")
    parser.add_argument("--only", action="append", help="run only this workload (by label; repeatable)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="N > 1: seeds --seed .. --seed+N-1, each workload's rules, logging, from-shadow and "
        "fewest-neighbours runs only, judged as paired ratios over the seeds (6 or more for a verdict)",
    )
    parser.add_argument("--processes", type=int, default=1, help="with --seeds: simulations run at once")
    parser.add_argument(
        "--slow-nodes",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="this share of nodes (drawn per seed) runs steps --slow-factor times slower, hidden from every "
        "policy (default 0: none); with --seeds a fixed choice that knows them is run too",
    )
    parser.add_argument("--slow-factor", type=float, default=1.3, help="the slow nodes' step-time factor")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.processes < 1:
        parser.error("--seeds and --processes at least 1")
    if not 0.0 <= args.slow_nodes < 1.0 or args.slow_factor < 1.0:
        parser.error("--slow-nodes a share in [0, 1), --slow-factor at least 1")
    slow = (args.slow_nodes, args.slow_factor)
    chosen = [
        (label, trace if Path(trace).is_absolute() else args.traces / trace, gpus, days)
        for label, trace, gpus, days in (SMALL if args.small else WORKLOADS)
        if not args.only or label in args.only
    ]
    if args.seeds > 1:
        seeds = list(range(args.seed, args.seed + args.seeds))
        across_seeds(
            chosen, seeds, args.processes, args.jobs, args.shadow_explore, args.act_margin, args.act_after, slow
        )
        return 0
    for label, trace_path, gpus, days in chosen:
        workload(
            label,
            trace_path,
            gpus,
            days,
            args.seed,
            args.block,
            args.plot,
            args.jobs,
            args.shadow_explore,
            args.act_margin,
            args.act_after,
            slow,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
