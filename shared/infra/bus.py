"""NATS connection, JetStream stream setup and the publish/consume helpers every service uses."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from shared.contracts.messages import AuditEvent, Message
from shared.contracts.subjects import Subjects
from shared.infra import command_auth, tracing
from shared.infra.bus_auth import BusCredential, BusDeployment, inbox_prefix
from shared.infra.bus_tls import client_context
from shared.infra.storable import storable_text

log = logging.getLogger(__name__)
PING_WAIT_S = 60  # the longest a round trip's ping waits for its pong (nats-py's flush timeout)


def _settled(task: asyncio.Future) -> None:
    """A shielded flush nobody waits for any more: its outcome is taken, so none is reported as lost."""
    if not task.cancelled():
        task.exception()


class Bus:
    """One NATS connection with JetStream, bound to a subject prefix."""

    def __init__(
        self, nc: Client, subjects: Subjects, name: str = "adc", credential: BusCredential | None = None
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.subjects = subjects
        self.name = name  # the service, also the name of its spans (shared/infra/tracing.py)
        self.credential = credential  # the role it connected as; the executor also signs commands with it
        self._keypair = None
        self._msg_id_key: bytes | None = None

    @classmethod
    async def connect(cls, url: str, prefix: str, name: str, credential: BusCredential | None = None) -> Bus:
        """Connect as `credential`'s role (its nkey seed, read from its file by the client; never logged).
        Without one the connection is anonymous, which a NATS with ADC's authorization refuses.
        Streams are not created here: `adc bus init` (the admin role) does that, as migrations do tables."""
        nc: Client | None = None

        async def on_disconnect() -> None:
            if nc is not None and not (nc.is_closed or nc.is_draining):  # a disconnect of our own close is no news
                log.warning("%s: disconnected from NATS, reconnecting", name)

        async def on_reconnect() -> None:
            log.info("%s: reconnected to NATS", name)

        async def on_error(err: Exception) -> None:
            if "permissions violation" in str(err).lower():  # refused by the server: worth an operator's look
                log.error("%s: NATS refused: %s", name, err)
            else:
                log.debug("%s: NATS error: %s", name, err)

        subjects = Subjects(prefix)
        auth = (
            {}
            if credential is None
            else {"nkeys_seed": str(credential.seed_file), "inbox_prefix": inbox_prefix(subjects, credential.role)}
        )
        if credential is not None and credential.ca_file is not None:  # TLS first, the server checked against the CA
            auth |= {"tls": client_context(credential.ca_file), "tls_handshake_first": True}
        nc = await nats.connect(
            servers=[url],
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=5,
            allow_reconnect=True,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=on_error,
            **auth,
        )
        return cls(nc, subjects, name.removeprefix("adc-"), credential)

    async def ensure_streams(self) -> None:
        """Create or update the streams; running it twice changes nothing."""
        for name, subjects in self.subjects.streams().items():
            cfg = StreamConfig(
                name=name,
                subjects=subjects,
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=120.0,
                max_age=7 * 24 * 3600.0,
            )
            try:
                await self.js.add_stream(cfg)
            except BadRequestError:
                await self.js.update_stream(cfg)

    async def publish_js(self, subject: str, msg: Message, msg_id: str, *, signed: bool = False) -> None:
        """Publish to JetStream; the msg id makes a retried publish a no-op. Carries the trace context;
        `signed`: with this role's signature (shared/infra/command_auth.py), as the api sends cancel requests."""
        payload = msg.encode()
        headers = {"Nats-Msg-Id": msg_id, **tracing.inject()}
        if signed:
            headers |= command_auth.sign(self._signing_key(), subject, payload)
        await self.js.publish(subject, payload, headers=headers)

    async def publish_js_unacked(self, subject: str, msg: Message, msg_id: str) -> None:
        """Onto a stream's subject as publish_js does, without waiting for JetStream's ack: for a message
        whose loss costs only a delay (what it announces is durable elsewhere)."""
        await self.nc.publish(subject, msg.encode(), headers={"Nats-Msg-Id": msg_id, **tracing.inject()})

    def private_msg_id(self, *parts: object) -> str:
        """A JetStream msg id no other role can predict. JetStream drops a message whose id it has seen
        in the stream's duplicate window, whoever published the first one and on whichever subject, so
        an id another key can guess lets that key publish it first and have the real message dropped.
        `<role>:<HMAC of the parts>`: the same parts give the same id (a retried publish stays a no-op,
        also from a restarted process), and only the holder of this role's seed can compute one."""
        if self._msg_id_key is None:  # a key of its own, derived from the seed (never the seed itself)
            seed = self.credential.seed_file.read_bytes().strip() if self.credential is not None else os.urandom(32)
            self._msg_id_key = hashlib.sha256(b"adc-msg-id\0" + seed).digest()
        mac = hmac.new(self._msg_id_key, ":".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()[:32]
        return f"{self.credential.role if self.credential is not None else self.name}:{mac}"

    def _signing_key(self):
        if self.credential is None:
            raise RuntimeError("signing needs a bus credential to sign with")
        if self._keypair is None:
            self._keypair = self.credential.keypair()
        return self._keypair

    async def request(self, subject: str, msg: Message, timeout: float, *, signed: bool = False) -> Msg:
        """Core NATS request/reply, carrying the trace context; `signed`: with this role's signature over
        subject and payload (shared/infra/command_auth.py), as the executor sends every command."""
        payload = msg.encode()
        headers = tracing.inject()
        if signed:
            headers |= command_auth.sign(self._signing_key(), subject, payload)
        return await self.nc.request(subject, payload, timeout=timeout, headers=headers or None)

    async def round_trip(self, timeout: float | None = None) -> bool:
        """Whether the server answered a ping within `timeout` (None: until the client's own flush gives
        up): what was published and subscribed before is then with the server. nats-py hands a ping's
        pong to the future it queued for it, and one that was cancelled meanwhile (a caller that timed
        out or went away) raises there and ends the connection's read loop for good, so the flush is
        shielded: a caller that stops waiting leaves it to take its pong."""
        flushing = asyncio.ensure_future(self.nc.flush(timeout=PING_WAIT_S))
        flushing.add_done_callback(_settled)
        try:
            await asyncio.wait_for(asyncio.shield(flushing), timeout)
        except (TimeoutError, nats.errors.Error):
            return False
        return True

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


async def init_streams(url: str, deployment: BusDeployment) -> None:
    """Create or update the installation's streams, as its admin role (what `adc bus init` runs)."""
    bus = await Bus.connect(url, deployment.prefix, "adc-admin", deployment.keys.credential("admin"))
    try:
        await bus.ensure_streams()
    finally:
        await bus.close()


Handler = Callable[[Msg], Awaitable[None]]
DeadLetterHook = Callable[[Msg, Exception], Awaitable[None]]

# A handler that fails with one of these waits for a dependency (Postgres, NATS, a worker):
# its message is redelivered, backing off, for as long as the outage lasts, and never dropped.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.TooManyConnectionsError,
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
)


