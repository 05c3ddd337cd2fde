"""One leader per role (decider, executor): a lease in a NATS KV bucket, with a fencing token.

The lease is the key `<role>` in the bucket `<prefix>_leaders` (history 1, entries expire after
`lease_s`). The leader renews it every `lease_s / 4` with a compare-and-set on its last
revision; every other instance tries to create it every `lease_s / 10`, which succeeds only once
the key has expired or been released. The KV revision at which a leader took the lease is its
fencing token for as long as it holds it (renewals move the revision on, not the token, so its
own decisions never look stale to each other): revisions only grow, so a newer leader's token is
always greater than any revision its predecessor wrote, and whoever receives decisions or
commands (the executor's ledger, the workers) refuses one whose token is older than the newest
it has seen.

A leader that cannot renew steps down by its own deadline, two thirds of the lease after it last
*sent* a renewal that then succeeded, which is before the server can expire the key; each renewal
is bounded by that deadline, so a hung NATS call cannot keep a leader past it. A leader that stops
cleanly deletes the key, so the next takes over at once instead of after the lease.

Permissions (for the bus authorization tables): the JetStream stream `KV_<prefix>_leaders`
(created on first use), i.e. `$JS.API.STREAM.INFO.KV_<prefix>_leaders`,
`$JS.API.STREAM.CREATE.KV_<prefix>_leaders`, `$JS.API.DIRECT.GET.KV_<prefix>_leaders.>`,
`$JS.API.STREAM.MSG.GET.KV_<prefix>_leaders` and publish to `$KV.<prefix>_leaders.<role>`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from shared.contracts.messages import AuditEvent
from shared.contracts.subjects import Subjects
from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.retry import doubling, retrying

log = logging.getLogger(__name__)
ROLES = ("decider", "executor")


def bucket_name(prefix: str) -> str:
    return Subjects(prefix).leader_bucket


@dataclass(frozen=True)
class Instance:
    """Who holds a lease: host and pid, for people; a random tag, so a restarted pid is not taken for its ancestor."""

    host: str
    pid: int
    tag: str

    @classmethod
    def this_process(cls) -> Instance:
        return cls(socket.gethostname(), os.getpid(), secrets.token_hex(3))

    def __str__(self) -> str:
        return f"{self.host}-{self.pid}-{self.tag}"


class Lease:
    def __init__(
        self,
        bus: Bus,
        role: str,
        lease_s: float,
        instance: Instance | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        self.bus = bus
        self.role = role
        self.lease_s = lease_s
        self.instance = instance or Instance.this_process()
        self._clock = clock
        self._kv: KeyValue | None = None
        self._revision: int | None = None  # the lease's current revision, for the compare-and-set
        self._token: int | None = None  # the revision it was taken at: the fencing token
        self._renewed = float("-inf")  # when the last successful create or renew was sent

    @property
    def bucket(self) -> str:
        return bucket_name(self.bus.subjects.prefix)

    @property
    def deadline(self) -> float:
        """When this leader stops leading unless it renews first: before the lease can expire."""
        return self._renewed + self.lease_s * 2 / 3

    @property
    def is_leader(self) -> bool:
        return self._revision is not None and self._clock() < self.deadline

    @property
    def last_token(self) -> int | None:
        """The token of the lease this instance holds or last held (for logs and audit)."""
        return self._token

    @property
    def token(self) -> int | None:
        """The fencing token while leading: the KV revision at which this instance took the lease."""
        return self._token if self.is_leader else None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self.bus.js.key_value(self.bucket)
            except (BucketNotFoundError, NotFoundError):
                self._kv = await self.bus.js.create_key_value(
                    KeyValueConfig(
                        # On disk: a restarted NATS keeps the revisions growing, so tokens never go back.
                        bucket=self.bucket,
                        history=1,
                        ttl=self.lease_s,
                        storage=StorageType.FILE,
                        description="which decider and which executor lead",
                    )
                )
        return self._kv

    async def attempt(self, timeout: float | None = None) -> bool:
        """Renew the lease if held, else try to take it, within `timeout`. True while this instance leads."""
        try:
            return await asyncio.wait_for(self._attempt(), timeout)
        except Exception as err:  # NATS away, or too slow: leading only until the deadline
            if self._revision is not None:
                log.warning("%s lease not renewed: %s", self.role, err or type(err).__name__)
            return self.is_leader

    async def _attempt(self) -> bool:
        kv = await self._bucket()
        sent = self._clock()
        value = str(self.instance).encode()
        if self._revision is not None:
            try:
                self._revision = await kv.update(self.role, value, last=self._revision)
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                log.warning("%s %s lost its lease", self.role, self.instance)
                self._revision = None
        if self._revision is None:
            try:
                self._revision = await kv.create(self.role, value)
            except KeyWrongLastSequenceError:
                return False  # someone else holds it
            self._token = self._revision
        self._renewed = sent
        return True

    async def keep(self, stop: asyncio.Event, changed: Callable[[bool], Awaitable[None]]) -> None:
        """Hold or seek the lease until `stop`; `changed(leading)` is awaited when that flips."""
        leading = False
        try:
            while not stop.is_set():
                budget = max(0.05, self.deadline - self._clock()) if leading else self.lease_s / 4
                now_leading = await self.attempt(timeout=min(budget, self.lease_s / 2))
                if now_leading != leading:
                    leading = now_leading
                    await changed(leading)
                pause = self.lease_s / 4 if leading else self.lease_s / 10
                if leading:  # wake in time to step down by the deadline even if the next renewal hangs
                    pause = min(pause, max(0.0, self.deadline - self._clock()))
                try:
                    await asyncio.wait_for(stop.wait(), pause)
                except TimeoutError:
                    pass
        finally:
            if leading:
                await self.release()
                await changed(False)

    async def release(self) -> None:
        if self._revision is None or self._kv is None:
            return
        revision, self._revision = self._revision, None
        try:
            await asyncio.wait_for(self._kv.delete(self.role, last=revision), 2)
        except Exception as err:  # it expires anyway
            log.info("%s lease not released: %s", self.role, err)

    def audit_event(self, leading: bool) -> AuditEvent:
        """`<role>.leading` (or `.following`, once that lease is over), naming the instance: host and pid."""
        i, token = self.instance, self._token
        verb = "leads" if leading else "no longer leads"
        return AuditEvent(
            event_id=f"{self.role}.{'leading' if leading else 'following'}:{i}:{token}",
            ts=time.time(),
            source=self.role,
            kind=f"{self.role}.{'leading' if leading else 'following'}",
            reason=f"{self.role} {i.host} pid {i.pid} {verb}" + (f" (fencing token {token})" if token else ""),
            data={"instance": str(i), "host": i.host, "pid": i.pid, "token": token},
        )


async def audit_soon(bus: Bus, event: AuditEvent, stop: asyncio.Event, clock: Clock, tries: int = 30) -> None:
    """Publish a leadership audit event, retrying while NATS is away (its id dedupes a repeat)."""

    def first_failure(attempt: int, err: BaseException | None) -> None:
        if attempt == 1:
            log.warning("%s not audited yet: %s", event.kind, err)

    try:
        await retrying(clock, wait=doubling(0.2, 5), attempts=tries, until=stop.is_set, on_failure=first_failure)(
            bus.audit, event
        )
    except Exception:  # noqa: BLE001 - NATS away all along
        if not stop.is_set():
            log.error("%s could not be audited", event.kind)
