"""ADC's Prometheus series, computed from Postgres at scrape time, the collectors' GPU series,
no series served twice, and the shipped Grafana dashboard, each of whose queries names only
metrics ADC exports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cli.local_services import free_port
from tests.conftest import REPO_ROOT

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "adc-dashboard.json"
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


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
        if expr[m.end() :].lstrip().startswith("(") or m.group() in PROMQL_WORDS:
            continue  # a function call
        found.add(m.group())
    return found


def test_metric_names_parses_promql():
    assert metric_names('sum by (le, route) (rate(adc_api_request_seconds_bucket{route=~"$r"}[5m]))') == {
        "adc_api_request_seconds_bucket"
    }
    assert metric_names('time() - adc_job_checkpoint_timestamp_seconds{job=~"$job"}') == {
        "adc_job_checkpoint_timestamp_seconds"
    }
    assert metric_names("a / (b + c)") == {"a", "b", "c"}


def scrape(api, token: str | None, path: str) -> str:
    with api.client(token) as http:
        r = http.get(path)
    assert r.status_code == 200, r.text
    return r.text


def test_public_aggregates_and_per_job_series_for_operators(api):
    job = api.submit("user", name="metered")
    checkpoint = Path(api.server.config.storage.root) / "jobs" / job["id"] / "output" / "checkpoint-6"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"x" * 1000)
    api.server.sql(
        "UPDATE jobs SET status = 'running', placement = $2, progress = $3, last_checkpoint = $4 WHERE id = $1",
        job["id"],
        [{"node": "gpu-node", "gpus": [1]}],
        {"step": 7, "max_steps": 10, "loss": 1.5, "step_time_s": 0.25},
        str(checkpoint),
    )
    outside = api.submit("user", name="claims-a-path-outside-storage")
    api.server.sql(
        "UPDATE jobs SET status = 'running', placement = $2, last_checkpoint = '/etc' WHERE id = $1",
        outside["id"],
        [{"node": "another-node", "gpus": [0]}],
    )

    migrate = {"action": "migrate", "job_id": job["id"], "reason": "memory above 92%", "reason_code": "oom.migrate"}
    api.server.sql(
        "INSERT INTO decisions (decision_id, job_id, rule, action, payload, state)"
        " VALUES ($1, $2, 'oom_protection', 'migrate', $3, 'done')",
        f"metered-{job['id']}",
        job["id"],
        {"decision_id": f"metered-{job['id']}", "rule": "oom_protection", "action": migrate},
    )

    public = families(scrape(api, None, "/metrics"))
    running = {tuple(sorted(s.labels.items())): s.value for s in public["adc_jobs"].samples}
    assert running[(("priority", "low"), ("status", "running"))] >= 1
    by_code = {
        (s.labels["rule"], s.labels["reason_code"], s.labels["state"]): s.value
        for s in public["adc_decisions"].samples
        if s.name == "adc_decisions_total"
    }
    assert by_code[("oom_protection", "oom.migrate", "done")] >= 1  # decisions counted by their reason code
    assert "DCGM_FI_DEV_FB_USED" not in public and "adc_job_loss" not in public  # no job, team or GPU publicly
    assert all("hpc_job" not in s.labels and "team" not in s.labels for f in public.values() for s in f.samples)

    with api.client("user") as http:
        assert http.get("/v1/metrics").status_code == 403
    detailed = families(scrape(api, "operator", "/v1/metrics"))
    assert not {"adc_jobs", "adc_api_requests", "DCGM_FI_DEV_FB_USED"} & set(detailed)  # /metrics' and the collectors'
    info = {s.labels["hpc_job"]: s.labels for s in detailed["adc_job_info"].samples}
    assert info[job["id"]] == {"hpc_job": job["id"], "team": "alpha", "name": "metered"}
    loss = {s.labels["hpc_job"]: s.value for s in detailed["adc_job_loss"].samples}
    steps = {s.labels["hpc_job"]: s.value for s in detailed["adc_job_steps_per_second"].samples}
    assert loss[job["id"]] == 1.5 and steps[job["id"]] == 4.0
    sizes = {s.labels["hpc_job"]: s.value for s in detailed["adc_job_checkpoint_bytes"].samples}
    assert sizes == {job["id"]: 1000}  # a path outside the storage root is not read
    saved = {s.labels["hpc_job"]: s.value for s in detailed["adc_job_checkpoint_timestamp_seconds"].samples}
    assert abs(saved[job["id"]] - checkpoint.stat().st_mtime) < 1e-3
    api.server.sql(
        "UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = ANY($1)", [job["id"], outside["id"]]
    )


@contextlib.contextmanager
def collectors(api, *nodes: str):
    """A collector per node on simulated GPUs, each serving /metrics; yields their URLs."""
    procs, urls = [], []
    try:
        for node in nodes:
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "services.collector",
                        "--node",
                        node,
                        "--metrics-port",
                        str(port),
                        "--simulate-gpus",
                        "2",
                        "--gpu-memory",
                        "8GiB",
                    ],
                    env=os.environ | api.server.env.service_env(f"collector-{node}"),
                    cwd=str(REPO_ROOT),
                )
            )
            urls.append(f"http://127.0.0.1:{port}/metrics")
        deadline = time.monotonic() + 30
        for url in urls:
            while True:
                try:
                    if "DCGM_FI_DEV_FB_USED{" in httpx.get(url, timeout=2).text:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"{url} never served GPU series"
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=15)


def series(text: str) -> list[tuple]:
    return [(s.name, tuple(sorted(s.labels.items()))) for f in text_string_to_metric_families(text) for s in f.samples]


def test_the_collectors_and_the_api_scraped_together_hold_no_series_twice(api):
    job = api.submit("user", name="scraped-once")
    api.server.sql(
        "UPDATE jobs SET status = 'running', placement = $2, progress = $3 WHERE id = $1",
        job["id"],
        [{"node": "n1", "gpus": [0]}],
        {"step": 1, "loss": 2.0},
    )
    try:
        with collectors(api, "n1", "n2") as urls:
            scrapes = [
                scrape(api, None, "/metrics"),
                scrape(api, "operator", "/v1/metrics"),
                *(httpx.get(url, timeout=5).text for url in urls),
            ]
        every = [one for text in scrapes for one in series(text)]
        twice = {one for one in every if every.count(one) > 1}
        assert not twice, sorted(twice)[:10]
        gpus = {
            (dict(labels)["Hostname"], dict(labels)["gpu"]) for name, labels in every if name == "DCGM_FI_DEV_FB_USED"
        }
        assert gpus == {("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1")}  # each GPU once, from its own collector
    finally:
        api.server.sql("UPDATE jobs SET status = 'cancelled', placement = NULL WHERE id = $1", job["id"])


# What NVIDIA's dcgm-exporter dashboard for Grafana (grafana.com dashboard 12239) reads: these
# metrics, by the labels gpu and Hostname. DCGM_FI_PROF_PIPE_TENSOR_ACTIVE comes from DCGM's
# profiling module, which NVML does not offer.
NVIDIA_DASHBOARD_METRICS = {
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
}
NOT_FROM_NVML = {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}


def test_nvidias_dashboard_finds_every_metric_nvml_can_provide_on_the_collectors():
    """On simulated GPUs a field a real GPU reports (temperature, power, clocks) is absent, so the
    names are checked against the collector's families (named even without samples) and the labels
    against the series it has."""
    from shared.contracts import dcgm

    assert NVIDIA_DASHBOARD_METRICS - NOT_FROM_NVML <= set(dcgm.NAMES)
    assert not NOT_FROM_NVML & set(dcgm.NAMES)
    assert {"gpu", "Hostname", "UUID", "modelName", "hpc_job"} <= set(dcgm.LABELS)


def test_every_grafana_query_names_a_metric_adc_exports(api):
    api.submit("user", name="for-the-names")
    with collectors(api, "n1") as (url,):
        names = exported(
            scrape(api, None, "/metrics"), scrape(api, "admin", "/v1/metrics"), httpx.get(url, timeout=5).text
        )
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(queries) > 20
    for expr in queries:
        if listed := re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?, *\w+\)", expr):  # a variable's values
            read = {listed.group(1)}
        else:
            read = metric_names(expr)
        assert read, f"{expr!r} reads no metric"
        unknown = {n for n in read if n not in names and re.sub(r"_(sum|count|bucket|total)$", "", n) not in names}
        assert not unknown, f"{expr!r} reads {unknown}, which ADC does not export"
