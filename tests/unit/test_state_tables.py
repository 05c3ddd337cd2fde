"""Node and protocol-step tables, exit outcomes, and the database's copy of them (migrations 008, 024)."""

import re
from pathlib import Path

import pytest

from shared.contracts.job_status import NAMED, TRANSITIONS, JobStatus
from shared.contracts.node_status import NODE_TRANSITIONS, InvalidNodeTransition, NodeStatus, sources_of
from shared.contracts.outcomes import JOB_TRANSITION, ExitOutcome
from shared.contracts.protocol_steps import InvalidStep, ProtocolKind, Step, check_step

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
MIGRATION = "\n".join(p.read_text() for p in sorted(MIGRATIONS.glob("*.sql")))


def _constraint(name: str) -> str:
    """The constraint as the newest migration that adds it says."""
    found = re.findall(rf"CONSTRAINT {name} CHECK \((.*?)\);", MIGRATION, re.S)
    assert found, name
    return found[-1]


def test_the_database_holds_the_same_job_edges_and_states():
    edges = set(re.findall(r"'([a-z_]+>[a-z_]+)'", _constraint("job_status_history_edge")))
    assert edges == {f"{a}>{b}" for a, targets in TRANSITIONS.items() for b in targets}
    assert set(re.findall(r"'([a-z_]+)'", _constraint("jobs_status_known"))) == {s.value for s in JobStatus}


def test_the_database_holds_the_same_steps_and_kinds():
    assert set(re.findall(r"'([a-z_]+)'", _constraint("protocols_step_known"))) == {s.value for s in Step}
    assert set(re.findall(r"'([a-z_]+)'", _constraint("protocols_kind_known"))) == {k.value for k in ProtocolKind}


def test_node_table():
    assert sources_of(NodeStatus.LOST) == {NodeStatus.READY, NodeStatus.CORDONED, NodeStatus.DRAINING}
    assert sources_of(NodeStatus.READY) == {NodeStatus.CORDONED, NodeStatus.DRAINING, NodeStatus.LOST}
    assert NodeStatus.CORDONED not in NODE_TRANSITIONS[NodeStatus.LOST]  # a lost node comes back ready first
    assert "lost -> cordoned" in str(InvalidNodeTransition("n1", NodeStatus.LOST, NodeStatus.CORDONED))


@pytest.mark.parametrize(
    "old,new,ok",
    [
        (Step.STOPPING, Step.HOLD, True),
        (Step.STOPPING, Step.PLACING, True),
        (Step.PLACING, Step.STARTING_TARGET, True),
        (Step.STARTING_TARGET, Step.ROLLBACK, True),
        (Step.ROLLBACK, Step.STARTING_TARGET, True),
        (Step.STOPPING, Step.STARTING_TARGET, False),
        (Step.HOLD, Step.PLACING, False),
        (Step.PLACING, Step.ROLLBACK, False),
    ],
)
def test_protocol_steps(old, new, ok):
    if ok:
        check_step("p", old, new)
    else:
        with pytest.raises(InvalidStep, match=f"{old} -> {new}"):
            check_step("p", old, new)


@pytest.mark.parametrize(
    "code,cancelled,outcome",
    [
        (0, False, ExitOutcome.SUCCEEDED),
        (75, False, ExitOutcome.STOPPED),
        (76, False, ExitOutcome.OOM),
        (1, False, ExitOutcome.FAILED),
        (2, False, ExitOutcome.FAILED),
        (-9, False, ExitOutcome.KILLED),
        (None, False, ExitOutcome.KILLED),
        (0, True, ExitOutcome.CANCELLED),
        (-15, True, ExitOutcome.CANCELLED),
    ],
)
def test_exit_code_to_outcome(code, cancelled, outcome):
    assert ExitOutcome.of_exit(code, cancelled) == outcome


def test_outcomes_match_the_trainer_contract_and_lead_to_named_transitions():
    from worker.trainer.exit_codes import ExitCode

    assert ExitOutcome.of_exit(ExitCode.STOPPED_AFTER_CHECKPOINT) == ExitOutcome.STOPPED
    assert ExitOutcome.of_exit(ExitCode.OUT_OF_MEMORY) == ExitOutcome.OOM
    assert ExitOutcome.of_exit(ExitCode.CONFIG_ERROR) == ExitOutcome.FAILED
    assert set(JOB_TRANSITION) == set(ExitOutcome) and set(JOB_TRANSITION.values()) <= set(NAMED)
    assert ExitOutcome.of_last_event({"event": "oom"}) == ExitOutcome.OOM
    assert ExitOutcome.of_last_event({"event": "progress"}) == ExitOutcome.KILLED
