"""Serving jobs at the api: the spec (`serve: true`, LLaMA-Factory's inference keys) and the chat route,
which relays over the real bus to the worker of the job's node. Here a test plays that worker (its bus
role, its permissions) with the worker's own relay, which has no serving trainer; the whole path, with a
real trainer serving LLaMA-Factory's API, is tests/e2e/test_serving.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from worker.serving.relay import ChatRelay

NODE = "serve-node"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]}


def serving_spec(api, **train) -> dict:
    return {
        "name": "chat",
        "serve": True,
        "train": {"model_name_or_path": str(api.model_dir), "template": "qwen3_nothink", **train},
    }


def submit(api, spec: dict, token: str = "user"):
    with api.client(token) as http:
        return http.post("/v1/jobs", json=spec)


def chat(api, job_id: str, body: dict | None = None, token: str = "user"):
    with api.client(token) as http:
        return http.post(f"/v1/jobs/{job_id}/chat/completions", json=body or CHAT)


def running_on(api, job_id: str, node: str = NODE) -> None:
    """The job as the executor leaves a started one (only the executor writes job status)."""
    api.server.sql(
        "UPDATE jobs SET status = 'running', attempt = 1, placement = $2 WHERE id = $1",
        job_id,
        [{"node": node, "gpus": [0]}],
    )


@pytest.fixture(scope="module")
def served(api) -> dict:
    r = submit(api, serving_spec(api, do_sample=False, max_new_tokens=8))
    assert r.status_code == 201, r.text
    return r.json()


def test_a_serving_spec_needs_no_dataset_and_is_marked_for_the_trainer(api, served):
    assert served["spec"]["serve"] is True
    assert served["spec"]["train"]["adc_serve"] is True  # the trainer's switch (worker/trainer/serve.py)
    assert "dataset" not in served["spec"]["train"]


@pytest.mark.parametrize(
    ("train", "loc"),
    [
        ({"do_train": True, "dataset": "alpaca_en_demo"}, ["train", "do_train"]),
        ({"export_dir": "merged"}, ["train", "export_dir"]),
        ({"infer_backend": "vllm"}, ["train", "infer_backend"]),
    ],
)
def test_a_serving_job_trains_nothing_and_serves_with_what_is_installed(api, train, loc):
    r = submit(api, serving_spec(api, **train))
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]], r.text


def test_the_trainers_switch_is_adcs_to_set(api):
    spec = {"name": "sly", "train": {"model_name_or_path": str(api.model_dir), "adc_serve": True}}
    r = submit(api, spec)
    assert r.status_code == 422, r.text
    assert ["train", "adc_serve"] in [e["loc"] for e in r.json()["detail"]], r.text


def test_a_job_that_is_not_serving_or_not_running_does_not_chat(api, served):
    training = api.submit()
    r = chat(api, training["id"])
    assert r.status_code == 409 and "not a serving job" in r.json()["detail"], r.text
    r = chat(api, served["id"])
    assert r.status_code == 409 and "is pending" in r.json()["detail"], r.text


def test_only_the_jobs_team_may_chat_with_it(api, served):
    assert chat(api, served["id"], token="other_user").status_code == 404
    assert chat(api, served["id"], token="admin").status_code == 404  # the prompts are the team's, not the admin's
    assert chat(api, "j0000000000000000").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {**CHAT, "stream": True},
        {**CHAT, "messages": []},
        {**CHAT, "messages": [{"role": "user", "content": "x" * (64 * 1024 + 1)}]},
        {**CHAT, "tools": [{"type": "function"}]},
    ],
)
def test_a_request_outside_the_bounds_is_refused_before_any_relay(api, served, body):
    assert chat(api, served["id"], body).status_code == 422


def test_the_worker_relays_and_a_worker_without_the_job_says_so(api, served):
    """The worker's relay, on the bus as the node's worker, holding no trainer: the api says 409."""
    bus = api.server.as_role(f"worker-{NODE}")
    relay = ChatRelay({})
    sub = api.server.run(bus.nc.subscribe(bus.subjects.chat(NODE), cb=relay.on_message))
    try:
        running_on(api, served["id"])
        r = chat(api, served["id"])
        assert r.status_code == 409, r.text
        assert f"job {served['id']} is not serving on this node" in r.json()["detail"]
    finally:
        api.server.run(sub.unsubscribe())


def answering(api, reply: bytes):
    """The node's worker on the bus, answering every chat request with `reply` and noting what it got."""
    bus = api.server.as_role(f"worker-{NODE}")
    got: list[dict] = []

    async def answer(msg) -> None:
        got.append(json.loads(msg.data))
        await msg.respond(reply)

    return api.server.run(bus.nc.subscribe(bus.subjects.chat(NODE), cb=answer)), got


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


@pytest.mark.parametrize(
    ("reply", "status", "check"),
    [
        ({"status": 200, "body": json.dumps(COMPLETION)}, 200, lambda b: b["choices"][0]["message"]["content"] == "hi"),
        (
            {"status": 200, "body": json.dumps({"choices": "many"})},
            502,
            lambda b: "not a chat completion" in b["detail"],
        ),
        ({"status": 200, "body": "<html>"}, 502, lambda b: "not a chat completion" in b["detail"]),
        ({"status": 400, "body": json.dumps({"detail": "Invalid role"})}, 422, lambda b: "Invalid role" in str(b)),
        ({"status": 500, "body": ""}, 502, lambda b: "answered 500" in b["detail"]),
        ({"status": 504, "error": "slow"}, 504, lambda b: b["detail"] == "slow"),
        ("not json", 502, lambda b: "nonsense" in b["detail"]),
    ],
)
def test_what_the_worker_answers_is_checked_before_it_is_returned(api, served, reply, status, check):
    running_on(api, served["id"])
    sub, got = answering(api, json.dumps(reply).encode() if isinstance(reply, dict) else reply.encode())
    try:
        r = chat(api, served["id"])
    finally:
        api.server.run(sub.unsubscribe())
    assert r.status_code == status, r.text
    assert check(r.json()), r.text
    [request] = got
    assert request["job_id"] == served["id"] and request["attempt"] == 1
    assert request["body"]["messages"] == CHAT["messages"] and request["body"].get("stream") is False


def test_no_worker_on_the_bus_is_a_bad_gateway(api, served):
    running_on(api, served["id"], node="absent-node")
    r = chat(api, served["id"])
    assert r.status_code in (502, 504), r.text


def test_the_relay_bounds_what_it_takes(api):
    relay = ChatRelay({})
    assert asyncio.run(relay.answer(b"x" * (300 << 10)))["status"] == 413
    assert asyncio.run(relay.answer(b"[1]"))["status"] == 400
    assert asyncio.run(relay.answer(json.dumps({"job_id": "../x", "body": {}}).encode()))["status"] == 400
