"""oom_retry over built snapshots: a roomier device first, else half the micro-batch with the
global batch kept, else gradient checkpointing if it was off, else the same settings said to be
so; only jobs whose last attempt ran out of memory; past `max_retries` the job is failed, by this
rule (the executor only requeues it)."""

from services.decider.rules.oom_retry import OomRetry, decide, smaller_batch
from shared.contracts.actions import Fail, Start
from shared.contracts.reason_codes import ReasonCode
from tests.unit.decider.builders import Cluster

GiB = 2**30


def _oom(cluster, job_id="j", **kw):
    kw.setdefault("oom_retries", 1)  # the executor counted the exit that requeued it
    return cluster.pending(job_id, last_outcome="oom", resume_from="/c/checkpoint-6", **kw)


def test_a_device_with_more_free_memory_than_the_peak_is_taken_first():
    c = Cluster().node("small", 1, memory_gib=16).node("big", 1, memory_gib=80)
    c.memory("small", 0, 0.5, 60)
    [start] = decide(_oom(c, peak_memory_bytes=20 * GiB, micro_batch=4, grad_accum=1).snapshot(), OomRetry()).actions
    assert start.placement[0].node == "big" and start.train_overrides == {}
    assert start.resume_from == "/c/checkpoint-6" and start.evidence["remedy"] == "more_memory"
    assert "ran out of memory at a peak of 20.00 GiB" in start.reason and "79." in start.reason


def test_no_roomier_device_halves_the_micro_batch_and_keeps_the_global_batch():
    c = Cluster().node("a", 2, memory_gib=16)
    [start] = decide(_oom(c, peak_memory_bytes=15 * GiB, micro_batch=4, grad_accum=2).snapshot(), OomRetry()).actions
    assert start.train_overrides == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    assert "micro-batch 4 -> 2, gradient accumulation 2 -> 4 (global batch kept)" in start.reason
    assert start.placement[0].node == "a" and start.evidence["remedy"] == "smaller_batch"


def test_cpu_slots_without_memory_telemetry_get_the_smaller_batch():
    c = Cluster().node("cpu", 1, memory_gib=0)
    [start] = decide(_oom(c, peak_memory_bytes=GiB, micro_batch=8).snapshot(), OomRetry()).actions
    assert start.train_overrides["per_device_train_batch_size"] == 4


def test_micro_batch_1_turns_gradient_checkpointing_on_where_the_job_switched_it_off():
    assert smaller_batch(Cluster().pending("x", micro_batch=1, gradient_checkpointing=False).jobs[0]) == {
        "gradient_checkpointing": True,
        "disable_gradient_checkpointing": False,
    }


def test_with_nothing_left_to_shrink_the_retry_says_so_and_changes_nothing():
    # LLaMA-Factory checkpoints gradients by default: switching it "on" again would change nothing.
    c = Cluster().node("a", 1, memory_gib=16)
    [start] = decide(_oom(c, peak_memory_bytes=15 * GiB, micro_batch=1).snapshot(), OomRetry()).actions
    assert start.train_overrides == {} and start.evidence["remedy"] == "none"
    assert "nothing left to shrink" in start.reason


def test_other_pending_jobs_and_jobs_that_do_not_fit_are_left_to_admission():
    c = Cluster().node("a", 1).pending("plain").pending("big", gpus=4, last_outcome="oom")
    assert decide(c.snapshot(), OomRetry()).actions == []


def test_a_job_out_of_memory_past_its_retries_is_failed_with_the_code_and_the_count():
    c = Cluster().node("a", 1, memory_gib=16)
    [fail] = decide(_oom(c, oom_retries=3, peak_memory_bytes=15 * GiB, micro_batch=1).snapshot(), OomRetry()).actions
    assert isinstance(fail, Fail) and fail.job_id == "j" and fail.reason_code == ReasonCode.OOM_RETRY_GIVE_UP
    assert "ran out of memory 3 times" in fail.reason and "failed after 2 retries" in fail.reason
    assert "strategies.oom_retry.max_retries is 2" in fail.reason
    assert fail.evidence == {"oom_retries": 3, "max_retries": 2, "peak_memory_bytes": 15 * GiB}


def test_the_last_retry_within_the_budget_is_still_a_start_that_counts_it():
    c = Cluster().node("a", 1, memory_gib=16)
    [start] = decide(_oom(c, oom_retries=2, micro_batch=4).snapshot(), OomRetry()).actions
    assert isinstance(start, Start) and "retry 2 of 2" in start.reason


def test_the_budget_is_the_rules_config_and_zero_fails_at_the_first_exit():
    [fail] = decide(_oom(Cluster().node("a", 1), oom_retries=1).snapshot(), OomRetry(max_retries=0)).actions
    assert isinstance(fail, Fail) and "failed after 0 retries" in fail.reason
    [start] = decide(_oom(Cluster().node("a", 1), oom_retries=3).snapshot(), OomRetry(max_retries=5)).actions
    assert isinstance(start, Start) and "retry 3 of 5" in start.reason


def test_a_job_to_give_up_need_not_fit_and_others_are_still_retried():
    c = Cluster().node("a", 1, memory_gib=16)
    c = _oom(c, "spent", oom_retries=3, gpus=4)  # needs more devices than exist: failed all the same
    c = _oom(c, "again", oom_retries=1, micro_batch=2)
    actions = decide(c.snapshot(), OomRetry()).actions
    assert {(type(a).__name__, a.job_id) for a in actions} == {("Fail", "spent"), ("Start", "again")}
