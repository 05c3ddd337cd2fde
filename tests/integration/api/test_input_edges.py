"""Bad input is refused at the edge, naming the field: malformed YAML and JSON, unknown fields
(body and query), values Postgres could not store, oversized bodies; and a stranger's body is
not even parsed."""

from __future__ import annotations

import json

import pytest


def _fields(response) -> list[str]:
    return [".".join(str(x) for x in d["loc"]) for d in response.json()["detail"]]


@pytest.mark.parametrize(
    "body,content_type,where,says",
    [
        (b"name: [unclosed", "application/yaml", "body", "YAML"),
        (b'{"name": ', "application/json", "body", "JSON"),
        (b"\xff\xfe not text", "application/yaml", "body", "UTF-8"),
        (b"- just\n- a list", "application/yaml", "body", "mapping"),
        (b"name: x\nrun_date: 2024-01-01\ntrain: {}", "application/yaml", "run_date", "JSON value"),
        (b'{"name": "x", "gpus": NaN, "train": {}}', "application/json", "gpus", "finite"),
        (b'{"name": "x\\u0000", "train": {}}', "application/json", "name", "NUL"),
    ],
)
def test_undecodable_or_unstorable_specs_are_refused_naming_where(api, body, content_type, where, says):
    with api.client("user") as http:
        r = http.post("/v1/jobs", content=body, headers={"Content-Type": content_type})
    assert r.status_code == 422, r.text
    assert any(f == where or f.endswith(where) for f in _fields(r)), r.text
    assert says in r.text


def test_unknown_fields_are_refused_by_name_everywhere(api):
    with api.client("admin") as http:
        cases = [
            http.post("/v1/jobs", json=api.job_spec(colour="blue")),
            http.post("/v1/jobs", json=api.job_spec() | {"train": api.job_spec()["train"] | {"lora_rnk": 8}}),
            http.put("/v1/quotas/alpha", json={"max_gpu": 3}),
            http.post("/v1/tokens", json={"name": "x", "rol": "user"}),
            http.post("/v1/controller/pause", json={"because": "x"}),
            http.get("/v1/jobs", params={"stauts": "running"}),
            http.get("/v1/audit", params={"job": "j1"}),
            http.get("/v1/audit", params=[("node", "a"), ("node", "b")]),
        ]
    expected = ["colour", "lora_rnk", "max_gpu", "rol", "because", "stauts", "job", "node"]
    for r, field in zip(cases, expected):
        assert r.status_code == 422, (field, r.text)
        assert any(f.endswith(field) for f in _fields(r)), (field, r.text)


def test_types_are_not_coerced(api):
    with api.client("admin") as http:
        r = http.put("/v1/quotas/alpha", json={"max_gpus": "3"})
        assert r.status_code == 422 and _fields(r) == ["body.max_gpus"]
        r = http.put("/v1/quotas/alpha", json={"max_gpus": True})
        assert r.status_code == 422 and _fields(r) == ["body.max_gpus"]


def test_nul_characters_in_the_url_are_refused(api):
    with api.client("admin") as http:
        r = http.get("/v1/audit", params={"kind": "decision\x00"})
        assert r.status_code == 422 and _fields(r) == ["query.kind"]
        assert http.get("/v1/jobs/j%00x").status_code == 422


def test_oversized_bodies_get_413_declared_or_streamed(api):
    limit = api.server.config.api.max_body_bytes
    big = json.dumps(api.job_spec(name="big") | {"train": api.job_spec()["train"] | {"pad": "x" * limit}})
    with api.client("user") as http:
        declared = http.post("/v1/jobs", content=big, headers={"Content-Type": "application/json"})
        assert declared.status_code == 413 and "larger than" in declared.text
        streamed = http.post(
            "/v1/jobs",
            content=(big[i : i + 65536].encode() for i in range(0, len(big), 65536)),
            headers={"Content-Type": "application/json"},
        )
        assert streamed.status_code == 413
        assert http.put("/v1/quotas/alpha", content=b" " * (limit + 1)).status_code in (403, 413)
    with api.client("admin") as http:
        assert http.put("/v1/quotas/alpha", content=b" " * (limit + 1)).status_code == 413


def test_deeply_nested_bodies_are_refused_not_crashed_on(api):
    deep = "[" * 100_000 + "]" * 100_000
    with api.client("admin") as http:
        assert http.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"}).status_code == 422
        r = http.put("/v1/policies", content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and _fields(r) == ["body"]


def test_a_body_that_is_not_json_at_all_gets_422_naming_the_body(api):
    with api.client("admin") as http:
        r = http.put("/v1/policies", content=b"\x80{", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and _fields(r) == ["body"] and "not valid JSON" in r.text


def test_a_stranger_gets_401_before_the_body_is_read(api):
    with api.client(None) as anon:
        r = anon.post("/v1/jobs", content=b"name: [unclosed", headers={"Content-Type": "application/yaml"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = anon.put("/v1/policies", content=b"{", headers={"Authorization": "Bearer adc_nope"})
        assert r.status_code == 401


# A 455-byte body of nested aliases that safe_load expands into ~10^9 nodes (found by a hostile-tenant review).
_ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)},"
    f" *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8)
)


def test_a_yaml_alias_bomb_is_refused_at_the_first_alias_while_the_api_keeps_answering(api):
    import threading

    health: list[int] = []
    with api.client("user") as http, api.client(None) as probe:
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                health.append(probe.get("/healthz").status_code)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            r = http.post("/v1/jobs", content=_ALIAS_BOMB.encode(), headers={"Content-Type": "application/yaml"})
        finally:
            done.set()
            poller.join()
    assert r.status_code == 422, r.text
    assert "aliases (*a) are not accepted" in r.text and _fields(r) == ["body"]
    assert health and set(health) == {200}
    # An alias inside a list (which once stored a 40 MB row from a 62 KB body) is refused the same way.
    with api.client("user") as http:
        r = http.post(
            "/v1/jobs",
            content=b"name: x\ntags: &t [a]\nmore: [*t, *t]\ntrain: {}",
            headers={"Content-Type": "application/yaml"},
        )
    assert r.status_code == 422 and "aliases" in r.text
