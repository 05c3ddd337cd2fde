"""NATS connection, JetStream stream setup and the publish/consume helpers every service uses."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from shared import tracing
from shared.messages import AuditEvent, Message
from shared.subjects import Subjects

log = logging.getLogger(__name__)


class Bus:
    """One NATS connection with JetStream, bound to a subject prefix."""

    def __init__(self, nc: Client, subjects: Subjects, name: str = "adc") -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.subjects = subjects
        self.name = name  # the service, also the name of its spans (shared/tracing.py)

    @classmethod
    async def connect(cls, url: str, prefix: str, name: str) -> "Bus":
        async def on_disconnect() -> None:
            log.warning("%s: disconnected from NATS, reconnecting", name)

        async def on_reconnect() -> None:
            log.info("%s: reconnected to NATS", name)

        async def on_error(err: Exception) -> None:
            log.debug("%s: NATS error: %s", name, err)

        nc = await nats.connect(
            servers=[url], name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=5, allow_reconnect=True,
            disconnected_cb=on_disconnect, reconnected_cb=on_reconnect, error_cb=on_error,
        )
        bus = cls(nc, Subjects(prefix), name.removeprefix("adc-"))
        await bus.ensure_streams()
        return bus

    async def ensure_streams(self) -> None:
        """Create or update the streams; running it twice changes nothing."""
        for name, subjects in self.subjects.streams().items():
            cfg = StreamConfig(
                name=name, subjects=subjects, retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE, duplicate_window=120.0, max_age=7 * 24 * 3600.0,
            )
            try:
                await self.js.add_stream(cfg)
            except BadRequestError:
                await self.js.update_stream(cfg)

    async def publish_js(self, subject: str, msg: Message, msg_id: str) -> None:
        """Publish to JetStream; the msg id makes a retried publish a no-op. Carries the trace context."""
        await self.js.publish(subject, msg.encode(), headers={"Nats-Msg-Id": msg_id, **tracing.inject()})

    async def request(self, subject: str, msg: Message, timeout: float) -> Msg:
        """Core NATS request/reply, carrying the trace context."""
        return await self.nc.request(subject, msg.encode(), timeout=timeout, headers=tracing.inject() or None)

    async def audit(self, event: AuditEvent) -> None:
        if (trace_id := tracing.trace_id()) and "trace_id" not in event.data:
            event = event.model_copy(update={"data": {**event.data, "trace_id": trace_id}})
        await self.publish_js(self.subjects.audit, event, event.event_id)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.nc.drain(), 5)
        except Exception:  # already closed, connection lost, or a stuck drain: close outright
            if not self.nc.is_closed:
                await self.nc.close()


Handler = Callable[[Msg], Awaitable[None]]


async def consume(
    bus: Bus, stream: str, subject: str, durable: str, handler: Handler,
    stop: asyncio.Event, *, ack_wait: float = 60.0, batch: int = 16, deliver_new: bool = False,
) -> None:
    """Pull messages from a durable consumer until `stop` is set.

    The handler acks; a handler that raises leaves the message unacked, so JetStream
    redelivers it after `ack_wait` (bounded by max_deliver); the loop goes on.
    """
    config = ConsumerConfig(
        durable_name=durable, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=20,
        deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
    )
    sub = await bus.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
    try:
        await _pull_loop(sub, durable, _traced(bus.name, handler), stop, batch)
    finally:
        try:
            await sub.unsubscribe()  # a pull subscription left open stalls the connection's drain
        except Exception:
            pass


def _traced(service: str, handler: Handler) -> Handler:
    """The handler, inside a consumer span continuing the sender's trace when the message carries one."""
    async def handle(msg: Msg) -> None:
        parent = tracing.extract(msg.headers)
        if parent is None:
            return await handler(msg)
        with tracing.span(service, f"consume {msg.subject}", parent=parent, kind=tracing.SpanKind.CONSUMER):
            await handler(msg)

    return handle


async def _pull_loop(sub, durable: str, handler: Handler, stop: asyncio.Event, batch: int) -> None:
    while not stop.is_set():
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except NatsTimeout:
            continue
        except Exception as err:  # connection trouble: the client reconnects; try again
            log.warning("%s: fetch failed: %s", durable, err)
            await asyncio.sleep(0.5)
            continue
        for msg in msgs:
            try:
                await handler(msg)
            except Exception:
                log.exception("%s: handler failed; message will be redelivered", durable)
                try:
                    await msg.nak(delay=1.0)
                except Exception:
                    pass
