"""The worker's door for commands: only what the executor signed gets in (shared/infra/command_auth.py).

Anything else is refused before it is even decoded for use: answered `unauthenticated`, logged,
counted on the worker's `/metrics` (`adc_rejected_messages_total{reason="unauthenticated"}`) and reported on the node's own refusal subject, which the audit sink turns into a
`command.refused` event (a worker may not publish audit events itself).
"""

from __future__ import annotations

import asyncio
import json
import logging

from nats.aio.msg import Msg

from shared.contracts.messages import CommandError, CommandRefusal, CommandResult
from shared.infra.bus import Bus
from shared.infra.clock import Clock, SystemClock
from shared.infra.command_auth import SignatureVerifier
from shared.infra.rejections import refused_unauthenticated
from shared.infra.retry import retrying, steps
from shared.infra.storable import storable_text

log = logging.getLogger(__name__)


class CommandGate:
    def __init__(self, bus: Bus, node: str, verifier: SignatureVerifier | None, clock: Clock | None = None) -> None:
        self.bus = bus
        self.clock = clock or SystemClock()
        self.node = node
        self.verifier = verifier  # None: no executor key was given, so no command can be trusted
        self._reports: set[asyncio.Task] = set()

    async def admit(self, msg: Msg) -> bool:
        """True if the executor signed this command; else it is refused, answered and reported."""
        why = (
            "no executor key configured"
            if self.verifier is None
            else self.verifier.refusal(msg.subject, msg.data, msg.headers)
        )
        if why is None:
            return True
        claimed = _claimed(msg.data)
        refused_unauthenticated("commands")
        log.warning("refused a command on %s: %s (it claimed %s)", msg.subject, why, claimed)
        if msg.reply:
            await msg.respond(
                CommandResult(
                    command_id=claimed.get("command_id", "?"),
                    ok=False,
                    error=CommandError.UNAUTHENTICATED,
                    message=f"refused: {why}",
                ).encode()
            )
        refusal = CommandRefusal(ts=self.clock.now(), reason=why, claimed=claimed)
        task = asyncio.ensure_future(self._report(refusal))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)
        return False

    async def _report(self, refusal: CommandRefusal) -> None:
        try:  # the bus is away for a moment: the msg id dedupes a retry
            await retrying(
                self.clock,
                wait=steps(0.2, 1),
                attempts=3,
                on_failure=lambda _, err: log.warning("refusal report not sent yet: %s", err),
            )(self.bus.publish_js, self.bus.subjects.command_refusals(self.node), refusal, refusal.refusal_id)
        except Exception:  # noqa: BLE001 - given up
            log.error("refusal report %s lost after retries", refusal.refusal_id)


def _claimed(payload: bytes) -> dict[str, str]:
    """What a refused command said it was, bounded: evidence, never acted on."""
    try:
        doc = json.loads(payload[:65536])
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: storable_text(str(doc[k]), 200) for k in ("kind", "job_id", "command_id") if doc.get(k) is not None}
