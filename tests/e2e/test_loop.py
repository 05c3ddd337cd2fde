"""The whole loop on real NATS, Postgres and trainer subprocesses:
submit -> decide -> execute -> train -> audit."""

from __future__ import annotations

from pathlib import Path

import pytest


def lora_job(tiny_model: Path, data_dir: Path, name: str = "e2e-lora", steps: int = 12) -> dict:
    return {
        "name": name,
        "gpus": 1,
        "train": {
            "model_name_or_path": str(tiny_model),
            "stage": "sft",
            "finetuning_type": "lora",
            "lora_rank": 4,
            "lora_target": "all",
            "dataset": "alpaca_en_demo",
            "dataset_dir": str(data_dir),
            "cutoff_len": 64,
            "max_samples": 32,
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1e-3,
            "max_steps": steps,
            "logging_steps": 2,
            "save_steps": 6,
            "seed": 7,
        },
    }


def test_submitted_job_trains_to_success_with_its_audit_trail(live, tiny_model, data_dir):
    job = live.submit(lora_job(tiny_model, data_dir))
    assert job["status"] == "pending"
    done = live.wait_for(job["id"], {"succeeded", "failed", "cancelled"})
    assert done["status"] == "succeeded", done
    assert done["progress"]["step"] == 12 and isinstance(done["progress"]["loss"], float)
    assert done["placement"][0]["node"] in {"node-1", "node-2"}

    output = Path(done["output_dir"])
    assert (output / "adapter_model.safetensors").exists(), sorted(p.name for p in output.iterdir())
    assert (output / "adapter_config.json").exists()

    # The sink writes the last events after the status changed: wait for them, not for the status.
    trail = live.wait_audit(lambda t: "job.succeeded" in [e["kind"] for e in t], job_id=job["id"])
    kinds = [e["kind"] for e in trail]
    for kind in ("job.submitted", "decision", "command.start", "job.succeeded"):
        assert kind in kinds, kinds
    order = [
        kinds.index(k)
        for k in (
            "job.submitted",
            "decision",
            "job.scheduled",
            "command.start",
            "job.starting",
            "job.running",
            "job.succeeded",
        )
    ]
    assert order == sorted(order), kinds
    decision = trail[kinds.index("decision")]
    assert decision["rule"] == "priority_fifo" and decision["action"] == "start"
    assert "queue position 1" in decision["reason"] and decision["evidence"]["gpus_needed"] == 1
    start = trail[kinds.index("command.start")]
    assert start["data"]["ok"] is True and start["decision_id"] == decision["decision_id"]

    history = live.sql("SELECT new_status FROM job_status_history WHERE job_id = $1 ORDER BY id", job["id"])
    assert [r["new_status"] for r in history] == ["pending", "scheduled", "starting", "running", "succeeded"]
    assert live.chain_breaks() is None


@pytest.mark.parametrize(
    "mutate,field,message",
    [
        (lambda s: s["train"].update(lora_rnk=8), "lora_rnk", "not permitted|unknown|not supported"),
        (lambda s: s["train"].update(learning_rate="fast"), "learning_rate", "number|float"),
        (
            lambda s: s["train"].update(model_name_or_path="/nonexistent/model"),
            "model_name_or_path",
            "exist|not found|no such",
        ),
        (lambda s: s.update(gpus="two"), "gpus", "integer"),
        (lambda s: s.update(colour="blue"), "colour", "not permitted|unknown"),
        (lambda s: s.update(priority="urgent"), "priority", "unknown priority level"),
    ],
)
def test_bad_specs_are_refused_naming_the_field_and_nothing_is_queued(
    live, tiny_model, data_dir, mutate, field, message
):
    import re

    before = live.sql("SELECT count(*) AS n FROM jobs")[0]["n"]
    spec = lora_job(tiny_model, data_dir)
    mutate(spec)
    r = live.http.post("/v1/jobs", json=spec)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    hits = [d for d in detail if field in [str(x) for x in d["loc"]]]
    assert hits, detail
    assert re.search(message, " ".join(d["msg"] for d in hits), re.IGNORECASE), hits
    assert live.sql("SELECT count(*) AS n FROM jobs")[0]["n"] == before


