"""The worker's relay of chat completion requests to its serving jobs.

The api sends one request per chat completion on the node's chat subject (`<prefix>.nodes.<node>.chat`,
request/reply; only the api may send there and only this node's worker receives it, shared/infra/bus_auth.py):

    {"job_id": "j…", "attempt": 2, "body": {OpenAI chat completion request}}

The worker posts `body` (non-streaming) to LLaMA-Factory's `/v1/chat/completions` on the socket of the
job's current attempt here (worker/serving/socket_file.py) and answers

    {"status": <HTTP status of the server>, "body": "<its response, text>"}   or
    {"status": 404|409|413|502|504, "error": "why"}

Everything is bounded: the request (MAX_REQUEST_BYTES), the answer read back from the trainer
(MAX_RESPONSE_BYTES: what a trainer writes is untrusted; a longer one is 502), and the time
(REQUEST_TIMEOUT_S, under the api's own wait).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
from nats.aio.msg import Msg

from shared.specs.tenant_paths import safe_component
from worker import job_files
from worker.serving import socket_file

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 256 << 10
MAX_RESPONSE_BYTES = 512 << 10  # well under NATS's default max_payload (1 MiB), with the envelope
REQUEST_TIMEOUT_S = 110.0  # the api waits RELAY_TIMEOUT_S (120 s) for the answer
CHAT_PATH = "/v1/chat/completions"


def _error(status: int, why: str) -> dict[str, Any]:
    return {"status": status, "error": why[:1000]}


class ChatRelay:
    """Answers the node's chat subject from the agent's live trainers (`trainers`: job id -> TrainerProcess)."""

    def __init__(self, trainers: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.trainers = trainers
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task] = set()

    async def on_message(self, msg: Msg) -> None:
        """The subscription's callback: each request answered in a task of its own, so one long generation
        holds no other request (the server itself takes them one at a time)."""
        task = asyncio.ensure_future(self.on_request(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def on_request(self, msg: Msg) -> None:
        try:
            answer = await self.answer(msg.data)
        except Exception as err:  # noqa: BLE001 - the api must get an answer, not wait out its timeout
            log.exception("chat request failed")
            answer = _error(502, f"the worker could not relay the request: {type(err).__name__}")
        try:
            await msg.respond(json.dumps(answer).encode())
        except Exception as err:  # noqa: BLE001 - the requester gave up, or the bus is away
            log.warning("chat answer not sent: %s", err)

    async def answer(self, data: bytes) -> dict[str, Any]:
        if len(data) > MAX_REQUEST_BYTES:
            return _error(413, f"the request is over {MAX_REQUEST_BYTES} bytes")
        try:
            request = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return _error(400, "the request is not JSON")
        if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
            return _error(400, "the request names no body")
        job_id, attempt = request.get("job_id"), request.get("attempt")
        if not isinstance(job_id, str) or not safe_component(job_id):
            return _error(400, "the request names no valid job")
        trainer = self.trainers.get(job_id)
        if trainer is None or trainer.done.is_set() or trainer.warm:
            return _error(404, f"job {job_id} is not serving on this node")
        if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt != trainer.attempt:
            return _error(409, f"job {job_id} runs attempt {trainer.attempt} here, not {attempt}")
        body = {**request["body"], "stream": False}  # one answer, read whole and bounded
        attempt_dir = trainer.folder.config(trainer.attempt).parent
        try:
            with socket_file.address(attempt_dir) as address:
                return await self._post(address, body)
        except (FileNotFoundError, job_files.UnsafeJobFile):
            return _error(404, f"job {job_id} attempt {trainer.attempt} is not a serving job")

    async def _post(self, address: str, body: dict) -> dict[str, Any]:
        transport = httpx.AsyncHTTPTransport(uds=address)
        try:
            async with (
                httpx.AsyncClient(transport=transport, base_url="http://serving", timeout=self.timeout_s) as client,
                client.stream("POST", CHAT_PATH, json=body) as response,
            ):
                chunks, size = [], 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        return _error(502, f"the server's answer is over {MAX_RESPONSE_BYTES} bytes")
                    chunks.append(chunk)
        except httpx.TimeoutException:
            return _error(504, f"no answer from the serving job within {self.timeout_s:.0f} s")
        except httpx.TransportError as err:  # not listening yet, or ended
            return _error(502, f"the serving job did not answer: {type(err).__name__}")
        return {"status": response.status_code, "body": b"".join(chunks).decode("utf-8", errors="replace")}