def is_outage(err: BaseException) -> bool:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OUTAGE_ERRORS):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


@dataclass(frozen=True)
class Redelivery:
    """How failed messages come back. An outage: 0.5 s, 1 s, 2 s ... up to `outage_max_s`, without
    end. Any other failure is the message's own: after `poison_after` deliveries it goes to the
    dead-letter stream (`<prefix>.dead.<consumer>`), is audited, and the consumer moves on."""

    outage_first_s: float = 0.5
    outage_max_s: float = 15.0
    retry_s: float = 1.0
    poison_after: int = 5

    def outage_delay(self, delivered: int) -> float:
        return min(self.outage_max_s, self.outage_first_s * 2 ** min(max(delivered - 1, 0), 30))


async def consume(
    bus: Bus,
    stream: str,
    subject: str,
    durable: str,
    handler: Handler,
    stop: asyncio.Event,
    *,
    ack_wait: float = 60.0,
    batch: int = 16,
    deliver_new: bool = False,
    redelivery: Redelivery = Redelivery(),
    on_dead_letter: DeadLetterHook | None = None,
) -> None:
    """Pull messages from a durable consumer until `stop` is set.

    The handler acks. A handler that raises leaves the message to `redelivery`; an unacked
    message (a consumer that died) comes back after `ack_wait`. JetStream itself never gives up
    (no max_deliver): what gives up on a message is the poison rule, which keeps it.
    """
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=-1,
        deliver_policy=DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL,
        filter_subject=subject,
    )
    await bus.js.add_consumer(stream, config)  # create, or update one an older version made
    sub = await bus.js.pull_subscribe_bind(durable=durable, stream=stream)
    failures = _Failures(bus, durable, redelivery, on_dead_letter)
    try:
        await _pull_loop(sub, durable, _traced(bus.name, handler), stop, batch, failures)
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


