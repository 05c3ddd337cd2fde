"""Bus subjects and JetStream streams, under one prefix (tests use their own)."""

from __future__ import annotations

from dataclasses import dataclass

# The source token of the api's job events (submitted, cancel requests); no node is named so (node
# names begin with a letter or digit).
API_SOURCE = "_api"
API_EVENT_KINDS = frozenset({"submitted", "cancel_requested"})  # the api's; every other kind is a trainer's


@dataclass(frozen=True)
class Subjects:
    prefix: str = "adc"

    def metrics(self, node: str = "*") -> str:
        return f"{self.prefix}.metrics.{node}"

    def heartbeat(self, node: str = "*") -> str:
        return f"{self.prefix}.nodes.{node}.heartbeat"

    def command(self, node: str) -> str:
        return f"{self.prefix}.nodes.{node}.cmd"

    def chat(self, node: str = "*") -> str:
        """Chat completion requests for the serving jobs of a node's worker (request/reply): only the api
        may send them, only that node's worker receives them (shared/infra/bus_auth.py)."""
        return f"{self.prefix}.nodes.{node}.chat"

    def command_refusals(self, node: str = "*") -> str:
        """A worker's report of a command it refused (unsigned or wrongly signed); kept in the audit stream."""
        return f"{self.prefix}.nodes.{node}.refused"

    def job_events(self, job_id: str = "*", source: str = "*") -> str:
        """A job's events as published by `source`: a node's worker (`jobs.<node>.<job>.events`, which
        only that node's key may publish) or the api (API_SOURCE). Read with the default `*` source."""
        return f"{self.prefix}.jobs.{source}.{job_id}.events"

    def event_source(self, subject: str) -> str | None:
        """Who published a job event: the node of its subject, or API_SOURCE; None for any other
        subject. The bus lets only that node's worker (or the api) publish there, so a payload naming
        another node is forged."""
        parts = subject.split(".")
        if len(parts) == 5 and parts[:2] == [self.prefix, "jobs"] and parts[4] == "events":
            return parts[2]
        return None

    def event_sender_refusal(self, subject: str, kind: str, node: str | None) -> str | None:
        """None if a job event of `kind` claiming `node` came on its rightful sender's subject: the api's
        for the api's kinds, the named node's for a trainer's; else why it is refused."""
        source = self.event_source(subject)
        if source is None:
            return f"subject {subject[:200]!r} names no event source"
        if kind in API_EVENT_KINDS:
            return None if source == API_SOURCE else f"a {kind} event from {source!r}: only the api sends those"
        if source != node:
            return f"published by node {source!r} for node {str(node)[:100]!r}"
        return None

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
        return f"{self.prefix}_leaders"  # the leases of the decider and the executor (shared/infra/leases.py)

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
    def refusals_stream(self) -> str:
        """Workers' refusal reports, in a stream of their own: JetStream dedups by msg id per stream, and a
        worker chooses its ids, so beside the audit events it could take an audit event's id first."""
        return f"{self.prefix.upper()}_REFUSALS"

    @property
    def dead_letter_stream(self) -> str:
        return f"{self.prefix.upper()}_DEAD"

    def streams(self) -> dict[str, list[str]]:
        return {
            self.jobs_stream: [self.job_events("*")],
            self.decisions_stream: [self.decisions],
            self.audit_stream: [self.audit],
            self.dead_letter_stream: [self.dead_letters("*")],
            self.refusals_stream: [self.command_refusals("*")],  # after the audit stream, which had them once
        }
