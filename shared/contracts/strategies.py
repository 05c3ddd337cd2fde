"""Every built-in rule's config model: the contract between whoever writes policies
(adc_config.yaml, `PUT /v1/policies`) and the decider's rules, as `shared/contracts/actions.py` is for
what rules propose.

A rule module in services/decider/rules/ binds its model from here (`Rule(config=...)`); the
api validates policies with the same models without importing the decider. `BUILTIN` is the
registry: `strategies.<name>` must name one of its rules (or, with `decider.rules_dir` set, a
plugin rule, which the decider checks once its plugins are loaded). A test checks that the
registry and the built-in rules agree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.contracts.protocol_steps import OnTargetFailureName


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuleControls(Strict):
    """What the decider's engine reads from every rule's section, besides the rule's own keys."""

    enabled: bool = True
    shadow: bool = Field(False, description="decide and audit, but publish nothing for the executor")
    cooldown_s: float = Field(60.0, ge=0, description="after acting on a job, this rule leaves it alone this long")
    budget_ms: float = Field(500.0, gt=0, description="wall time one evaluation may take; an overrun is discarded")
    precedence: int | None = Field(None, description="arbitration order, lower wins; default: the rule's own")
    on_target_failure: OnTargetFailureName = Field(
        "restart_source",
        description="a migrate or scale of this rule whose target fails after the source stopped: restart_source"
        " (back on the source if its devices are still free, else requeue) or requeue",
    )


class OomProtection(RuleControls):
    threshold_memory_usage: float = Field(0.92, gt=0, le=1)
    for_s: float = Field(30.0, ge=0)
    action: Literal["migrate", "scale_out", "checkpoint_requeue"] = "migrate"
    hysteresis: float = Field(0.02, ge=0, lt=1, description="once hot, a GPU stays hot until below threshold - this")
    headroom: float = Field(0.0, ge=0, description="a target GPU needs the job's memory use times (1 + this) free")


class LoadBalance(RuleControls):
    rebalance_interval: float = Field(60.0, gt=0)
    method: Literal["topology_aware", "least_loaded"] = "topology_aware"
    metric: Literal["cpu", "gpu_util", "gpu_memory"] = Field("cpu", description="what makes a node hot")
    hot_threshold: float = Field(0.85, gt=0, le=1)
    min_gain: float = Field(0.3, gt=0, le=1, description="hot minus target load must be at least this")
    max_lost_s: float = Field(600.0, ge=0, description="never move a job that would lose more progress than this")
    cooldown_s: float = Field(600.0, ge=0)


class CommJitter(RuleControls):
    stddev_us: float = Field(50.0, gt=0)
    window_s: float = Field(30.0, gt=0)
    min_samples: int = Field(10, ge=2)
    tune_env: dict[str, str] = Field(
        default_factory=lambda: {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "4"},
        description="NCCL settings tried when no tighter placement is free",
    )
    cooldown_s: float = Field(900.0, ge=0)


class PriorityFifo(RuleControls):
    """Admission: priority order, FIFO within a level, gang, topology-aware placement."""

    backfill: Literal["within_level", "any"] = Field(
        "within_level", description="within_level: a waiting job holds back smaller jobs of lower levels"
    )
    aggregate_fragments: bool = Field(True, description="multi-node jobs may take free devices on several nodes")
    cooldown_s: float = Field(0.0, ge=0)


class Defragmentation(RuleControls):
    max_move_gpus: int = Field(2, ge=1, description="only jobs this small are moved to make room")
    max_lost_s: float = Field(900.0, ge=0, description="never move a job that would lose more progress than this")
    cooldown_s: float = Field(600.0, ge=0)


class ElasticScale(RuleControls):
    grow_levels: list[str] | None = Field(None, description="levels whose elastic jobs may grow; None: every level")
    shrink: bool = Field(True, description="shrink elastic jobs (to their floor) when others wait")
    cooldown_s: float = Field(300.0, ge=0)