def test_yaml_and_bare_llamafactory_configs_are_accepted(live, tiny_model, data_dir):
    import yaml

    train = lora_job(tiny_model, data_dir)["train"]
    r = live.http.post(
        "/v1/jobs",
        content=yaml.safe_dump(train | {"output_dir": "saves/bare-yaml"}),
        headers={"Content-Type": "application/yaml"},
    )
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["name"] == "bare-yaml" and job["spec"]["train"]["lora_rank"] == 4
    assert live.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    # Cancelled right after submission: it never gets to train its 12 steps.
    done = live.wait_for(job["id"], {"cancelled", "succeeded", "failed"})
    assert done["status"] == "cancelled" and done["cancel_requested"], done
    cancelled = live.wait_audit(lambda t: t, job_id=job["id"], kind="job.cancelled")
    assert [e["kind"] for e in cancelled] == ["job.cancelled"]
    bad = live.http.post("/v1/jobs", content=b"name: [unclosed", headers={"Content-Type": "application/yaml"})
    assert bad.status_code == 422 and "YAML" in bad.text


def test_every_call_needs_a_valid_token(live):
    import httpx

    anon = httpx.Client(base_url=live.stack.api_url)
    for method, path in [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/nodes"),
        ("GET", "/v1/audit"),
        ("GET", "/v1/jobs/x"),
        ("POST", "/v1/jobs/x/cancel"),
    ]:
        assert anon.request(method, path).status_code == 401
        assert anon.request(method, path, headers={"Authorization": "Bearer adc_wrong"}).status_code == 401
    assert anon.get("/healthz").status_code == 200


def test_cli_submit_wait_for_ci_pipelines(live, tiny_model, data_dir, tmp_path):
    """`adc submit FILE --wait` on a bare LLaMA-Factory YAML: follows progress, exit 0 on success."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    config = tmp_path / "my_lora_sft.yaml"
    config.write_text(yaml.safe_dump(lora_job(tiny_model, data_dir, steps=6)["train"]))
    env = os.environ | {"ADC_API_URL": live.stack.api_url, "ADC_TOKEN": live.stack.token}
    run = subprocess.run(
        [sys.executable, "-m", "cli", "submit", str(config), "--wait", "-o", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.strip()
    assert "succeeded" in run.stderr and "step 6/6" in run.stderr
    job = live.job(job_id)
    assert job["name"] == "my_lora_sft" and job["status"] == "succeeded"

    listed = subprocess.run(
        [sys.executable, "-m", "cli", "jobs", "-o", "json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert job_id in [j["id"] for j in json.loads(listed.stdout)["items"]]
    nodes = subprocess.run([sys.executable, "-m", "cli", "nodes"], env=env, capture_output=True, text=True, timeout=60)
    assert "node-1" in nodes.stdout and "node-2" in nodes.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(lora_job(tiny_model, data_dir)["train"] | {"lora_rnk": 8}))
    refused = subprocess.run(
        [sys.executable, "-m", "cli", "submit", str(bad)], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1 and "422" in refused.stderr and "lora_rnk" in refused.stderr


def test_a_trainer_error_with_nul_in_it_fails_the_job_and_is_audited(live, tiny_model, data_dir):
    """A hostile model folder whose config names a model type with NUL in it: the real trainer's error
    quotes it, Postgres refuses NUL in text, and yet the job ends `failed` with its reason audited."""
    import json
    import shutil

    bad = tiny_model.parent / "nul-model-type"
    if not bad.exists():
        shutil.copytree(tiny_model, bad)
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps(config | {"model_type": "llama\u0000evil"}))
    job = live.submit(lora_job(bad, data_dir, name="nul-error", steps=4))
    done = live.wait_for(job["id"], {"succeeded", "failed", "cancelled"}, timeout=240)
    assert done["status"] == "failed", done
    assert "llama" in done["status_reason"] and "evil" in done["status_reason"], done["status_reason"]
    assert "\x00" not in done["status_reason"]
    trail = live.wait_audit(lambda t: "job.failed" in [e["kind"] for e in t], job_id=job["id"])
    [failed] = [e for e in trail if e["kind"] == "job.failed"]
    assert "evil" in failed["reason"], failed
    assert live.chain_breaks() is None
