"""The job transition table."""
import pytest

from shared.job_status import TERMINAL, TRANSITIONS, InvalidTransition, JobStatus, check_transition

S = JobStatus


@pytest.mark.parametrize("old,new", [
    (S.PENDING, S.SCHEDULED), (S.SCHEDULED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.CHECKPOINTING), (S.CHECKPOINTING, S.MIGRATING), (S.MIGRATING, S.STARTING),
    (S.CHECKPOINTING, S.PREEMPTED), (S.PREEMPTED, S.PENDING), (S.SCHEDULED, S.PENDING), (S.PENDING, S.CANCELLED),
])
def test_allowed(old, new):
    check_transition("j", old, new)


@pytest.mark.parametrize("old,new", [
    (S.PENDING, S.RUNNING), (S.SUCCEEDED, S.RUNNING), (S.CANCELLED, S.PENDING), (S.PREEMPTED, S.RUNNING),
    (S.RUNNING, S.SCHEDULED), (S.FAILED, S.SUCCEEDED),
])
def test_refused_names_what_is_allowed(old, new):
    with pytest.raises(InvalidTransition) as err:
        check_transition("j1", old, new)
    assert f"{old} -> {new}" in str(err.value)


def test_terminal_states_have_no_way_out_and_every_state_is_reachable():
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    reachable = {S.PENDING} | {n for targets in TRANSITIONS.values() for n in targets}
    assert reachable == set(JobStatus)
