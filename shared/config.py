"""The one typed configuration object, loaded from adc_config.yaml.

Strict: unknown keys and wrong types are refused, and every problem is reported at once.
Environment variables override where a deployment needs it (NATS_URL, DATABASE_URL, ...).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "adc_config.yaml"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ControllerConfig(Strict):
    interval: float = Field(5.0, gt=0, description="seconds between policy evaluations")
    timeout: float = Field(30.0, gt=0, description="seconds a protocol step may take")
    oom_retries: int = Field(2, ge=0, description="an out-of-memory attempt is retried this often, then the job fails")
    enable_auto_scale: bool = True
    max_gpus_per_node: int = Field(8, ge=1, description="a job that is not multi_node asks for at most this many")


class RuleControls(Strict):
    """What the decider's engine reads from every rule's section, besides the rule's own keys."""

    enabled: bool = True
    shadow: bool = Field(False, description="decide and audit, but publish nothing for the executor")
    cooldown_s: float = Field(60.0, ge=0, description="after acting on a job, this rule leaves it alone this long")
    budget_ms: float = Field(500.0, gt=0, description="wall time one evaluation may take; an overrun is discarded")
    precedence: int | None = Field(None, description="arbitration order, lower wins; default: the rule's own")


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
        description="NCCL settings tried when no tighter placement is free")
    cooldown_s: float = Field(900.0, ge=0)


class PriorityFifo(RuleControls):
    """Admission: priority order, FIFO within a level, gang, topology-aware placement."""

    backfill: Literal["within_level", "any"] = Field(
        "within_level", description="within_level: a waiting job holds back smaller jobs of lower levels")
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
    def _levels_consistent(self) -> "PriorityScheduling":
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


class Strategies(BaseModel):
    # Known strategies are typed; other keys configure rule plugins, which validate their own.
    model_config = ConfigDict(extra="allow")
    oom_protection: OomProtection = OomProtection()
    load_balance: LoadBalance = LoadBalance()
    comm_jitter: CommJitter = CommJitter()
    priority_scheduling: PriorityScheduling = PriorityScheduling()
    priority_fifo: PriorityFifo = PriorityFifo()
    defragmentation: Defragmentation = Defragmentation()
    elastic_scale: ElasticScale = ElasticScale()


class Schedule(Strict):
    """A set of strategy overrides active only in a daily time window, e.g. no preemption at night."""

    name: str = Field(min_length=1, max_length=64)
    start: str = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="HH:MM, inclusive")
    end: str = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="HH:MM, exclusive; before start: overnight")
    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = Field(
        None, description="days the window starts on; None: every day")
    timezone: str = "UTC"
    strategies: dict[str, dict[str, Any]] = Field(default_factory=dict, description="merged over `strategies`")

    @model_validator(mode="after")
    def _known_timezone(self) -> "Schedule":
        from zoneinfo import ZoneInfo

        try:
            ZoneInfo(self.timezone)
        except Exception:
            raise ValueError(f"unknown timezone {self.timezone!r}") from None
        return self


class DeciderConfig(Strict):
    rules_dir: str | None = Field(None, description="extra rule plugins, hot reloaded beside the built-in ones")
    reload_interval: float = Field(1.0, gt=0, description="seconds between checks for changed rules and config")
    window_s: float = Field(120.0, gt=0, le=3600, description="telemetry history kept per GPU")
    stale_after_s: float = Field(5.0, gt=0, description="a GPU's telemetry older than this triggers nothing")
    max_gap_s: float = Field(3.5, gt=0, description="samples further apart than this break a window")
    max_disruptions_per_minute: int = Field(10, ge=0, description="migrate, preempt, scale and tune, cluster-wide")
    min_tick_gap_s: float = Field(0.1, ge=0, description="event-driven passes are at least this far apart")


class LeasesConfig(Strict):
    """Leader election of the decider and the executor (shared/leases.py)."""
    enabled: bool = Field(True, description="several deciders and executors, one of each leading: a lease in NATS KV")
    lease_s: float = Field(2.0, gt=0, le=60, description="a leader silent this long is replaced; it steps down at 2/3")


