"""Every message on the bus, as a versioned pydantic model.

A reader refuses a message whose major schema version it does not know; fields are added
with defaults so older readers keep working.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.contracts.actions import Action, NodeGpus
from shared.contracts.outcomes import ExitOutcome
from shared.contracts.protocol_steps import OnTargetFailureName
from shared.contracts.trace_context import valid_traceparent

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 512 * 1024  # far above any message ADC sends; below NATS' 1 MiB default


def new_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    v: int = SCHEMA_VERSION

    def encode(self) -> bytes:
        return self.model_dump_json().encode()

    @field_validator("v")
    @classmethod
    def _known_major_version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema version {v} is not known to this reader (it reads {SCHEMA_VERSION})")
        return v

    @classmethod
    def decode(cls, data: bytes):
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError(f"message of {len(data)} bytes is over {MAX_MESSAGE_BYTES}")
        return cls.model_validate_json(data)


# --- nodes ---------------------------------------------------------------------------


class Device(BaseModel):
    """One accelerator (or CPU slot) a worker offers."""

    index: int
    kind: Literal["gpu", "cpu"] = "gpu"
    name: str = ""
    memory_total_bytes: int = 0
    simulated: bool = False
    nvlink_domain: int = 0
    numa_node: int = 0
    uuid: str = ""
    pci_bus_id: str = ""
    # Link to each other GPU of the node, as `nvidia-smi topo -m` names it: NV<links>, PIX, PXB, PHB, NODE, SYS.
    topology: dict[int, str] = {}


class RunningTrainer(BaseModel):
    job_id: str
    attempt: int
    pid: int
    gpus: list[int]


class FinishedTrainer(BaseModel):
    """An attempt whose trainer ended on this node, so reconciliation never takes it for a lost one."""

    job_id: str
    attempt: int
    outcome: ExitOutcome
    reported: bool = Field(description="its `exited` event is in JetStream (else the worker still retries it)")


class Heartbeat(Message):
    node: str
    ts: float
    started_at: float
    devices: list[Device]
    rack: str = ""
    address: str = "127.0.0.1"
    running: list[RunningTrainer] = []
    finished: list[FinishedTrainer] = Field(default_factory=list, description="the last attempts that ended here")

    def knows(self, job_id: str, attempt: int) -> bool:
        """Whether this node runs that attempt or saw it end."""
        return any(t.job_id == job_id and t.attempt == attempt for t in [*self.running, *self.finished])


class GpuSample(BaseModel):
    index: int
    memory_used_bytes: int
    memory_total_bytes: int
    util_pct: float = 0.0
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_errors: int = 0
    simulated: bool = False
    # NVML depth (None where the GPU or driver does not report it), named as dcgm-exporter's fields.
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    driver_version: str = ""
    mem_copy_util_pct: float | None = None
    enc_util_pct: float | None = None
    dec_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    memory_temperature_c: float | None = None
    energy_mj: int | None = None
    pcie_replay: int | None = None
    ecc_corrected: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_failure: bool | None = None
    nvlink_bandwidth_total: int | None = None
    nvlink_errors: dict[str, int] = {}
    last_xid: int | None = None
    process_memory_bytes: dict[int, int] = Field(default_factory=dict, description="pid -> GPU memory it holds")


class NodeMetrics(Message):
    node: str
    ts: float
    gpus: list[GpuSample] = []
    cpu_pct: float = 0.0
    mem_used_bytes: int = 0
    mem_total_bytes: int = 0
    swap_used_bytes: int = 0
    disk_read_bps: float = 0.0
    disk_write_bps: float = 0.0
    net_rx_bps: float = 0.0
    net_tx_bps: float = 0.0
    comm_latency_us: dict[str, list[float]] = Field(default_factory=dict, description="per job: recent samples")
    trace_parent: str | None = Field(
        None, description="the collector's publish span, set only when its tracer sampled this publish"
    )

    @field_validator("trace_parent", mode="before")
    @classmethod
    def _drop_a_bad_traceparent(cls, v: object) -> str | None:
        # Untrusted: a malformed one is dropped, and the sample still counts.
        return valid_traceparent(v)


# --- commands: executor -> worker (request/reply) -----------------------------------


class Command(Message):
    """Start, checkpoint-stop or cancel one attempt of a job. A repeated command id is a no-op.

    `prepare` is a start that stops short of training (a warm trainer, worker/trainer/warm_start.py);
    `go` resumes the prepared attempt from `resume_from`."""

    command_id: str = Field(default_factory=new_id)
    decision_id: str | None = None
    kind: Literal["start", "stop", "cancel", "prepare", "go"]
    job_id: str
    attempt: int
    # start and prepare (go: resume_from and team):
    train: dict[str, Any] | None = None
    placement: list[NodeGpus] = []
    resume_from: str | None = None
    env: dict[str, str] = {}
    team: str | None = None  # whose folders the trainer may read (shared/specs/tenant_paths.py)
    fence: int | None = Field(None, description="the sending executor's lease token; a worker refuses an older one")


class CommandError(StrEnum):
    """Why a worker (or the executor's transport) could not carry a command out."""

    BAD_COMMAND = "bad_command"  # undecodable, or names nothing on this node
    NO_SUCH_DEVICE = "no_such_device"
    DEVICES_BUSY = "devices_busy"
    JOB_RUNNING = "job_running"  # another attempt of the job still runs here
    NOT_RUNNING = "not_running"  # stop: that attempt does not run here
    STOP_FAILED = "stop_failed"  # stop: the trainer ended without a checkpoint
    NOT_READY = "not_ready"  # prepare: the warm trainer died or took too long getting ready
    REFUSED = "refused"  # start: the worker will not run it as asked (paths, env, sandbox); final
    STALE_LEADER = "stale_leader"  # sent by an executor that no longer leads (an older fencing token)
    INTERNAL = "internal"
    UNREACHABLE = "unreachable"  # the executor got no answer
    UNAUTHENTICATED = "unauthenticated"  # not signed by the executor: refused and reported, never run


class CommandRefusal(Message):
    """A worker's report of a command it refused (unsigned, or not signed by the executor), on
    `<prefix>.nodes.<node>.refused`; the audit sink records it as `command.refused`. What the
    command claimed (kind, job, id) is the sender's word, kept as evidence only."""

    refusal_id: str = Field(default_factory=new_id)
    ts: float
    reason: str = Field(max_length=500)
    claimed: dict[str, str] = Field(default_factory=dict, description="kind, job_id, command_id, as the command said")


class CommandResult(Message):
    command_id: str
    ok: bool
    error: CommandError | None = None
    message: str = ""
    pid: int | None = None
    job_dir: str | None = None
    checkpoint: str | None = Field(None, description="stop: its checkpoint; cancel: the newest complete one")
    step: int | None = None
    outcome: ExitOutcome | None = Field(None, description="stop: how the trainer ended")
    backend_job: str | None = Field(None, description="start: the id the node's backend runs it as, e.g. slurm:42")


# --- job events (JetStream ADC_JOBS) -------------------------------------------------

JobEventKind = Literal[
    "submitted",
    "cancel_requested",  # api
    "started",
    "progress",
    "checkpointed",  # worker, from the trainer
    "evaluated",  # worker, from the trainer: eval/predict metrics
    "stopped",
    "exited",  # worker: process ended
]


class JobEvent(Message):
    event_id: str = Field(default_factory=new_id)
    job_id: str
    kind: JobEventKind
    ts: float
    attempt: int = 0
    node: str | None = None
    actor: str | None = None
    data: dict[str, Any] = {}


# --- decisions (JetStream ADC_DECISIONS) ---------------------------------------------


class Decision(Message):
    decision_id: str
    ts: float
    rule: str
    action: Action
    snapshot_ts: float
    shadow: bool = False
    actor: str | None = Field(None, description="set for manual actions taken through the API")
    fence: int | None = Field(None, description="the deciding decider's lease token; the executor refuses an older one")
    on_target_failure: OnTargetFailureName | None = Field(
        None, description="a migrate or scale whose target fails: the deciding rule's choice; None: restart_source"
    )


# --- audit (JetStream ADC_AUDIT) -----------------------------------------------------


class AuditEvent(Message):
    event_id: str = Field(default_factory=new_id)
    ts: float
    source: str
    kind: str
    actor: str | None = None
    job_id: str | None = None
    node: str | None = None
    decision_id: str | None = None
    rule: str | None = None
    action: str | None = None
    reason: str | None = None
    evidence: dict[str, Any] = {}
    data: dict[str, Any] = {}
