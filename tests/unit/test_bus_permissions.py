"""The permission table (shared/infra/bus_auth.py) says what docs/security.md says each role may do, and a
service's database URL names its own role. The server enforcing them is tests/security."""

from __future__ import annotations

from shared.contracts.subjects import Subjects
from shared.infra.bus_auth import SERVICE_ROLES, collector_role, permissions, worker_role
from shared.infra.db import service_url

S = Subjects("adc")
ROLES = [*SERVICE_ROLES, worker_role("n1"), collector_role("n1")]


def publishers(subject: str) -> set[str]:
    return {r for r in ROLES if subject in permissions(r, S).publish}


def test_who_may_publish_what():
    assert publishers(S.command("*")) == {"executor"}
    assert publishers(S.decisions) == {"api", "decider"}
    assert publishers(S.audit) == {"api", "decider", "executor", "audit-sink"}  # services, never a node
    assert publishers(S.heartbeat("n1")) == {worker_role("n1")}
    assert publishers(S.metrics("n1")) == {collector_role("n1")}
    assert publishers(S.command_refusals("n1")) == {worker_role("n1")}
    assert publishers(S.chat("*")) == {"api"}  # chat completions for serving jobs: the api's requests only


def test_a_worker_hears_only_its_own_commands_and_answers_only_those():
    p = permissions(worker_role("n1"), S)
    assert p.subscribe == (S.command("n1"), S.chat("n1"), "_INBOX.adc.worker-n1.>") and p.allow_responses
    assert not any(s.startswith("$JS.API") for s in p.publish)  # no stream or consumer administration
    assert not any(">" in s or s.endswith(".*.heartbeat") for s in p.publish)


def test_only_the_admin_manages_streams_and_each_consumer_has_one_owner():
    for role in ROLES:
        stream_ops = [s for s in permissions(role, S).publish if ".STREAM.CREATE.ADC_" in s or ".STREAM.DELETE." in s]
        assert (role == "admin") == bool(stream_ops), role
    owners = {r for r in ROLES if "$JS.ACK.ADC_DECISIONS.adc-executor.>" in permissions(r, S).publish}
    assert owners == {"executor"}


def test_each_role_reads_replies_on_its_own_inbox_only():
    for role in ROLES:
        inboxes = [s for s in permissions(role, S).subscribe if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX.adc.{role}.>"]


def test_a_service_connects_as_its_own_role_without_the_admins_password(tmp_path):
    admin = "postgresql://adc:secret@db.example:5433/adc?sslmode=require"
    assert service_url(admin, "api") == "postgresql://adc_api@db.example:5433/adc?sslmode=require"
    (tmp_path / "adc_executor.password").write_text("p@ss/word\n")
    assert (
        service_url(admin, "executor", str(tmp_path))
        == "postgresql://adc_executor:p%40ss%2Fword@db.example:5433/adc?sslmode=require"
    )


def test_a_per_node_subject_names_its_node():
    assert S.node_of(S.heartbeat("n1")) == S.node_of(S.metrics("n1")) == S.node_of(S.command_refusals("n1")) == "n1"
    assert S.node_of(S.decisions) is None and S.node_of("other.metrics.n1") is None
