"""ADC's Prometheus series, computed from Postgres at scrape time, the GPU series the api
aggregates from every collector's samples, and the shipped Grafana dashboard, each of whose
queries names only metrics ADC exports."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from shared.messages import GpuSample, NodeMetrics
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "adc-dashboard.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def exported(*texts: str) -> set[str]:
    """Every family and sample name the scrapes hold (a family without samples still names itself)."""
    names = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            names.update(s.name for s in family.samples)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not functions, keywords, labels or ranges)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    found = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group() in PROMQL_WORDS:
            continue  # a function call
        found.add(m.group())
    return found


def test_metric_names_parses_promql():
    assert metric_names('sum by (le, route) (rate(adc_api_request_seconds_bucket{route=~"$r"}[5m]))') == \
        {"adc_api_request_seconds_bucket"}
    assert metric_names("time() - adc_job_checkpoint_timestamp_seconds{job=~\"$job\"}") == \
        {"adc_job_checkpoint_timestamp_seconds"}
    assert metric_names("a / (b + c)") == {"a", "b", "c"}


def scrape(api, token: str | None, path: str) -> str:
    with api.client(token) as http:
        r = http.get(path)
    assert r.status_code == 200, r.text
    return r.text


def test_adc_series_and_gpu_series_with_job_and_team(api):
    job = api.submit("user", name="metered")
    checkpoint = Path(api.server.config.storage.root) / "jobs" / job["id"] / "output" / "checkpoint-6"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    api.server.sql("UPDATE jobs SET status = 'running', placement = $2, progress = $3, last_checkpoint = $4"
                   " WHERE id = $1", job["id"], [{"node": "gpu-node", "gpus": [1]}],
                   {"step": 7, "max_steps": 10, "loss": 1.5, "step_time_s": 0.25}, str(checkpoint))
    outside = api.submit("user", name="claims-a-path-outside-storage")
    api.server.sql("UPDATE jobs SET status = 'running', placement = $2, last_checkpoint = '/etc' WHERE id = $1",
                   outside["id"], [{"node": "another-node", "gpus": [0]}])
    sample = NodeMetrics(node="gpu-node", ts=time.time(), gpus=[
        GpuSample(index=i, memory_used_bytes=(i + 1) * 2**30, memory_total_bytes=8 * 2**30, util_pct=10.0 * i,
                  uuid=f"GPU-{i}", name="Test GPU", temperature_c=40.0) for i in range(2)])
    collector = api.server.as_role("collector-gpu-node")
    api.server.run(collector.nc.publish(collector.subjects.metrics("gpu-node"), sample.encode()))

    public = families(scrape(api, None, "/metrics"))
    running = {tuple(sorted(s.labels.items())): s.value for s in public["adc_jobs"].samples}
    assert running[(("priority", "low"), ("status", "running"))] >= 1
    assert "DCGM_FI_DEV_FB_USED" not in public and "adc_job_loss" not in public  # no job, team or GPU publicly
    assert all("job" not in s.labels for f in public.values() for s in f.samples)

    with api.client("user") as http:
        assert http.get("/v1/metrics").status_code == 403
    deadline = time.monotonic() + 10
    while True:
        detailed = families(scrape(api, "operator", "/v1/metrics"))
        used = {s.labels["gpu"]: s for s in detailed["DCGM_FI_DEV_FB_USED"].samples if s.labels["Hostname"] == "gpu-node"}
        if used or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert used["0"].value == 1024 and used["1"].value == 2048
    assert used["1"].labels | {} == {"gpu": "1", "UUID": "GPU-1", "pci_bus_id": "", "device": "nvidia1",
                                     "modelName": "Test GPU", "Hostname": "gpu-node", "job": job["id"], "team": "alpha"}
    assert used["0"].labels["job"] == "" and used["0"].labels["team"] == ""
    loss = {s.labels["job"]: s.value for s in detailed["adc_job_loss"].samples}
    steps = {s.labels["job"]: s.value for s in detailed["adc_job_steps_per_second"].samples}
    assert loss[job["id"]] == 1.5 and steps[job["id"]] == 4.0
    sizes = {s.labels["job"]: s.value for s in detailed["adc_job_checkpoint_bytes"].samples}
    assert sizes == {job["id"]: 1000}  # a path outside the storage root is not read
    saved = {s.labels["job"]: s.value for s in detailed["adc_job_checkpoint_timestamp_seconds"].samples}
    assert abs(saved[job["id"]] - checkpoint.stat().st_mtime) < 1e-3
    api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = ANY($1)", [job["id"], outside["id"]])


def test_every_grafana_query_names_a_metric_adc_exports(api):
    api.submit("user", name="for-the-names")
    names = exported(scrape(api, None, "/metrics"), scrape(api, "admin", "/v1/metrics"))
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) > 20
    for expr in queries:
        if listed := re.fullmatch(r"label_values\((\w+), *\w+\)", expr):  # a variable's values
            read = {listed.group(1)}
        else:
            read = metric_names(expr)
        assert read, f"{expr!r} reads no metric"
        unknown = {n for n in read if n not in names and re.sub(r"_(sum|count|bucket|total)$", "", n) not in names}
        assert not unknown, f"{expr!r} reads {unknown}, which ADC does not export"
