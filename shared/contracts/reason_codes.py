"""Reason codes: the closed set of reasons the decider gives, each beside its sentence.

Every decision a rule emits, every pending reason and every refusal of arbitration carries one of
these codes next to the human sentence that explains it: a client, a dashboard, a metric or a test
matches the code, and a person reads the sentence. The codes are part of the contract between the
decider, the api and the audit log, so they live here; a code is never renamed, only added.

A pending reason is a `Reason`: a `str` (the sentence, which is what the bucket, the audit and the
simulator's digest see) that also knows its `code`.
"""

from __future__ import annotations

from enum import StrEnum


class ReasonCode(StrEnum):
    # --- decisions, by the rule that emits them -----------------------------------------------------
    ADMIT = "admit"  # priority_fifo: a pending job fits and starts
    OOM_RETRY_ROOMY_DEVICE = "oom_retry.roomy_device"  # restart an OOM-killed job on a roomier device
    OOM_RETRY_SMALLER_BATCH = "oom_retry.smaller_batch"  # restart it with half the micro-batch
    OOM_RETRY_GIVE_UP = "oom_retry.give_up"  # out of memory again with its retries spent: it fails
    OOM_MIGRATE = "oom.migrate"  # oom_protection: move before memory runs out
    OOM_SCALE_OUT = "oom.scale_out"  # oom_protection: spread the memory over more devices
    OOM_PREEMPT = "oom.preempt"  # oom_protection: checkpoint and requeue before the crash
    OOM_SMALLER_BATCH = "oom.smaller_batch"  # restart in place with half the micro-batch (the bandit's arm)
    PRIORITY_PREEMPT = "priority.preempt"  # priority_scheduling: a lower level yields its devices
    PRIORITY_SHRINK = "priority.shrink"  # priority_scheduling: an elastic lower level shrinks
    QUEUE_ORDER_PREEMPT = "queue_order.preempt"  # queue_order: a job later in the order yields
    DEFRAG_MIGRATE = "defrag.migrate"  # defragmentation: move a small job to make a node whole
    CONSOLIDATE_MIGRATE = "consolidate.migrate"  # consolidate: bring a multi-node job onto one node
    ELASTIC_GROW = "elastic.grow"  # elastic_scale: nothing waits, grow
    ELASTIC_SHRINK = "elastic.shrink"  # elastic_scale: shrink a peer for a waiting job
    LOAD_BALANCE_MIGRATE = "load_balance.migrate"  # load_balance: move off a hot node
    COMM_JITTER_MIGRATE = "comm_jitter.migrate"  # comm_jitter: re-place on a tighter topology
    COMM_JITTER_TUNE = "comm_jitter.tune"  # comm_jitter: no tighter placement, tune NCCL
    DRAIN_REQUESTED_MIGRATE = "drain.requested_migrate"  # an operator's migrate request
    DRAIN_MIGRATE = "drain.migrate"  # draining a node: move the job elsewhere
    DRAIN_PREEMPT = "drain.preempt"  # draining a node: no room elsewhere, requeue
    DRAIN_CORDON = "drain.cordon"  # the drained node is empty: cordon it
    AFTER_CANCEL = "after.cancel"  # the job it runs after failed, was cancelled or is gone
    BANDIT_PLACEMENT = "bandit.placement"  # the bandit chose another feasible device set
    MANUAL = "manual"  # an operator's action through the api
    UNCODED = "uncoded"  # a plugin rule's action or reason that named no code

    # --- pending reasons --------------------------------------------------------------------------
    PENDING_OVER_QUOTA = "pending.over_quota"
    PENDING_BEHIND_HIGHER_PRIORITY = "pending.behind_higher_priority"
    PENDING_NO_FREE_DEVICES = "pending.no_free_devices"
    PENDING_NEVER_FITS = "pending.never_fits"  # needs more devices than any schedulable node has
    PENDING_NO_NODES = "pending.no_nodes"
    PENDING_MAKING_ROOM = "pending.making_room"  # a rule is preempting, shrinking or moving for it
    PENDING_VICTIMS_COOLING = "pending.victims_cooling"  # the jobs that could yield gave way recently
    PENDING_START_HELD = "pending.start_held"  # its start was refused by arbitration this pass
    PENDING_START_DECIDED = "pending.start_decided"  # the executor is placing it
    PENDING_AFTER = "pending.after"  # waits for the job it runs after
    PENDING_AFTER_FAILED = "pending.after_failed"  # that job will not succeed: it is being cancelled
    PENDING_UNREADABLE = "pending.unreadable"  # the decider cannot read its row
    PENDING_NOT_EVALUATED = "pending.not_evaluated"  # no pass has looked at it yet
    PENDING_CONTROLLER_PAUSED = "pending.controller_paused"  # an operator paused the controller

    # --- refusals: why arbitration held a proposal back -------------------------------------------
    REFUSED_IN_FLIGHT = "refused.in_flight"
    REFUSED_TAKEN_THIS_PASS = "refused.taken_this_pass"
    REFUSED_COOLING_DOWN = "refused.cooling_down"
    REFUSED_NOT_PENDING = "refused.not_pending"
    REFUSED_NOT_RUNNING = "refused.not_running"
    REFUSED_NO_LIVE_JOB = "refused.no_live_job"
    REFUSED_NODE_UNSCHEDULABLE = "refused.node_unschedulable"
    REFUSED_DEVICE_NOT_FREE = "refused.device_not_free"
    REFUSED_DEVICE_TAKEN = "refused.device_taken"
    REFUSED_RATE_LIMIT = "refused.rate_limit"
    REFUSED_ROOM_ALREADY_MADE = "refused.room_already_made"

    # --- incidents about a rule itself ------------------------------------------------------------
    RULE_ERROR = "rule.error"
    RULE_OVERRUN = "rule.overrun"
    RULE_CONFIG_ERROR = "rule.config_error"


class Reason(str):
    """A sentence with its code. Compares, hashes, prints and serializes as the sentence."""

    code: ReasonCode

    def __new__(cls, code: ReasonCode | str, text: str) -> Reason:
        reason = super().__new__(cls, text)
        reason.code = ReasonCode(code)
        return reason

    def __reduce__(self):
        return (Reason, (self.code, str(self)))


def code_of(reason: object, default: ReasonCode = ReasonCode.UNCODED) -> ReasonCode:
    """The code of a `Reason` or an action; `default` for a plain string or an uncoded action."""
    return getattr(reason, "code", None) or getattr(reason, "reason_code", None) or default