class PriorityLevel(Strict):
    name: str = Field(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_-]*$")
    preemptible: bool = True
    min_gpus: int = Field(0, ge=0)


class PriorityScheduling(RuleControls):
    levels: list[PriorityLevel] = Field(
        default_factory=lambda: [
            PriorityLevel(name="high", preemptible=False, min_gpus=4),
            PriorityLevel(name="low", preemptible=True),
        ],
        min_length=1,
        description="highest priority first",
    )
    default_level: str | None = Field(None, description="level of a job that names none; default: the lowest")
    max_victims: int = Field(4, ge=1, description="most jobs preempted for one waiting job")
    cooldown_s: float = Field(120.0, ge=0)

    @model_validator(mode="after")
    def _levels_consistent(self) -> PriorityScheduling:
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"level names must be unique, got {names}")
        if self.default_level is not None and self.default_level not in names:
            raise ValueError(f"default_level {self.default_level!r} is not one of {names}")
        return self

    def rank(self, level: str) -> int:
        """0 for the highest level; larger is lower priority."""
        return [lv.name for lv in self.levels].index(level)

    def level(self, name: str) -> PriorityLevel:
        return self.levels[self.rank(name)]

    @property
    def default(self) -> str:
        return self.default_level or self.levels[-1].name


class Consolidate(RuleControls):
    enabled: bool = False  # opt in (adc_config.yaml ships it on)
    min_remaining_s: float = Field(3600.0, ge=0, description="only jobs with at least this much work left move")
    max_moves: int = Field(2, ge=1, description="most jobs moved per pass")
    cooldown_s: float = Field(3600.0, ge=0)


class Drain(RuleControls):
    cooldown_s: float = Field(0.0, ge=0)


class OomRetry(RuleControls):
    memory_margin: float = Field(1.25, ge=1, description="a roomier device needs the last peak times this free")
    max_retries: int = Field(
        2, ge=0, description="an out-of-memory job is retried this often; out of memory once more, it fails"
    )
    cooldown_s: float = Field(0.0, ge=0)


class QueueOrder(RuleControls):
    method: Literal["fifo", "las", "shortest_remaining"] = "fifo"
    las_thresholds_gpu_s: list[float] = Field(
        default_factory=lambda: [3600.0], description="attained GPU-seconds that split the LAS queues, ascending"
    )
    default_step_s: float = Field(1.0, gt=0, description="step time assumed before any job reported one")
    preempt: bool = Field(
        True, description="a waiting job may displace a running one of its level that is later in the order"
    )
    preempt_ratio: float = Field(
        2.0,
        ge=1,
        description="shortest_remaining: displace only jobs with more than this times the waiting job's remaining work",
    )
    protocol_cost_s: float = Field(
        60.0, ge=0, description="checkpoint plus restart seconds a displacement costs; added to the waiting job's side"
    )
    max_victims: int = Field(8, ge=1, description="most jobs displaced for one waiting job (a node of 1-GPU jobs)")
    cooldown_s: float = Field(600.0, ge=0)


