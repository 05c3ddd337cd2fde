"""The job transition table: named transitions, the edges derived from them, reachability."""

import pytest

from shared.contracts.job_status import (
    HOLDING_GPUS,
    NAMED,
    TERMINAL,
    TRANSITIONS,
    UNPLACED,
    InvalidTransition,
    JobStatus,
    check_transition,
    reachable_from,
)

S = JobStatus


@pytest.mark.parametrize(
    "old,new",
    [
        (S.PENDING, S.SCHEDULED),
        (S.SCHEDULED, S.STARTING),
        (S.STARTING, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.CHECKPOINTING),
        (S.CHECKPOINTING, S.MIGRATING),
        (S.MIGRATING, S.STARTING),
        (S.CHECKPOINTING, S.PREEMPTED),
        (S.PREEMPTED, S.PENDING),
        (S.SCHEDULED, S.PENDING),
        (S.PENDING, S.CANCELLED),
        (S.PENDING, S.FAILED),  # only by a decision: out of memory past its retries (oom_retry)
    ],
)
def test_allowed(old, new):
    check_transition("j", old, new)


@pytest.mark.parametrize(
    "old,new",
    [
        (S.PENDING, S.RUNNING),
        (S.SUCCEEDED, S.RUNNING),
        (S.CANCELLED, S.PENDING),
        (S.PREEMPTED, S.RUNNING),
        (S.RUNNING, S.SCHEDULED),
        (S.FAILED, S.SUCCEEDED),
        (S.PAUSED, S.RUNNING),
        (S.PREEMPTED, S.FAILED),
    ],
)
def test_refused_names_what_is_allowed(old, new):
    with pytest.raises(InvalidTransition) as err:
        check_transition("j1", old, new)
    assert f"{old} -> {new}" in str(err.value)


def test_every_state_is_reachable_from_pending_and_every_live_one_can_end():
    assert reachable_from(S.PENDING) == set(JobStatus)
    for status in set(JobStatus) - TERMINAL:
        assert reachable_from(status) & TERMINAL, status
    assert all(not TRANSITIONS[s] for s in TERMINAL)


def test_named_transitions_need_a_placement_where_they_hold_devices():
    for t in NAMED.values():
        if t.new_attempt:
            assert t.target in HOLDING_GPUS and "placement" in t.requires, t.name
        assert not (t.target in UNPLACED and "placement" in t.requires), t.name
        assert t.target not in TERMINAL or "finished_at" in t.requires, t.name
