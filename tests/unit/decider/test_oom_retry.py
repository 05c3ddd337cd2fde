"""oom_retry over built snapshots: a roomier device first, else half the micro-batch with the
global batch kept, else gradient checkpointing if it was off, else the same settings said to be
so; only jobs whose last attempt ran out of memory."""

from services.decider.rules.oom_retry import OomRetry, decide, smaller_batch
from tests.unit.decider.builders import Cluster

GiB = 2**30


def _oom(cluster, job_id="j", **kw):
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
