"""`POST /v1/jobs/{id}/chat/completions`: an OpenAI-style chat completion from a running serving job.

A serving job (`serve: true`, shared/specs/job_spec.py) runs LLaMA-Factory's own API (`create_app` over its
`ChatModel`) in the trainer's sandbox, which has no network: it answers on a UNIX socket its worker
made (worker/trainer/serve.py). The api relays each request over the bus to the worker of the job's
node (a request on `<prefix>.nodes.<node>.chat`, which only the api may send and only that worker
receives), which posts it to the socket and sends the answer back (worker/serving/relay.py).

Only the job's own team may ask (another team's token, an admin's included, gets 404: the prompts and
answers are the team's). The request is bounded (the api's body limit, then these fields' own bounds)
and so is the wait (RELAY_TIMEOUT_S); answers are not streamed.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

import nats.errors
from fastapi import APIRouter, Body, Depends, HTTPException, Request, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.api.auth import Principal, authenticate
from services.api.errors import CONFLICT, NOT_FOUND, WITH_BODY, Problem, field_errors
from services.api.jobs import JOB_ID, visible_job
from shared.contracts.job_status import JobStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["serving"])
RELAY_TIMEOUT_S = 120.0  # the worker gives the server 110 s of it
MAX_MESSAGES = 256
MAX_CONTENT_CHARS = 64 << 10


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_CONTENT_CHARS)


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request, as LLaMA-Factory's API takes it (no streaming, no tools)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field("adc", max_length=200, description="any name: the job serves one model")
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    do_sample: bool | None = Field(None, description="LLaMA-Factory's: default, the job's generation settings")
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1, le=8)
    presence_penalty: float | None = Field(None, ge=-100, le=100)
    max_tokens: int | None = Field(None, ge=1, le=1 << 16)
    stop: str | list[str] | None = Field(None, max_length=16)
    stream: Literal[False] = Field(False, description="answers are not streamed")


class ChoiceMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | None = None


class Choice(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int
    message: ChoiceMessage
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    """LLaMA-Factory's answer (OpenAI's shape), as the serving job sent it."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: dict[str, int] | None = None


def _inlined(schema: dict) -> dict:
    """A model's JSON schema with its nested models written in place (the request body's documentation)."""
    defs = schema.pop("$defs", {})

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: walk(v) for k, v in node.items()}
        return [walk(v) for v in node] if isinstance(node, list) else node

    return walk(schema)


# The body is read as a mapping and checked after the job is: another team's job is 404 whatever the body.
_CHAT_BODY = {
    "requestBody": {"content": {"application/json": {"schema": _inlined(ChatCompletionRequest.model_json_schema())}}}
}
CHAT_BODY = Body(description="OpenAI's chat completion request (ChatCompletionRequest)")
BAD_GATEWAY = {502: {"model": Problem, "description": "the serving job did not answer, or not in OpenAI's shape"}}
TIMEOUT = {504: {"model": Problem, "description": f"no answer within {RELAY_TIMEOUT_S:.0f} s"}}


@router.post(
    "/{job_id}/chat/completions",
    response_model=ChatCompletion,
    responses=WITH_BODY | NOT_FOUND | CONFLICT | BAD_GATEWAY | TIMEOUT,
    summary="Ask a running serving job for a chat completion (OpenAI-style, not streamed)",
    openapi_extra=_CHAT_BODY,
)
async def chat_completion(
    request: Request,
    job_id: str = JOB_ID,
    who: Principal = Depends(authenticate),
    raw: dict[str, Any] = CHAT_BODY,
):
    app = request.app.state
    row = await visible_job(request, job_id, who)
    if row["team"] != who.team:  # a team's prompts and answers are its own, whoever else may see the job
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
    if not (row["spec"] or {}).get("serve"):
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is not a serving job (serve: true)")
    try:
        body = ChatCompletionRequest.model_validate(raw)
    except ValidationError as err:
        return field_errors([{"loc": ["body", *e["loc"]], "msg": e["msg"]} for e in err.errors()])
    placement = row["placement"] or []
    if row["status"] != JobStatus.RUNNING or not placement:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} is {row['status']}: a serving job answers while it is running"
        )
    relayed = {"job_id": job_id, "attempt": row["attempt"], "body": body.model_dump(exclude_none=True)}
    subject = app.bus.subjects.chat(placement[0]["node"])
    try:
        reply = await app.bus.nc.request(subject, json.dumps(relayed).encode(), timeout=RELAY_TIMEOUT_S)
    except nats.errors.TimeoutError:
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT, f"job {job_id} did not answer in time") from None
    except nats.errors.NoRespondersError:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"the worker of job {job_id} is not on the bus") from None
    return _answer(job_id, reply.data)


def _answer(job_id: str, data: bytes) -> Any:
    """The worker's reply as the api's answer: the server's completion checked against OpenAI's shape, its
    refusal of the request as 422, anything else as 502 (a serving job's answer is not trusted)."""
    try:
        reply = json.loads(data)
        code = int(reply["status"])
    except (ValueError, KeyError, TypeError):
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"job {job_id}'s worker answered nonsense") from None
    if "error" in reply:
        why = str(reply["error"])[:1000]
        if code in (404, 409):  # it no longer runs there (stopped, moved): the caller may ask again
            raise HTTPException(status.HTTP_409_CONFLICT, why)
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT if code == 504 else status.HTTP_502_BAD_GATEWAY, why)
    try:
        answer = json.loads(str(reply.get("body", "")))
    except ValueError:
        answer = None
    if code in (400, 422):  # LLaMA-Factory refused the messages (their order, say)
        detail = answer.get("detail") if isinstance(answer, dict) else None
        return field_errors([{"loc": ["body", "messages"], "msg": str(detail)[:1000] or "refused by the server"}])
    if code != 200:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"job {job_id}'s server answered {code}")
    try:
        return JSONResponse(ChatCompletion.model_validate(answer).model_dump(mode="json"))
    except ValidationError:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"job {job_id}'s answer is not a chat completion") from None