async def _pull_loop(sub, durable: str, handler: Handler, stop: asyncio.Event, batch: int, failures: _Failures) -> None:
    while not stop.is_set():
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except TimeoutError:  # nats' own, or the builtin one when fetch's deadline runs out first
            continue
        except Exception as err:  # connection trouble: the client reconnects; try again
            log.warning("%s: fetch failed: %s", durable, err)
            await asyncio.sleep(0.5)
            continue
        for msg in msgs:
            try:
                await handler(msg)
            except Exception as err:
                await failures.handle(msg, err)


class _Failures:
    def __init__(self, bus: Bus, durable: str, redelivery: Redelivery, on_dead_letter: DeadLetterHook | None) -> None:
        self.bus, self.durable, self.redelivery, self.on_dead_letter = bus, durable, redelivery, on_dead_letter
        self._outage_logged = False

    async def handle(self, msg: Msg, err: Exception) -> None:
        delivered = msg.metadata.num_delivered or 1
        try:
            if is_outage(err):
                if not self._outage_logged or delivered % 20 == 0:  # once per outage, then now and then
                    log.warning(
                        "%s: a dependency is down (%s: %s); message kept, retried with backoff",
                        self.durable,
                        type(err).__name__,
                        err,
                    )
                    self._outage_logged = True
                await msg.nak(delay=self.redelivery.outage_delay(delivered))
            elif delivered >= self.redelivery.poison_after:
                await self._dead_letter(msg, err, delivered)
            else:
                log.exception(
                    "%s: handler failed (delivery %d of %d before dead-lettering)",
                    self.durable,
                    delivered,
                    self.redelivery.poison_after,
                )
                await msg.nak(delay=self.redelivery.retry_s)
        except Exception as again:  # the bus itself is away: the message comes back after ack_wait
            log.warning("%s: could not settle a failed message: %s", self.durable, again)
        else:
            if not is_outage(err):
                self._outage_logged = False

    async def _dead_letter(self, msg: Msg, err: Exception, delivered: int) -> None:
        seq = msg.metadata.sequence.stream
        why = storable_text(f"{type(err).__name__}: {err}", 500)
        await self.bus.js.publish(
            self.bus.subjects.dead_letters(self.durable),
            msg.data,
            headers={
                "Nats-Msg-Id": f"{self.durable}:{seq}",
                "Adc-Subject": msg.subject,
                "Adc-Error": " ".join(why.splitlines()),
            },
        )
        await self.bus.audit(
            AuditEvent(
                event_id=f"dead:{self.durable}:{seq}",
                ts=time.time(),
                source=self.bus.nc.options.get("name") or "bus",
                kind="message.dead_lettered",
                reason=f"{msg.subject} failed {delivered} times; kept in the dead-letter stream: {why}",
                data={"subject": msg.subject, "consumer": self.durable, "stream_seq": seq, "deliveries": delivered},
            )
        )
        log.error(
            "%s: message %d on %s dead-lettered after %d deliveries: %s", self.durable, seq, msg.subject, delivered, why
        )
        if self.on_dead_letter is not None:
            await self.on_dead_letter(msg, err)
        await msg.term()
