""" "Why is this job pending": the decider's answer from its last evaluation, in a NATS KV bucket.

The decider writes one entry per pending job (`job.<id>`): the reason in plain words and its
code (shared/contracts/reason_codes.py), the rule(s) that gave it with each one's code, since when that reason holds, and when it was last evaluated. Entries
are written when the reason changes (and refreshed now and then, so the bucket's TTL only
drops entries of a decider that stopped), and deleted when the job leaves the queue. The API
reads them with `read_pending_reason`; it never writes. A contract between two services, so it
lives here: the bucket's name and the entry's model.
"""

from __future__ import annotations

import logging
from typing import Any

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from shared.contracts.reason_codes import Reason, ReasonCode, code_of
from shared.infra.bus import Bus

log = logging.getLogger(__name__)
TTL_S = 24 * 3600.0
REFRESH_S = 3600.0
NOT_EVALUATED = Reason(ReasonCode.PENDING_NOT_EVALUATED, "waiting for the next evaluation")


def bucket_name(bus: Bus) -> str:
    return bus.subjects.pending_reasons_bucket


class PendingReason(BaseModel):
    """One bucket entry: why a job waits (the sentence and the first rule's code), by rule, since when,
    last evaluated when."""

    job_id: str
    reason: str
    reason_code: ReasonCode = ReasonCode.UNCODED
    rules: dict[str, str]
    rule_codes: dict[str, ReasonCode] = {}
    since: float
    evaluated_at: float


def _key(job_id: str) -> str:
    return f"job.{job_id}"


async def read_pending_reason(bus: Bus, job_id: str) -> PendingReason | None:
    """The decider's last word on why `job_id` waits, or None if it has none (yet)."""
    try:
        kv = await bus.js.key_value(bucket_name(bus))
        entry = await kv.get(_key(job_id))
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
        return None
    if not entry.value:
        return None
    try:
        return PendingReason.model_validate_json(entry.value)
    except (ValueError, ValidationError):
        return None


async def pending_reason_fields(bus: Bus, job_id: str) -> dict[str, Any]:
    """Fields for the API's job view: `pending_reason` in plain words and its code, which rules gave
    it (and each one's code), since when, and when the decider last evaluated the job. Empty if the
    decider has said nothing yet."""
    entry = await read_pending_reason(bus, job_id)
    if entry is None:
        return {}
    return {
        "pending_reason": entry.reason,
        "pending_reason_code": entry.reason_code,
        "pending_reason_rules": entry.rules,
        "pending_reason_codes": entry.rule_codes,
        "pending_since": entry.since,
        "pending_evaluated_at": entry.evaluated_at,
    }


class PendingReasonBoard:
    """The decider's side: mirrors the pending reasons of each pass into the bucket."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._kv: KeyValue | None = None
        self._written: dict[str, tuple[str, float, float]] = {}  # job -> (reason, since, written at)
        self._synced = False

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            name = bucket_name(self.bus)
            try:
                self._kv = await self.bus.js.key_value(name)
            except (BucketNotFoundError, NotFoundError):
                self._kv = await self.bus.js.create_key_value(
                    KeyValueConfig(
                        bucket=name,
                        history=1,
                        ttl=TTL_S,
                        storage=StorageType.FILE,
                        description="the decider's answer to: why is this job pending",
                    )
                )
        return self._kv

    async def publish(self, reasons: dict[str, dict[str, str]], pending_jobs: set[str], now: float) -> None:
        """`reasons`: job -> rule -> reason (a `Reason` carries its code), for the jobs the last pass
        looked at; `pending_jobs`: all pending."""
        kv = await self._bucket()
        if not self._synced:  # entries a previous decider left for jobs that since left the queue
            try:
                stale = [k for k in await kv.keys() if k.removeprefix("job.") not in pending_jobs]
            except NoKeysError:
                stale = []
            for key in stale:
                await kv.delete(key)
            self._synced = True
        for job_id in pending_jobs:
            by_rule = reasons.get(job_id) or {"decider": NOT_EVALUATED}
            text = "; ".join(by_rule.values())
            codes = {rule: code_of(reason) for rule, reason in by_rule.items()}
            old = self._written.get(job_id)
            if old and old[0] == text and now - old[2] < REFRESH_S:
                continue
            since = old[1] if old and old[0] == text else now
            entry = PendingReason(
                job_id=job_id,
                reason=text,
                reason_code=next(iter(codes.values())),
                rules={rule: str(reason) for rule, reason in by_rule.items()},
                rule_codes=codes,
                since=since,
                evaluated_at=now,
            )
            await kv.put(_key(job_id), entry.model_dump_json().encode())
            self._written[job_id] = (text, since, now)
        for job_id in [j for j in self._written if j not in pending_jobs]:
            try:
                await kv.delete(_key(job_id))
            except (KeyNotFoundError, NotFoundError):
                pass
            del self._written[job_id]
