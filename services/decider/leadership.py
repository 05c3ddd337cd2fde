"""Two deciders, one leader: a lease in a NATS KV bucket.

Every instance keeps its cluster view warm (it ingests the same telemetry), but only the
holder of the lease evaluates and publishes. The lease is the key `leader` in the bucket
`<prefix>_decider_leader`, whose entries expire after `lease_s`: the leader renews it every
`lease_s / 3` with a compare-and-set on its last revision; any other instance tries to create
it, which succeeds only once the key has expired or been released. A leader that has not
renewed for two thirds of the lease stops deciding on its own, before anyone else can take
over, so two leaders never decide at once. A leader that stops cleanly releases the key, so
the next takes over at its next attempt instead of after the lease.

A new leader does not know the old one's decisions in flight: the executor refuses a second
decision for a job that already moved, and audits why.
"""
from __future__ import annotations

import asyncio
import logging

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from shared.bus import Bus
from shared.clock import Clock, SystemClock

log = logging.getLogger(__name__)
KEY = "leader"


class Leadership:
    def __init__(self, bus: Bus, instance: str, lease_s: float, clock: Clock | None = None) -> None:
        self.bus = bus
        self.clock = clock or SystemClock()
        self.instance = instance
        self.lease_s = lease_s
        self._kv: KeyValue | None = None
        self._revision: int | None = None
        self._renewed = float("-inf")  # monotonic time of the last successful create or renew

    @property
    def bucket(self) -> str:
        return f"{self.bus.subjects.prefix}_decider_leader"

    @property
    def is_leader(self) -> bool:
        return self._revision is not None and self.clock.monotonic() - self._renewed < self.lease_s * 2 / 3

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.bus.js.key_value(self.bucket)
            except (BucketNotFoundError, NotFoundError):
                self._kv = await self.bus.js.create_key_value(KeyValueConfig(
                    bucket=self.bucket, history=1, ttl=self.lease_s, storage=StorageType.MEMORY,
                    description="which decider instance decides"))
        return self._kv

    async def attempt(self) -> bool:
        """Renew the lease if held, else try to take it. True while this instance leads."""
        try:
            kv = await self._bucket()
            if self._revision is not None:
                try:
                    self._revision = await kv.update(KEY, self.instance.encode(), last=self._revision)
                except (KeyWrongLastSequenceError, KeyNotFoundError):
                    log.warning("decider %s lost the lease", self.instance)
                    self._revision = None
            if self._revision is None:
                try:
                    self._revision = await kv.create(KEY, self.instance.encode())
                except KeyWrongLastSequenceError:
                    return False  # someone else holds it
            self._renewed = self.clock.monotonic()
            return True
        except Exception as err:  # NATS trouble: not leading until a renewal succeeds again
            log.warning("lease check failed: %s", err)
            return self.is_leader

    async def keep(self, stop: asyncio.Event, changed) -> None:
        """Attempt every lease_s / 3 until `stop`; call `changed(leading)` when that flips."""
        leading = False
        while not stop.is_set():
            now_leading = await self.attempt()
            if now_leading != leading:
                leading = now_leading
                await changed(leading)
            await self.clock.wait(stop, self.lease_s / 3)

    async def release(self) -> None:
        if self._revision is None or self._kv is None:
            return
        try:
            await self._kv.delete(KEY, last=self._revision)
        except Exception as err:  # it expires anyway
            log.info("lease not released: %s", err)
        self._revision = None
