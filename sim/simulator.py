"""The discrete-event simulation: a trace's jobs arrive, the live decider's code decides, simulated
workers carry the decisions out, and the clock jumps from one event to the next.

The decider here is the live one's code: the rules loaded from the same folders by the same
`RuleRegistry`, the config in force from the same `ScheduledConfig`, one `EngineCore` whose
expectations, cooldowns and rate limit carry from pass to pass, and `Snapshot`s built with
the same `job_from_row` and `admission_order` the live `SnapshotSource` uses. Only the runner
differs: rules run inline (`InlineRunner`), since a wall-time budget means nothing on a
simulated clock.

Passes run when something changes (an arrival, a job finishing, a protocol step ending), as the
live decider wakes on job events, and every `tick_s` of simulated time while jobs wait, or every
`quiet_tick_s` after a quiet pass (nothing decided, nothing held back but starts that do not fit).
The live decider's `controller.interval` is 5 s; between events nothing a rule reads changes
but progress and the passing of cooldowns, so coarser ticks cost little fidelity and most of the time.
Event-driven passes are at least `pass_gap_s` (10 s) apart, as the live ones are at least
`decider.min_tick_gap_s` (0.1 s) apart: a change sooner after a pass is applied at once (a finished
job's devices are free from its end) and decided on by the pass the gap allows. On a dense trace
that halves the passes (Philly, 82 k jobs: a job event every few seconds) for decisions up to 10 s
later than live; a satisfied memory window passes at once, as the live urgent pass does.

What rules see of a job: its spec (devices, priority, preemptible, elastic bounds, multi-node,
`max_steps`) from submission; its step and step time only once the trainer reports them, after
`report_after_s` of running in an attempt, then every `report_every_s`, each report with
multiplicative Gaussian noise of `step_noise` (the trainer's measured step time jitters), drawn
from each job's own stream (seeded by the enrichment seed and the job), so a job's noise does
not depend on which other jobs reported before it.
Never the trace's duration.
Telemetry: GPU memory windows in the live `ClusterView`, fed while a job's memory spike is under
way (sim/memory.py), so oom_protection acts as it would live; the pass that sees a window
satisfied is run when it would be (the live decider wakes on its watch). No CPU or
communication samples are simulated (CPU reads 10 %), so load_balance and comm_jitter stay quiet.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import heapq
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from services.decider.admission_order import admission_order, remember_step_times
from services.decider.bandit.policy import BanditPolicy
from services.decider.core import EngineCore
from services.decider.free_devices import FreeDevices
from services.decider.job_rows import PlacementCache, job_from_row
from services.decider.rule_loader import RuleRegistry
from services.decider.rule_runner import InlineRunner, RunResult, call_rule, describe_error
from services.decider.schedules import ScheduledConfig
from services.decider.snapshot import JobView, Snapshot
from services.decider.telemetry import TelemetryView
from shared.contracts.job_status import JobStatus
from shared.infra.config import AdcConfig
from sim.cluster import RUNNING, SimJob, Topology
from sim.executor import Counters, ProtocolCosts, SimExecutor
from sim.memory import MemoryFeed
from sim.step_model import StepModel
from sim.workload import Enrichment, JobSpec

BUILTIN_RULES = Path(__file__).resolve().parent.parent / "services" / "decider" / "rules"
EPOCH = 1_700_000_000.0  # simulated time 0, as a wall-clock timestamp (schedules read the time of day)
NOISE_BATCH = 16  # step-time noise drawn this many at a time from a job's stream
UNHASHED = {"reason_code"}  # fields of an action the digest leaves out
GC_YOUNG_THRESHOLD = 10_000  # objects allocated between young-generation collections while a simulation runs


@dataclass(frozen=True)
class SimOptions:
    tick_s: float = 60.0
    quiet_tick_s: float = 300.0
    pass_gap_s: float = 10.0
    report_after_s: float = 60.0
    report_every_s: float = 60.0
    step_noise: float = 0.05
    save_every_s: float = 1800.0
    horizon_days: float = 365.0  # stop this long after the last submission, whatever is left
    costs: ProtocolCosts = ProtocolCosts()
    enrichment: Enrichment = Enrichment()
    digest: bool = False  # hash every decision and every pass's pending reasons (SimResult.digest)
    step_model: StepModel | None = None  # placement quality changes step time (sim/step_model.py); None: off


@dataclass
class JobOutcome:
    id: str
    priority: str
    gpus: int
    submit_s: float
    first_start_s: float | None
    finish_s: float | None


@dataclass
class SimResult:
    policy: str
    gpus: int
    jobs: list[JobOutcome]
    counters: Counters
    timeline: list[tuple[float, int, int]]  # (t, devices held, devices making progress), from t on
    passes: int
    wall_s: float
    cpu_s: float = 0.0  # this process's CPU seconds: the figure that holds on a shared machine
    dropped: int = 0  # jobs larger than the whole cluster, never submitted
    rule_ms: dict[str, float] = field(default_factory=dict)
    digest: str | None = None  # with SimOptions.digest: what the decider decided and said, pass by pass
    bandit: object = None  # the bandit policy, its choices kept, when `bandit.mode` is not off


def run_sync(coro):
    """Drive a coroutine that never waits on real I/O (the engine's pass with inline rules)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the simulated pass awaited real I/O")


class SimRunner(InlineRunner):
    """The live InlineRunner's behaviour (each rule in this thread, to completion, errors as data),
    timing wall time only: reading a thread's CPU clock twice per rule costs, on a loaded machine,
    tens of microseconds a call, a fifth of a Philly run, and the simulator reports wall times only."""

    async def run(self, rule, snapshot: Snapshot, config, budget_s: float) -> RunResult:
        started = time.perf_counter()
        try:
            output, error = call_rule(rule, snapshot, config), None
        except Exception as err:  # noqa: BLE001 - isolation: a rule's failure is data
            output, error = None, describe_error(err)
        return RunResult(rule.name, output, error, False, (time.perf_counter() - started) * 1000)


def load_rules(config: AdcConfig) -> dict:
    """The rules the live decider would load for `config`: built-ins plus decider.rules_dir."""
    folders = [BUILTIN_RULES] + ([Path(config.decider.rules_dir)] if config.decider.rules_dir else [])
    registry = RuleRegistry(folders)

    async def validate(rule) -> list[str]:
        try:
            rule.configure(config)
        except Exception as err:  # noqa: BLE001 - reported like the live engine's reload
            return [f"config: {err}"]
        return []

    events = run_sync(registry.scan(validate))
    failed = [e.describe() for e in events if e.error]
    if failed:
        raise ValueError("rules not loaded: " + "; ".join(failed))
    return dict(registry.rules)


class Simulation:
    def __init__(
        self,
        specs: list[JobSpec],
        topology: Topology,
        config: AdcConfig,
        policy: str = "adc",
        options: SimOptions = SimOptions(),
        rules: dict | None = None,
    ) -> None:
        self.topology, self.config, self.policy, self.options = topology, config, policy, options
        self.scheduled = ScheduledConfig(config)
        self.rules = rules if rules is not None else load_rules(config)
        self.core = EngineCore(
            decision_timeout_s=3 * config.controller.timeout,
            max_disruptions_per_minute=config.decider.max_disruptions_per_minute,
            runner=SimRunner(),
        )
        fits = [s for s in specs if s.gpus <= topology.gpus]
        self.dropped = len(specs) - len(fits)
        self.jobs = [SimJob(s) for s in fits]
        self.live: dict[str, SimJob] = {}
        self.executor = SimExecutor(options.costs, options.enrichment, self._schedule, options.save_every_s)
        if options.step_model is not None:
            self.executor.slowdown = self._slowdown
        if config.bandit.mode != "off":  # the learned policy in the same EngineCore, learning as it goes
            self.core.bandit = BanditPolicy(config.bandit, keep_history=True)
        self.memory = MemoryFeed(topology, config, options.enrichment, EPOCH)
        oom = config.strategies.oom_protection
        self.wake_after_s = (oom.for_s if oom.enabled else 0.0) + config.collector.interval
        self.levels = {lv.name: lv.min_gpus for lv in config.strategies.priority_scheduling.levels}
        self.ranks = {lv.name: i for i, lv in enumerate(config.strategies.priority_scheduling.levels)}
        self.placements = PlacementCache()
        self._heap: list = []
        self._seq = 0
        # Kept as jobs change, so a pass costs what changed, not every job known: each live job's
        # view (in arrival order, as the live job table lists them), the jobs holding devices and
        # the running ones; `_touched` are the jobs the executor acted on since the last pass.
        self._views: dict[str, JobView] = {}
        # The step times the running views report, sorted, followed as views change: the queue order's
        # typical step time without a loop over every view (None once a NaN shows: then it loops).
        self._step_times: list[float] | None = []
        self._touched: dict[str, SimJob] = {}
        self._holding: dict[str, SimJob] = {}
        self._running: dict[str, SimJob] = {}
        self._devices: dict[str, tuple[int, int]] = {}  # job -> (devices held, devices making progress)
        self._held = self._progressing = 0
        self._reports: list = []  # (when, seq, job): a running job's next progress report
        self._report_at: dict[
            str, int
        ] = {}  # job -> the sequence number of its one valid entry there (others are stale)
        self.timeline: list[tuple[float, int, int]] = []
        self.passes = 0
        self.rule_ms: dict[str, float] = {}
        self.now = 0.0
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._begun = False
        self._tick_at: float | None = None
        self._due_at: float | None = None  # when a change held back by the pass gap gets its pass
        self._last_pass = -math.inf
        # Event-driven passes at least this far apart, as the live decider's `decider.min_tick_gap_s`
        # (or the coarser `SimOptions.pass_gap_s`); a watched memory window satisfied passes at once,
        # as the live urgent pass does.
        self.pass_gap_s = max(config.decider.min_tick_gap_s, options.pass_gap_s)
        self._node_names = topology.node_names()
        self._node_index = {name: i for i, name in enumerate(self._node_names)}
        self._node_cache: dict[str, tuple[frozenset, object]] = {}
        self._node_views_now: dict[str, object] = dict.fromkeys(self._node_names)  # each node's view, in node order
        self._free_now: dict[str, tuple[int, ...]] = dict.fromkeys(self._node_names)  # and its free devices, sorted
        # Who holds which device, kept as jobs change (each job's held devices as of its last touch,
        # and per node how many holders each device has): a snapshot rebuilds only nodes whose
        # holders changed since the last one, or that decisions in flight book now or did then.
        self._held_parts: dict[str, list] = {}
        self._holders: dict[str, dict[int, int]] = {name: {} for name in self._node_names}
        # The job holding each device (the memory feed samples what it holds); the last to take it,
        # were two ever to hold one (the executor never starts a job on a taken device).
        self._owners: dict[tuple[str, int], SimJob] = {}
        self._dirty_nodes: set[str] = set(self._node_names)
        self._booked_nodes: set[str] = set()
        self._busy = True
        self._digest = hashlib.sha256() if options.digest else None

    # --- events ----------------------------------------------------------------------

    def _schedule(self, t: float, job: SimJob | None, kind: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, job, job.generation if job else 0))

    def run(self, until: float | None = None) -> SimResult:
        """Simulate to the end (or up to simulated second `until`; a later call goes on from there)."""
        # A pass makes and drops thousands of small objects (views, proposals) and leaves few cycles:
        # at the default threshold (700) the collector's young generation runs hundreds of times a
        # simulated hour for nothing (4-5 % of a busy Philly day's CPU). Raised while this runs, then set back.
        thresholds = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, *thresholds[1:])
        try:
            return self._run(until)
        finally:
            gc.set_threshold(*thresholds)

    def _run(self, until: float | None) -> SimResult:
        started, cpu = time.perf_counter(), time.process_time()
        if not self._begun:
            self._begun = True
            for job in self.jobs:
                self._schedule(job.spec.submit_s, job, "arrived")
        last_submit = max((j.spec.submit_s for j in self.jobs), default=0.0)
        horizon = last_submit + self.options.horizon_days * 86400
        while self._heap:
            now = self._heap[0][0]
            if now > horizon or (until is not None and now > until):
                break
            self.now = now
            changed = ticked = urgent = False
            while self._heap and self._heap[0][0] <= now:
                _, _, kind, job, generation = heapq.heappop(self._heap)
                if kind in ("tick", "due"):
                    ticked = ticked or now == (self._tick_at if kind == "tick" else self._due_at)
                    continue
                if kind == "arrived":
                    self.live[job.spec.id] = job
                elif generation != job.generation:
                    continue  # superseded: the job was stopped or moved since
                elif kind in ("spike", "wake", "oom"):
                    if not self._memory_event(job, kind, now):
                        continue
                    urgent = urgent or kind == "wake"
                elif self.executor.step_done(job, kind, now):
                    del self.live[job.spec.id]
                self._touch(job)
                changed = True
            if changed:
                self._record(now)
            if (changed or ticked) and not urgent and now < self._last_pass + self.pass_gap_s:
                # Too soon after the last pass: this change waits for the pass the gap allows.
                if self._due_at is None or self._due_at <= now:
                    self._due_at = self._last_pass + self.pass_gap_s
                    self._schedule(self._due_at, None, "due")
            elif changed or ticked:
                self._pass(now)
                self._last_pass = now
                self._record(now)
                if self._stuck():
                    break
            if len(self.live) > len(self._holding) and (self._tick_at is None or self._tick_at <= now):  # jobs wait
                self._tick_at = now + (self.options.tick_s if self._busy else self.options.quiet_tick_s)
                self._schedule(self._tick_at, None, "tick")
        self.wall_s += time.perf_counter() - started
        self.cpu_s += time.process_time() - cpu
        return SimResult(
            policy=self.policy,
            gpus=self.topology.gpus,
            jobs=[
                JobOutcome(j.spec.id, j.spec.priority, j.spec.gpus, j.spec.submit_s, j.first_start, j.finished)
                for j in self.jobs
            ],
            counters=self.executor.counters,
            timeline=self.timeline,
            passes=self.passes,
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            dropped=self.dropped,
            rule_ms=self.rule_ms,
            digest=self._digest.hexdigest() if self._digest is not None else None,
            bandit=self.core.bandit,
        )

    def _memory_event(self, job: SimJob, kind: str, now: float) -> bool:
        """A spike begins, its window is due to be satisfied, or its attempt dies; True when a pass
        should follow."""
        if job.status != JobStatus.RUNNING:
            return False
        if kind == "spike":
            self.memory.spike(job, now)
            self.executor.counters.memory_spikes += 1
            self._schedule(now + self.wake_after_s, job, "wake")
            self._schedule(now + self.options.enrichment.oom_after_s, job, "oom")
        elif kind == "oom":
            self.executor.out_of_memory(job, now)
        return True

    def _touch(self, job: SimJob) -> None:
        """The executor acted on the job (or it arrived or ended): its view and memberships change."""
        job_id = job.spec.id
        self._touched[job_id] = job
        for members, belongs in (
            (self._holding, job.holds and job_id in self.live),
            (self._running, job.status == RUNNING and job_id in self.live),
        ):
            if belongs:
                members[job_id] = job
            else:
                members.pop(job_id, None)
        owners = self._owners
        for part in self._held_parts.pop(job_id, ()):
            holders = self._holders.setdefault(part.node, {})
            for g in part.gpus:
                if holders[g] == 1:
                    del holders[g]
                else:
                    holders[g] -= 1
                if owners.get((part.node, g)) is job:
                    del owners[(part.node, g)]
            self._dirty_nodes.add(part.node)
        if job_id in self._holding:
            parts = self._held_parts[job_id] = job.held_devices()
            for part in parts:
                holders = self._holders.setdefault(part.node, {})
                for g in part.gpus:
                    holders[g] = holders.get(g, 0) + 1
                    owners[(part.node, g)] = job
                self._dirty_nodes.add(part.node)
        held, progressing = self._devices.pop(job_id, (0, 0))
        self._held -= held
        self._progressing -= progressing
        if job_id in self._holding:
            now = (sum(len(p.gpus) for p in job.held_devices()), job.devices() if job_id in self._running else 0)
            self._devices[job_id] = now
            self._held += now[0]
            self._progressing += now[1]
        if job_id in self._running:
            self._queue_report(job)
        else:
            self._report_at.pop(job_id, None)

    def _slowdown(self, job: SimJob) -> float:
        t = self.topology
        half = max(1, t.gpus_per_node // 2)
        return self.options.step_model.factor(
            job.placement, self._holders, t.gpus_per_node, lambda g: g // half, lambda n: t.rack(self._node_index[n])
        )

    def _stuck(self) -> bool:
        """Jobs wait, nothing runs, nothing was decided, and only ticks are due: nothing will ever change."""
        return not self._busy and not self._holding and all(kind == "tick" for _, _, kind, _, _ in self._heap)

    def current_snapshot(self) -> tuple[Snapshot, AdcConfig]:
        """The snapshot (and config in force) the next pass would decide on, at the current time."""
        ts = EPOCH + self.now
        config, active = self.scheduled.at(ts)
        jobs = self.job_views(self.now)
        if self._step_times is not None:
            remember_step_times(jobs, list(self._step_times))  # a copy: the kept list changes with the next views
        views = self._views  # resolve asks only for the jobs with a decision in flight
        self.core.resolve({j: views[j].status for j in self.core.in_flight if j in views}, self.executor.states, ts)
        snap = self.snapshot(ts, config, jobs, active)
        # What Snapshot.job and FreeDevices.of would work out from the snapshot, from what is kept here:
        # copies, not loops (every simulated node is schedulable).
        snap._memo["by_id"] = dict(views)
        snap._memo["free"] = FreeDevices.from_sorted(self._free_now)
        return snap, config

    def _record(self, now: float) -> None:
        held, busy = self._held, self._progressing
        if not self.timeline or self.timeline[-1][1:] != (held, busy):
            self.timeline.append((now, held, busy))

    # --- a pass ----------------------------------------------------------------------

    def _pass(self, now: float) -> None:
        snap, config = self.current_snapshot()
        result = run_sync(self.core.evaluate(snap, self.rules, config))
        self.passes += 1
        # Quiet: nothing decided and nothing held back but starts that do not fit yet.
        self._busy = bool(result.decisions) or any(v.proposal.kind != "start" for v in result.refused)
        for name, ms in result.timings_ms.items():
            self.rule_ms[name] = self.rule_ms.get(name, 0.0) + ms
        if self._digest is not None:
            self._fingerprint(now, result)
        for decision in result.decisions:
            if decision.rule == "oom_protection":
                acts = self.executor.counters.oom_actions
                acts[decision.action.action] = acts.get(decision.action.action, 0) + 1
            job = self.live.get(decision.action.job_id)
            if job is None:
                self.executor.states[decision.decision_id] = "refused"
                continue
            self.executor.apply(job, decision.action, decision.decision_id, now)
            self._touch(job)

    def _fingerprint(self, now: float, result) -> None:
        """Fold a pass's decisions (all but their random ids), held proposals, rule incidents and
        pending reasons into the digest: two runs with equal digests decided and explained the same, pass by pass."""
        h = self._digest
        h.update(f"pass {now!r}\n".encode())
        # Reason codes are left out: they label the sentences, which are in, so digests taken before
        # the codes existed still compare.
        for d in result.decisions + result.shadow:
            h.update(f"{d.rule} {d.shadow} {d.action.model_dump_json(exclude=UNHASHED)}\n".encode())
        for v in result.refused:
            action = v.proposal.action.model_dump_json(exclude=UNHASHED)
            h.update(f"refused {v.proposal.rule} {action} {v.why}\n".encode())
        for incident in result.incidents:  # a rule that raised decided nothing: that must show too
            h.update(f"incident {incident.kind} {incident.rule} {incident.reason}\n".encode())
        for job_id in sorted(result.pending):
            h.update(f"pending {job_id} {sorted(result.pending[job_id].items())}\n".encode())

    def snapshot(
        self, ts: float, config: AdcConfig, jobs: tuple[JobView, ...], schedules: tuple[str, ...] = ()
    ) -> Snapshot:
        """The snapshot the live SnapshotSource would build for this state (devices of decisions in
        flight count as taken)."""
        booked: dict[str, set[int]] = {}
        for part in self.core.booked():
            booked.setdefault(part.node, set()).update(part.gpus)
        # The simulated time itself, not ts - EPOCH: that loses the low bits (EPOCH is 1.7e9), so a
        # spike's first sample fell just before the spike and its window filled a sample late.
        telemetry = self.memory.telemetry(self.now, self._owners) or TelemetryView.empty(ts)
        return Snapshot(
            ts=ts,
            nodes=self._node_views(booked),
            jobs=jobs,
            telemetry=telemetry,
            schedules=schedules,
            order=admission_order(config, jobs),
        )

    def _node_views(self, booked: dict[str, set[int]]) -> dict:
        """Node views, each reused while its taken devices (held, or booked by a decision in flight)
        stay the same (heartbeats are always fresh); only nodes whose holders or bookings changed are
        looked at again."""
        for name in self._dirty_nodes | self._booked_nodes | booked.keys():
            if name not in self._node_index:
                continue
            taken = frozenset(self._holders.get(name, ())).union(booked.get(name, ()))
            cached = self._node_cache.get(name)
            if cached is None or cached[0] != taken:
                self._node_cache[name] = cached = (
                    taken,
                    self.topology.node_view(self._node_index[name], name, taken, EPOCH),
                )
            self._node_views_now[name] = cached[1]
            self._free_now[name] = cached[1].free_sorted
        self._dirty_nodes = set()
        self._booked_nodes = set(booked)
        return dict(self._node_views_now)  # a copy: the snapshot's own

    def job_views(self, now: float) -> tuple[JobView, ...]:
        """Every live job's view: rebuilt for the jobs touched since the last pass and those whose
        trainer reported progress, kept for the rest."""
        changed = self._touched
        self._touched = {}
        reported: list[SimJob] = []
        reports, running, report_at = self._reports, self._running, self._report_at
        while reports and reports[0][0] <= now:
            _, seq, job = heapq.heappop(reports)
            if job.spec.id not in running or report_at.get(job.spec.id) != seq:
                continue  # it stopped, or was queued again since
            if self._report(job, now):
                reported.append(job)
            self._queue_report(job)
        for job_id, job in changed.items():
            if job_id in self.live:
                self._set_view(
                    job_id, job_from_row(self._row(job), self.levels, self._checkpoints(job), self.placements)
                )
            else:
                self._set_view(job_id, None)
        for job in reported:
            job_id = job.spec.id
            if job_id not in changed and job_id in self._views:
                self._set_view(job_id, self._progressed(self._views[job_id], job))
        return tuple(self._views.values())

    def _set_view(self, job_id: str, view: JobView | None) -> None:
        """Put (or, None, drop) a job's view, and follow the step times the running views report."""
        old = self._views.pop(job_id, None) if view is None else self._views.get(job_id)
        if view is not None:
            self._views[job_id] = view
        times = self._step_times
        if times is None:
            return
        if old is not None and old.step_time_s and old.status == RUNNING:
            del times[bisect.bisect_left(times, old.step_time_s)]
        if view is not None and view.step_time_s and view.status == RUNNING:
            if view.step_time_s != view.step_time_s:  # NaN: no place in a sorted list
                self._step_times = None
            else:
                bisect.insort(times, view.step_time_s)

    def _progressed(self, view: JobView, job: SimJob) -> JobView:
        """The view of a job whose trainer reported progress and that nothing else changed since
        `view` was built: what `job_from_row` makes of its row (a progress event moves only the
        step, the step time and the periodic checkpoint), without parsing the row again."""
        columns = view.__dict__.copy()  # a copy of the whole dict: cheaper than filling an empty one
        for kept in ("_left_gpu_s", "_victim_entry"):  # kept on the view by queue_order: of the old step
            columns.pop(kept, None)
        columns.update(self._progress_columns(job))  # step, step_time_s, last_checkpoint_step
        fresh = object.__new__(JobView)
        object.__setattr__(fresh, "__dict__", columns)
        return fresh

    def _progress_columns(self, job: SimJob) -> dict:
        every = job.save_every_steps
        if every is None:
            every = job.save_every_steps = max(1, round(self.options.save_every_s / job.spec.step_s))
        periodic = (job.reported_step or 0) // every * every
        return {
            "last_checkpoint_step": max(job.stop_checkpoint_step, periodic) if job.attempt else None,
            "step": job.reported_step,
            "step_time_s": job.reported_step_s,
        }

    def _queue_report(self, job: SimJob) -> None:
        self._seq += 1
        self._report_at[job.spec.id] = self._seq
        heapq.heappush(self._reports, (self._due(job), self._seq, job))

    def _due(self, job: SimJob) -> float:
        """When a running job's trainer next reports progress."""
        return max(
            (job.running_since or 0.0) + self.options.report_after_s, job.reported_at + self.options.report_every_s
        )

    def _report(self, job: SimJob, now: float) -> bool:
        """The trainer's progress event, as the executor stores it (step, noisy step time); True if one came."""
        if job.status != RUNNING or job.running_since is None:
            return False
        # The very sum it was queued at: `now - reported_at < every` can hold where `reported_at + every
        # <= now` does (rounding), and the job would be queued again for now, for ever.
        if now < self._due(job):
            return False
        job.reported_at = now
        job.advance(now)
        if not job.noise_draws:  # drawn in batches (one call for many): the same stream, in the same order
            if job.noise is None:
                job.noise = np.random.default_rng([self.options.enrichment.seed, 7, job.spec.index])
            job.noise_draws = job.noise.standard_normal(NOISE_BATCH).tolist()[::-1]  # taken from the end
        noise = max(0.5, 1.0 + self.options.step_noise * job.noise_draws.pop())
        job.reported_step = math.floor(job.steps_done)
        job.reported_step_s = job.run_step_s * noise  # true_step_s of the placement it runs on
        return True

    def _checkpoints(self, job: SimJob) -> dict[str, float]:
        return {job.spec.id: EPOCH + job.stop_checkpoint_at} if job.stop_checkpoint_at is not None else {}

    def _row(self, job: SimJob) -> dict:
        s = job.spec
        return self._progress_columns(job) | {
            "id": s.id,
            "name": s.id,
            "status": job.status.value,
            "priority": s.priority,
            "priority_rank": self.ranks.get(s.priority, len(self.ranks)),
            "gpus": s.gpus,
            "preemptible": s.preemptible,
            "submitted": EPOCH + s.submit_s,
            "team": "",
            "placement": job.placement_text if job.holds else None,
            "resume_from": job.resume_from,
            "attempt": job.attempt,
            "started": EPOCH + job.first_start if job.first_start is not None else None,
            "multi_node": s.multi_node,
            "min_gpus": s.min_gpus,
            "max_gpus": s.max_gpus,
            "max_steps": s.max_steps,
            "last_outcome": None,  # an out-of-memory death requeues with no outcome: oom_retry never acts here
            "oom_retries": job.oom_deaths,  # read by the bandit's memory reward; oom_retry reads last_outcome first
            "peak_memory": None,
            "micro_batch": job.micro_batch,  # None until a tune halves it
            "grad_accum": job.grad_accum,
        }
