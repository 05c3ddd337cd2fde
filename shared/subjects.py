"""Bus subjects and JetStream streams, under one prefix (tests use their own)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Subjects:
    prefix: str = "adc"

    def metrics(self, node: str = "*") -> str:
        return f"{self.prefix}.metrics.{node}"

    def heartbeat(self, node: str = "*") -> str:
        return f"{self.prefix}.nodes.{node}.heartbeat"

    def command(self, node: str) -> str:
        return f"{self.prefix}.nodes.{node}.cmd"

    def command_refusals(self, node: str = "*") -> str:
        """A worker's report of a command it refused (unsigned or wrongly signed); kept in the audit stream."""
        return f"{self.prefix}.nodes.{node}.refused"

    def job_events(self, job_id: str = "*") -> str:
        return f"{self.prefix}.jobs.{job_id}.events"

    @property
    def decisions(self) -> str:
        return f"{self.prefix}.decisions"

    @property
    def audit(self) -> str:
        return f"{self.prefix}.audit"

    def dead_letters(self, consumer: str = "*") -> str:
        return f"{self.prefix}.dead.{consumer}"

    def node_of(self, subject: str) -> str | None:
        """The node a per-node subject (metrics, heartbeat, command, refusal) belongs to. The bus lets
        only that node's worker and collector publish there, so a payload naming another node is forged."""
        parts = subject.split(".")
        if len(parts) == 3 and parts[:2] == [self.prefix, "metrics"]:
            return parts[2]
        if len(parts) == 4 and parts[:2] == [self.prefix, "nodes"]:
            return parts[2]
        return None

    def consumer(self, name: str) -> str:
        """A durable consumer's name (e.g. `executor`), unique per installation."""
        return f"{self.prefix}-{name}"

    @property
    def pending_reasons_bucket(self) -> str:
        return f"{self.prefix}_pending_reasons"

    @property
    def leader_bucket(self) -> str:
        return f"{self.prefix}_leaders"  # the leases of the decider and the executor (shared/leases.py)

    # streams: name -> subjects
    @property
    def jobs_stream(self) -> str:
        return f"{self.prefix.upper()}_JOBS"

    @property
    def decisions_stream(self) -> str:
        return f"{self.prefix.upper()}_DECISIONS"

    @property
    def audit_stream(self) -> str:
        return f"{self.prefix.upper()}_AUDIT"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.prefix.upper()}_DEAD"

    def streams(self) -> dict[str, list[str]]:
        return {
            self.jobs_stream: [self.job_events("*")],
            self.decisions_stream: [self.decisions],
            self.audit_stream: [self.audit, self.command_refusals("*")],
            self.dead_letter_stream: [self.dead_letters("*")],
        }
