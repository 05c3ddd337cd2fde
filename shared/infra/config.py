"""The one typed configuration object, loaded from adc_config.yaml.

Strict: unknown keys and wrong types are refused, and every problem is reported at once.
Environment variables override where a deployment needs it (NATS_URL, DATABASE_URL, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

# The rules' config models live in shared/contracts/strategies.py (the policy contract); named here too,
# since everything that reads the config imports them from here.
from shared.contracts.strategies import (  # noqa: F401
    BUILTIN,
    BanditConfig,
    CommJitter,
    Consolidate,
    Defragmentation,
    Drain,
    ElasticScale,
    LoadBalance,
    OomProtection,
    OomRetry,
    PriorityFifo,
    PriorityLevel,
    PriorityScheduling,
    QueueOrder,
    RuleControls,
    Strategies,
    Strict,
    unknown_names,
)

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parents[2] / "adc_config.yaml"


class ControllerConfig(Strict):
    interval: float = Field(5.0, gt=0, description="seconds between policy evaluations")
    timeout: float = Field(30.0, gt=0, description="seconds a protocol step may take")
    enable_auto_scale: bool = True
    warm_moves: bool = Field(
        True, description="a migrate or scale prepares the target's trainer before the source stops (docs/executor.md)"
    )
    max_gpus_per_node: int = Field(8, ge=1, description="a job that is not multi_node asks for at most this many")
    max_job_gpus: int = Field(1024, ge=1, le=1024, description="the most devices one job may ask for (gpus, max_gpus)")


def moved_oom_retries(data: Any) -> Any:
    """`controller.oom_retries`, the retry budget's older key, read as the oom_retry rule's
    `strategies.oom_retry.max_retries`; both set to different values is refused, naming both."""
    if not isinstance(data, dict) or not isinstance(data.get("controller"), dict):
        return data
    if "oom_retries" not in data["controller"]:
        return data
    controller = dict(data["controller"])
    budget = controller.pop("oom_retries")
    strategies = data.get("strategies") if isinstance(data.get("strategies"), dict) else {}
    section = strategies.get("oom_retry") if isinstance(strategies.get("oom_retry"), dict) else {}
    if "max_retries" in section and section["max_retries"] != budget:
        raise ValueError(
            f"controller.oom_retries ({budget!r}) and strategies.oom_retry.max_retries ({section['max_retries']!r})"
            " disagree: the budget is the oom_retry rule's now; set only strategies.oom_retry.max_retries"
        )
    return data | {
        "controller": controller,
        "strategies": strategies | {"oom_retry": section | {"max_retries": budget}},
    }


class Schedule(Strict):
    """A set of strategy overrides active only in a daily time window, e.g. no preemption at night."""

    name: str = Field(min_length=1, max_length=64)
    start: str = Field(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="HH:MM, inclusive")
    end: str = Field(
        pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$", description="HH:MM, exclusive; before start: overnight"
    )
    days: list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]] | None = Field(
        None, description="days the window starts on; None: every day"
    )
    timezone: str = "UTC"
    strategies: dict[str, dict[str, Any]] = Field(default_factory=dict, description="merged over `strategies`")

    @model_validator(mode="after")
    def _known_timezone(self) -> Schedule:
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
    reconcile_s: float = Field(30.0, gt=0, description="the job view, kept from the bus, is re-read whole this often")


class LeasesConfig(Strict):
    """Leader election of the decider and the executor (shared/infra/leases.py)."""

    enabled: bool = Field(True, description="several deciders and executors, one of each leading: a lease in NATS KV")
    lease_s: float = Field(2.0, gt=0, le=60, description="a leader silent this long is replaced; it steps down at 2/3")


class BusConfig(Strict):
    url: str = "nats://127.0.0.1:4222"
    prefix: str = Field(
        "adc", pattern=r"^[a-z][a-z0-9]*$", description="subject and stream prefix; tests use their own"
    )
    credentials_dir: str | None = Field(
        None,
        description="folder of the bus roles' nkey seeds (<role>.nk, owner-only) and public keys (<role>.pub),"
        " written by `adc secrets init`; each process reads only its own role's seed. Unset: the"
        " services refuse to start",
    )


class DatabaseConfig(Strict):
    url: str = Field(
        "postgresql://127.0.0.1:5432/adc",
        description="the server and database; each service connects"
        " to it as its own role (adc_api, adc_decider, adc_executor, adc_audit), never as this user",
    )
    passwords_dir: str | None = Field(
        None, description="folder of the service roles' passwords (<role>.password); unset: pgpass or trust"
    )
    pool_min: int = Field(1, ge=1)
    pool_max: int = Field(10, ge=1)


class StorageConfig(Strict):
    root: str = Field(".adc/data", description="job folders and checkpoints; a shared filesystem in production")
    data_root: str | None = Field(
        None, description="where relative model and dataset paths are resolved; default: the cwd"
    )


class SpecLimits(Strict):
    """What one job spec may hold, checked before anything else reads it (shared/specs/spec_bounds.py), so the
    cost of checking a spec is bounded whatever it holds."""

    max_values: int = Field(4096, ge=64, le=100_000, description="keys, items and scalars in the whole document")
    max_keys: int = Field(512, ge=16, le=10_000, description="keys of any one mapping (LLaMA-Factory has ~350)")
    max_depth: int = Field(16, ge=4, le=64, description="mappings and lists nested inside each other")
    max_key_chars: int = Field(128, ge=16, le=4096, description="characters of one key")
    max_steps: int = Field(100_000_000, ge=1, le=2**53, description="the largest train.max_steps")


class ApiConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(1_048_576, gt=0)
    validation_timeout_s: float = Field(10.0, gt=0, description="a spec that takes longer to check is refused")
    stream_recheck_s: float = Field(
        0.5, gt=0, le=1, description="open streams' tokens are re-checked this often (one query for all of them)"
    )
    max_streams_per_token: int = Field(8, ge=1, description="SSE tails and log follows one token may hold at once")
    spec_limits: SpecLimits = SpecLimits()


class WorkerConfig(Strict):
    heartbeat_interval: float = Field(2.0, gt=0)
    node_timeout: float = Field(30.0, gt=0, description="no heartbeat this long: node lost")
    command_timeout: float = Field(30.0, gt=0)
    standby_trainers: int = Field(
        1,
        ge=0,
        description="trainers kept ready per trainer uid, imports done, so a start or a move's prepare skips "
        "them (worker/standby.py); 0: every trainer starts fresh",
    )


class CollectorConfig(Strict):
    interval: float = Field(1.0, gt=0)


class AuditConfig(Strict):
    chain_key_file: str | None = Field(
        None,
        description="secret file (owner-only, >= 32 bytes) that keys the audit hash chain; keep it out of"
        " Postgres. Unset: an unkeyed chain, which a database superuser could rewrite",
    )


class SandboxConfig(Strict):
    """How the worker runs each trainer: as which uid, inside what (see worker/sandbox.py)."""

    uid_mode: Literal["fixed", "per_team", "per_job"] = Field(
        "fixed",
        description="fixed: every trainer runs as `user`; per_team: as team_uids[team]; per_job: a uid "
        "from uid_range picked by the job id",
    )
    user: str | int = Field("nobody", description="the user (name or uid) of every trainer in fixed mode")
    team_uids: dict[str, int] = Field(default_factory=dict, description="per_team mode: team -> uid")
    uid_range: tuple[int, int] = Field((200000, 65536), description="per_job mode: (first uid, how many)")
    allow_root: bool = Field(False, description="development only: a trainer may run as uid 0")
    bubblewrap: Literal["auto", "required", "off"] = Field(
        "auto",
        description="read-only root, private /tmp, only the job folder writable: auto uses bwrap when "
        "it is installed, required refuses to start trainers without it",
    )
    hidden_paths: list[str] = Field(
        default_factory=list,
        description="folders trainers must not see (credentials, other state), besides storage and team roots",
    )


class TenancyConfig(Strict):
    """Which folders each team's jobs may read (shared/specs/tenant_paths.py). Relative paths are resolved against
    storage.data_root. Nothing listed: every local path in a job spec is refused."""

    team_roots: dict[str, list[str]] = Field(default_factory=dict, description="team -> the folders it owns")
    shared_roots: list[str] = Field(default_factory=list, description="read-only folders every team may read")
    trusted_code_roots: list[str] = Field(
        default_factory=list, description="model folders under these may run their own Python (auto_map)"
    )
    max_file_bytes: int = Field(16 * 2**20, gt=0, description="largest file read while a spec is checked")
    sandbox: SandboxConfig = SandboxConfig()


class MetricsConfig(Strict):
    """Prometheus `/metrics` of the services that consume the bus: what each refused
    (`adc_rejected_messages_total{subject,reason}`) and its process's own series. A port per
    service; unset: not served (replicas on one host each need their own port; 0 picks a free one)."""

    host: str = Field("127.0.0.1", description="address every /metrics below listens on")
    executor: int | None = Field(None, ge=0, le=65535, description="the executor's /metrics port")
    decider: int | None = Field(None, ge=0, le=65535, description="the decider's /metrics port")
    audit_sink: int | None = Field(None, ge=0, le=65535, description="the audit sink's /metrics port")
    worker: int | None = Field(None, ge=0, le=65535, description="the worker's /metrics port")


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
    tenancy: TenancyConfig = TenancyConfig()
    metrics: MetricsConfig = MetricsConfig()
    bandit: BanditConfig = BanditConfig()
    schedules: list[Schedule] = Field(default_factory=list, description="time windows that override strategies")

    @model_validator(mode="before")
    @classmethod
    def _moved_oom_retries(cls, data: Any) -> Any:
        return moved_oom_retries(data)


def policy_problems(strategies: Strategies, schedules: list[Schedule], plugins: bool) -> list[str]:
    """What adc_config.yaml and a policy set through the API are both refused for, beyond their types:
    a strategy no rule registers (unless plugin rules may claim it: the decider checks those), and a
    schedule whose overrides leave invalid strategies."""
    problems = [] if plugins else unknown_names(strategies.model_extra or {})
    for i, schedule in enumerate(schedules):
        if not plugins:
            problems += [f"schedules.{i}.{p}" for p in unknown_names(schedule.strategies)]
        try:
            Strategies.model_validate(merge_sections(strategies.model_dump(), schedule.strategies))
        except ValidationError as err:
            problems += [f"schedules.{i}.strategies.{p}" for p in _problems(err)]
    return problems


def merge_sections(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`, one level of sections deep (a section's keys merge; other values replace)."""
    merged = dict(base)
    for key, value in overlay.items():
        merged[key] = (
            {**merged[key], **value} if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


class ConfigError(ValueError):
    """Every problem in a config file, at once; each reads `dotted.path: what is wrong`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))

    def fields(self) -> list[tuple[list[str], str]]:
        """(path, message) of each problem, for answers that name the field as a list."""
        return [
            (path.split(".") if path != "(top)" else [], msg)
            for path, _, msg in (p.partition(": ") for p in self.problems)
        ]


def _problems(err: ValidationError) -> list[str]:
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors()]


ENV_OVERRIDES = {
    "NATS_URL": ("bus", "url"),
    "ADC_BUS_PREFIX": ("bus", "prefix"),
    "ADC_BUS_CREDENTIALS_DIR": ("bus", "credentials_dir"),
    "DATABASE_URL": ("database", "url"),
    "ADC_DB_PASSWORDS_DIR": ("database", "passwords_dir"),
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
    return validate_config(data, source)


def validate_config(data: dict[str, Any], source: str = "<config>") -> AdcConfig:
    """The one validation of a whole config: types, then what `policy_problems` refuses."""
    try:
        config = AdcConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _problems(err)) from None
    problems = policy_problems(config.strategies, config.schedules, plugins=config.decider.rules_dir is not None)
    if problems:
        raise ConfigError(source, problems)
    return config


POLICY_SECTIONS = ("controller", "strategies", "schedules")


def apply_policy(config: AdcConfig, policy: dict[str, Any] | None, source: str = "policy") -> AdcConfig:
    """`config` with a policy document's sections in place of its own, validated whole: the one check
    for policies, made by the api before storing one and by the decider before applying it."""
    if not policy:
        return config
    unknown = [k for k in policy if k not in POLICY_SECTIONS]
    problems = [f"{k}: not a policy section (policy sections: {', '.join(POLICY_SECTIONS)})" for k in unknown]
    if problems:
        raise ConfigError(source, problems)
    data = config.model_dump()
    data.update({k: v for k, v in policy.items() if k in POLICY_SECTIONS})
    return validate_config(data, source)


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
