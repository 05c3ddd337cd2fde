"""Whether this decider decides: always without leases; with them, only while it holds the decider
lease, each decision fenced with the lease's token. Becoming the leader is audited and starts this
instance afresh (`on_leading`): what it expected before is stale."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.config import AdcConfig
from shared.infra.leases import Instance, Lease, audit_soon

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, bus: Bus, config: AdcConfig, clock: Clock, on_leading: Callable[[], None]) -> None:
        self.bus = bus
        self.clock = clock
        instance = Instance.this_process()
        self.instance = str(instance)
        self.lease = Lease(bus, "decider", config.leases.lease_s, instance) if config.leases.enabled else None
        self._on_leading = on_leading
        self._stop: asyncio.Event | None = None

    @property
    def fenced(self) -> bool:
        """Decisions carry a fencing token (leases are on)."""
        return self.lease is not None

    @property
    def leads(self) -> bool:
        return self.lease is None or self.lease.is_leader

    @property
    def token(self) -> int | None:
        """The fencing token while leading (None once this instance stepped down, or without leases)."""
        return self.lease.token if self.lease is not None else None

    async def keep(self, stop: asyncio.Event) -> None:
        """Hold or seek the lease until `stop` (it is released as this ends); nothing without leases."""
        if self.lease is None:
            return
        self._stop = stop
        await self.lease.keep(stop, self._changed)

    async def _changed(self, leading: bool) -> None:
        asyncio.ensure_future(audit_soon(self.bus, self.lease.audit_event(leading), self._stop, self.clock))
        log.warning("decider %s %s (token %s)", self.instance, "leads" if leading else "follows", self.lease.last_token)
        if leading:
            self._on_leading()