class BanditConfig(Strict):
    """`bandit`: the learned policy beside the rules (services/decider/bandit/). Off by default; it
    only ever chooses among the rules' own feasible candidates."""

    mode: Literal["off", "shadow", "active"] = Field(
        "off", description="shadow: choose and audit, never act; active: act within the exploration budget"
    )
    epsilon: float = Field(0.1, ge=0, le=1, description="share of choices explored (vowpalwabbit cb_explore_adf)")
    act_margin: float = Field(
        0.05,
        ge=0,
        description="act on the learner's arm instead of the rules' only when its predicted reward beats its "
        "prediction for the rules' arm by this much (reward units: log GPU-seconds a step); else the rules' arm",
    )
    act_after: int = Field(
        100, ge=0, description="the learner's arm replaces the rules' only once it has learned this many outcomes"
    )
    max_arms: int = Field(4, ge=2, le=8, description="feasible placements offered per start, the rules' own first")
    min_job_gpus: int = Field(1, ge=1, description="starts of fewer devices stay the rules' own")
    keep_idle_nodes: bool = Field(
        True, description="no start on a node nobody uses unless the rules chose one: whole nodes stay whole"
    )
    shadow_explore: float = Field(
        0.0,
        ge=0,
        le=1,
        description="shadow: share of starts, within the exploration budget, placed on an arm drawn uniformly "
        "(logged with that propensity, so off-policy evaluation has support); 0: shadow never acts",
    )
    explore_per_hour: int = Field(30, ge=0, description="most exploring choices acted on per hour, cluster-wide")
    explore_per_job: int = Field(1, ge=0, description="most exploring choices acted on per job")
    cooldown_s: float = Field(600.0, ge=0, description="the bandit acts on one job at most once this long")
    reward_within_s: float = Field(
        3600.0, gt=0, description="a decision with no throughput report this long after is dropped unrewarded"
    )
    memory_window_s: float = Field(
        1800.0, gt=0, description="memory pressure: a response's lost GPU-seconds are charged against this window"
    )
    knobs: bool = Field(
        False, description="queue knobs (preemption, elastic growth) chosen per window from a small arm set"
    )
    knob_window_s: float = Field(900.0, gt=0, description="queue knobs: how long each chosen setting holds")
    save_every_s: float = Field(60.0, gt=0, description="the leader writes the learner to Postgres this often")
    seed: int = Field(0, ge=0, description="the learner's and the sampler's random seed")

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false: `mode: off` means what it says.
        return "off" if value is False else value


# The registry: rule name -> its config model.
BUILTIN: dict[str, type[RuleControls]] = {
    "comm_jitter": CommJitter,
    "consolidate": Consolidate,
    "defragmentation": Defragmentation,
    "drain": Drain,
    "elastic_scale": ElasticScale,
    "load_balance": LoadBalance,
    "oom_protection": OomProtection,
    "oom_retry": OomRetry,
    "priority_fifo": PriorityFifo,
    "priority_scheduling": PriorityScheduling,
    "queue_order": QueueOrder,
}


class Strategies(BaseModel):
    """`strategies`: one section per rule. Built-in sections are typed; a section under any other
    name is kept for a plugin rule only where plugins may exist (see `unknown_names`)."""

    model_config = ConfigDict(extra="allow")
    comm_jitter: CommJitter = CommJitter()
    consolidate: Consolidate = Consolidate()
    defragmentation: Defragmentation = Defragmentation()
    drain: Drain = Drain()
    elastic_scale: ElasticScale = ElasticScale()
    load_balance: LoadBalance = LoadBalance()
    oom_protection: OomProtection = OomProtection()
    oom_retry: OomRetry = OomRetry()
    priority_fifo: PriorityFifo = PriorityFifo()
    priority_scheduling: PriorityScheduling = PriorityScheduling()
    queue_order: QueueOrder = QueueOrder()

    @model_validator(mode="after")
    def _plugin_sections_are_mappings(self) -> Strategies:
        bad = [name for name, value in (self.model_extra or {}).items() if not isinstance(value, dict)]
        if bad:
            raise ValueError(f"strategies {', '.join(bad)}: a rule's section is a mapping")
        return self

    def section(self, name: str) -> object:
        """The section for rule `name`: typed for a built-in rule, the raw mapping for a plugin, None if absent."""
        if name in BUILTIN:
            return getattr(self, name)
        return (self.model_extra or {}).get(name)


def unknown_names(names, registered=()) -> list[str]:
    """Problems for section names that no rule registers: built-in ones, plus `registered`."""
    known = set(BUILTIN) | set(registered)
    listed = ", ".join(sorted(known))
    return [
        f"strategies.{name}: no rule is registered under this name (registered: {listed})"
        for name in names
        if name not in known
    ]