class BusConfig(Strict):
    url: str = "nats://127.0.0.1:4222"
    prefix: str = Field("adc", pattern=r"^[a-z][a-z0-9]*$", description="subject and stream prefix; tests use their own")


class DatabaseConfig(Strict):
    url: str = "postgresql://127.0.0.1:5432/adc"
    pool_min: int = Field(1, ge=1)
    pool_max: int = Field(10, ge=1)


class StorageConfig(Strict):
    root: str = Field(".adc/data", description="job folders and checkpoints; a shared filesystem in production")
    data_root: str | None = Field(None, description="where relative model and dataset paths are resolved; default: the cwd")


class ApiConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(1_048_576, gt=0)
    validation_timeout_s: float = Field(10.0, gt=0, description="a spec that takes longer to check is refused")
    stream_recheck_s: float = Field(30.0, gt=0, le=30, description="open streams re-check their token this often")
    max_streams_per_token: int = Field(8, ge=1, description="SSE tails and log follows one token may hold at once")


class WorkerConfig(Strict):
    heartbeat_interval: float = Field(2.0, gt=0)
    node_timeout: float = Field(30.0, gt=0, description="no heartbeat this long: node lost")
    command_timeout: float = Field(30.0, gt=0)


class CollectorConfig(Strict):
    interval: float = Field(1.0, gt=0)


class AuditConfig(Strict):
    chain_key_file: str | None = Field(
        None, description="secret file (owner-only, >= 32 bytes) that keys the audit hash chain; keep it out of"
                          " Postgres. Unset: an unkeyed chain, which a database superuser could rewrite")


class AdcConfig(Strict):
    controller: ControllerConfig = ControllerConfig()
    strategies: Strategies = Strategies()
    bus: BusConfig = BusConfig()
    database: DatabaseConfig = DatabaseConfig()
    storage: StorageConfig = StorageConfig()
    api: ApiConfig = ApiConfig()
    worker: WorkerConfig = WorkerConfig()
    collector: CollectorConfig = CollectorConfig()
    decider: DeciderConfig = DeciderConfig()
    leases: LeasesConfig = LeasesConfig()
    audit: AuditConfig = AuditConfig()
    schedules: list[Schedule] = Field(default_factory=list, description="time windows that override strategies")

    @model_validator(mode="after")
    def _schedules_make_valid_strategies(self) -> "AdcConfig":
        problems = []
        for i, schedule in enumerate(self.schedules):
            try:
                Strategies.model_validate(merge_sections(self.strategies.model_dump(), schedule.strategies))
            except ValidationError as err:
                problems += [f"schedules.{i}.strategies.{p}" for p in _problems(err)]
        if problems:
            raise ValueError("; ".join(problems))
        return self


def merge_sections(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`, one level of sections deep (a section's keys merge; other values replace)."""
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


class ConfigError(ValueError):
    """Every problem in a config file, at once."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))


def _problems(err: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors()]


ENV_OVERRIDES = {
    "NATS_URL": ("bus", "url"),
    "ADC_BUS_PREFIX": ("bus", "prefix"),
    "DATABASE_URL": ("database", "url"),
    "ADC_STORAGE_ROOT": ("storage", "root"),
}


def parse_config(data: Any, source: str = "<config>", env: dict[str, str] | None = None) -> AdcConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"(top): expected a mapping, got {type(data).__name__}"])
    env = os.environ if env is None else env
    for var, (section, key) in ENV_OVERRIDES.items():
        if env.get(var):
            data.setdefault(section, {})
            if isinstance(data[section], dict):
                data[section][key] = env[var]
    try:
        return AdcConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _problems(err)) from None


def load_config(path: str | Path | None = None, env: dict[str, str] | None = None) -> AdcConfig:
    """Load the config named by `path`, $ADC_CONFIG, or the repo's adc_config.yaml."""
    env = os.environ if env is None else env
    path = Path(path or env.get("ADC_CONFIG") or DEFAULT_CONFIG_FILE)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(str(path), [f"cannot read: {err.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(str(path), [f"not valid YAML: {err}"]) from None
    return parse_config(data, str(path), env)
