"""Commands to workers over NATS request/reply: start, checkpoint-stop and cancel of one attempt,
each signed with the executor's key (shared/infra/command_auth.py) and carrying the trace.

A multi-node job is started as one: every node of its placement gets its share, meeting at rank
0's node (its address from the node table, a port derived from the job and attempt); if one node
refuses, the others are stopped again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from services.executor.ledger import Fence
from services.executor.store import Job
from shared.contracts.actions import NodeGpus
from shared.contracts.messages import Command, CommandError, CommandResult
from shared.infra.bus import Bus
from shared.infra.clock import Clock
from shared.infra.retry import doubling, retrying

REQUEST_BACKSTOP_S = 600.0
# How long a target's trainer may take to get ready (imports, dataset, model) before the move is given up.
PREPARE_TIMEOUT_S = 300.0


class WorkerTransport:
    def __init__(
        self,
        bus: Bus,
        command_timeout: float,
        stop_timeout: float,
        address_of: Callable[[str], Awaitable[str | None]],
        clock: Clock,
        fence: Fence | None = None,
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.fence = fence or Fence()
        self.command_timeout = command_timeout
        self.stop_timeout = stop_timeout
        self.address_of = address_of

    async def send(self, node: str, command: Command, attempts: int = 3, timeout: float | None = None) -> CommandResult:
        """Request/reply with bounded retries; the command id makes a repeat harmless on the worker.
        Each carries this executor's fencing token, and none is sent once it no longer leads."""
        timeout = timeout or self.command_timeout

        async def once() -> CommandResult:
            self.fence.check()
            fenced = command.model_copy(update={"fence": self.fence.token})
            # The wait is the clock's (a test moves it); NATS' own bound is only a backstop.
            request = self.bus.request(
                self.bus.subjects.command(node), fenced, timeout + REQUEST_BACKSTOP_S, signed=True
            )
            reply = await self.clock.timeout(request, timeout)  # the request carries the trace
            return CommandResult.decode(reply.data)

        try:
            return await retrying(
                self.clock,
                wait=doubling(0.5, 5),
                attempts=attempts,
                retry_on=(NoRespondersError, TimeoutError, NatsTimeout),
            )(once)
        except NoRespondersError:
            error = f"no worker is listening on node {node}"
        except (TimeoutError, NatsTimeout):
            error = f"node {node} did not answer within {timeout:.0f}s"
        return CommandResult(command_id=command.command_id, ok=False, error=CommandError.UNREACHABLE, message=error)

    async def start(
        self,
        job: Job,
        placement: tuple[NodeGpus, ...],
        command_id: str,
        decision_id: str | None,
        *,
        prepare_attempt: int | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Start the job's current attempt; with `prepare_attempt`, prepare that attempt (a warm trainer
        that waits for its go) on `placement` instead, answered once it is ready."""
        attempt = job.attempt if prepare_attempt is None else prepare_attempt
        env = dict(job.env if env is None else env)  # what a tune gave the job stays with it
        if len(placement) > 1:
            address = await self.address_of(placement[0].node) or "127.0.0.1"
            digest = int(hashlib.sha1(f"{job.id}:{attempt}".encode()).hexdigest(), 16)
            env |= {"ADC_MASTER_ADDR": address, "ADC_MASTER_PORT": str(20000 + digest % 20000)}
        base = Command(
            command_id=command_id,
            decision_id=decision_id,
            kind="start" if prepare_attempt is None else "prepare",
            job_id=job.id,
            attempt=attempt,
            train=job.train,
            placement=list(placement),
            resume_from=job.resume_from if prepare_attempt is None else None,
            env=env,
            team=job.team,
        )
        timeout = None if prepare_attempt is None else max(self.stop_timeout, PREPARE_TIMEOUT_S)
        results = await asyncio.gather(
            *(
                self.send(p.node, base.model_copy(update={"command_id": f"{command_id}:{p.node}"}), timeout=timeout)
                for p in placement
            )
        )
        failed = [(p.node, r) for p, r in zip(placement, results) if not r.ok]
        if failed and len(placement) > 1:
            for p, r in zip(placement, results):
                if r.ok:
                    await self.send(
                        p.node,
                        Command(
                            command_id=f"{command_id}:{p.node}:undo", kind="cancel", job_id=job.id, attempt=attempt
                        ),
                        attempts=1,
                    )
        if failed:
            node, r = failed[0]
            return r.model_copy(update={"message": f"{node}: {r.message}"})
        return results[0]

    async def _on_every_node(
        self, job: Job, command_id: str, decision_id: str | None, kind: str, attempts: int = 3, timeout=None, **fields
    ) -> list[CommandResult]:
        """One command of `kind` to each node of the job's current attempt, answers in the job's node order."""
        return await asyncio.gather(
            *(
                self.send(
                    node,
                    Command(
                        command_id=f"{command_id}:{node}",
                        decision_id=decision_id,
                        kind=kind,
                        job_id=job.id,
                        attempt=job.attempt,
                        **fields,
                    ),
                    attempts=attempts,
                    timeout=timeout,
                )
                for node in job.nodes
            )
        )

    async def stop(self, job: Job, command_id: str, decision_id: str | None) -> CommandResult:
        """Checkpoint-stop on every node of the job; rank 0's node reports the checkpoint."""
        results = await self._on_every_node(job, command_id, decision_id, "stop", attempts=2, timeout=self.stop_timeout)
        first = results[0]
        if bad := next((r for r in results if not r.ok), None):
            return first.model_copy(update={"ok": False, "error": bad.error, "message": bad.message})
        return first

    async def go(self, job: Job, command_id: str, decision_id: str | None) -> CommandResult:
        """The prepared trainers of the job's current attempt resume from its `resume_from`, on every node."""
        results = await self._on_every_node(
            job, command_id, decision_id, "go", resume_from=job.resume_from, team=job.team
        )
        if bad := next(((node, r) for node, r in zip(job.nodes, results) if not r.ok), None):
            return bad[1].model_copy(update={"message": f"{bad[0]}: {bad[1].message}"})
        return results[0]

    async def cancel(
        self,
        job: Job,
        node: str,
        command_id: str,
        decision_id: str | None = None,
        attempts: int = 3,
        attempt: int | None = None,
    ) -> CommandResult:
        return await self.send(
            node,
            Command(
                command_id=command_id,
                decision_id=decision_id,
                kind="cancel",
                job_id=job.id,
                attempt=job.attempt if attempt is None else attempt,
            ),
            attempts=attempts,
        )
