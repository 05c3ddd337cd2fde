"""The `adc` CLI against the running api: human tables by default, `-o json` for scripts, the
exit codes CI pipelines rely on, and the verbs that are thin wrappers over the REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from cli.main import main
from tests.conftest import REPO_ROOT
from tests.waits import until


@pytest.fixture
def adc(api, monkeypatch, capsys):
    """Run `adc ARGV...` in this process as the given role; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("ADC_API_URL", api.url)
    monkeypatch.setenv("ADC_HOME", "/nonexistent")

    def run(*argv: str, token: str = "admin") -> tuple[int, str, str]:
        monkeypatch.setenv("ADC_TOKEN", api.tokens.for_role(token) if hasattr(api.tokens, token) else token)
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_jobs_job_cancel_as_tables_and_json(api, adc, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(api.job_spec(name="cli-job")))
    code, out, _ = adc("submit", str(spec), "--priority", "high", "--gpus", "2", token="user")
    assert code == 0 and out.startswith("submitted j") and "pending" in out
    job_id = out.split()[1]
    code, out, _ = adc("jobs", token="user")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "TEAM"] and job_id in out
    code, out, _ = adc("jobs", "-o", "json", "--priority", "high", token="user")
    listed = json.loads(out)["items"]
    assert [j["id"] for j in listed] == [job_id] and listed[0]["gpus"] == 2
    code, out, _ = adc("job", job_id, token="user")
    assert code == 0 and "status" in out and "pending" in out and "spec" not in out.split()
    code, out, _ = adc("job", job_id, "-o", "json", token="other_user")
    assert code == 1
    code, out, _ = adc("cancel", job_id, token="user")
    assert code == 0 and f"cancel requested for {job_id}" in out


def test_submit_refused_names_the_field_and_exits_1(api, adc, tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps(api.job_spec(name="bad") | {"gpus": "two"}))
    code, out, err = adc("submit", str(spec), token="user")
    assert code == 1 and "422" in err and "gpus" in err and out == ""


def test_submit_wait_exits_non_zero_when_the_job_fails(api, tmp_path):
    """For CI: the id alone on stdout, progress on stderr, exit 1 unless the job succeeds."""
    spec = tmp_path / "ci.yaml"
    spec.write_text(yaml.safe_dump(api.job_spec(name="ci-run")["train"]))  # a bare LLaMA-Factory config
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "submit", str(spec), "--wait", "-o", "json"],
        cwd=str(REPO_ROOT),
        env={"ADC_API_URL": api.url, "ADC_TOKEN": api.tokens.user, "ADC_HOME": "/nonexistent", "PATH": "/usr/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line: list[str] = []
    progress: list[str] = []
    reader = threading.Thread(target=lambda: first_line.append(proc.stdout.readline()), daemon=True)
    reader.start()
    threading.Thread(target=lambda: progress.extend(iter(proc.stderr.readline, "")), daemon=True).start()
    reader.join(30)
    if not first_line:
        proc.kill()
        pytest.fail(f"no job id on stdout within 30s: {proc.communicate()[1]}")
    job_id = first_line[0].strip()
    assert job_id.startswith("j")
    until(lambda: any("pending" in line for line in progress), lambda: f"'pending' followed on stderr: {progress}")
    # What the executor writes when the trainer dies:
    api.server.sql(
        "UPDATE jobs SET status = 'failed', status_reason = 'trainer failed (exit code 1)' WHERE id = $1", job_id
    )
    assert proc.wait(timeout=30) == 1, progress
    until(lambda: any("failed" in line for line in progress), lambda: f"'failed' on stderr: {progress}", timeout=10)


def test_logs_metrics_events(api, adc):
    job = api.submit("user", name="cli-logs")
    job_dir = f"{api.server.config.storage.root}/jobs/{job['id']}"
    attempt = Path(job_dir) / "attempt-1"
    attempt.mkdir(parents=True)
    (attempt / "trainer.log").write_text("loading model\nstep 1 loss 2.0\nstep 2 loss 1.5\n")
    api.server.sql("UPDATE jobs SET job_dir = $2, attempt = 1, status = 'succeeded' WHERE id = $1", job["id"], job_dir)
    code, out, _ = adc("logs", job["id"], "--tail", "2", token="user")
    assert code == 0 and out == "step 1 loss 2.0\nstep 2 loss 1.5\n"
    code, out, _ = adc("logs", job["id"], "-f", token="user")  # the job has ended: prints all and returns
    assert code == 0 and out.startswith("loading model")
    code, out, _ = adc("metrics", job["id"], token="user")
    assert code == 0 and "no progress reported yet" in out
    code, out, _ = adc("events", job["id"], "-o", "json", token="user")
    assert [e["kind"] for e in json.loads(out)["items"]] == ["submitted"]


def test_audit_query_tail_and_the_default_verb(api, adc):
    job = api.submit("user", name="cli-audit")
    api.wait_audit(lambda e: e["job_id"] == job["id"])
    code, out, _ = adc("audit", "--job", job["id"], token="user")
    assert code == 0 and "job.submitted" in out and "user-token" in out
    code, out, _ = adc("audit", "query", "--job", job["id"], "-o", "json")
    assert [e["kind"] for e in json.loads(out)["items"]] == ["job.submitted"]
    code, out, _ = adc("audit", "tail", "-n", "1", "-o", "json", "--kind", "job.submitted")
    assert json.loads(out)["job_id"] == job["id"]
    code, _, err = adc("audit", "query", "--since", "yesterday")
    assert code == 1 and "since" in err


def test_controller_policies_quotas_tokens_whoami(api, adc, tmp_path):
    code, out, _ = adc("controller", "pause", "--reason", "upgrade", token="operator")
    assert code == 0 and "PAUSED" in out and "upgrade" in out
    code, out, _ = adc("controller", token="user")
    assert "PAUSED" in out
    assert adc("controller", "resume", token="operator")[0] == 0
    code, _, err = adc("controller", "pause", token="user")
    assert code == 1 and "403" in err

    code, out, _ = adc("policies", token="operator")
    assert code == 0 and out.startswith("# version") and "oom_protection" in out
    policy = yaml.safe_load(out)
    policy["strategies"]["comm_jitter"]["stddev_us"] = 80
    doc = tmp_path / "policy.yaml"
    doc.write_text(yaml.safe_dump(policy))
    code, out, _ = adc("policies", "set", str(doc), "--reason", "noisy fabric")
    assert code == 0 and "strategies.comm_jitter.stddev_us: 50.0 -> 80" in out
    code, out, _ = adc("policies", "history", "-o", "json")
    assert json.loads(out)["items"][0]["reason"] == "noisy fabric"
    assert adc("policies", "reload")[0] == 0
    with pytest.raises(SystemExit):
        adc("policies", "set", str(doc))  # --reason is required

    code, out, _ = adc(
        "quota", "set", "delta", "--max-gpus", "4", "--allowed-priorities", "low", "--over-quota", "refuse"
    )
    assert code == 0 and "delta" in out and "refuse" in out
    code, out, _ = adc("quotas", "-o", "json")
    assert any(q["team"] == "delta" and q["max_gpus"] == 4 for q in json.loads(out)["items"])
    assert adc("quota", "rm", "delta")[0] == 0

    code, out, _ = adc("token", "create", "--name", "ci-bot", "--role", "user", "--team", "delta", "-o", "json")
    made = json.loads(out)
    assert made["via"] == "api" and made["secret"].startswith("adc_")
    code, out, _ = adc("whoami", "-o", "json", token=made["secret"])
    assert json.loads(out)["team"] == "delta"
    code, out, _ = adc("token", "list")
    assert made["id"] in out and made["secret"] not in out
    assert adc("token", "revoke", made["id"])[0] == 0
    code, _, err = adc("whoami", token=made["secret"])
    assert code == 1 and "401" in err and "revoked" in err


def test_token_create_without_credentials_writes_the_database(api, monkeypatch, capsys):
    """How the first admin is made: no API credentials yet, DATABASE_URL set."""
    for var in ("ADC_API_URL", "ADC_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ADC_HOME", "/nonexistent")
    monkeypatch.setenv("DATABASE_URL", api.server.env.database_url)
    assert main(["token", "create", "--name", "first-admin", "--role", "admin", "--team", "platform"]) == 0
    out = capsys.readouterr().out
    assert "created through the database" in out
    secret = out.strip().splitlines()[-1]
    with api.client(secret) as http:
        assert http.get("/v1/me").json()["role"] == "admin"


def test_manual_action_verbs_reach_their_endpoints(api, adc):
    """pause/resume/migrate/cordon/uncordon/drain are thin wrappers; the executor does the work."""
    job = api.submit("user", name="cli-manual")
    api.server.sql("INSERT INTO nodes (id, devices) VALUES ('node-c', '[]'::jsonb) ON CONFLICT DO NOTHING")
    code, _, err = adc("pause", job["id"], token="user")
    assert code == 1 and "409" in err and "only a running job" in err  # it is pending: the api says so
    code, _, err = adc("migrate", job["id"], "--to", "node-c", token="user")
    assert code == 1 and "403" in err
    for verb in ("cordon", "uncordon", "drain"):
        code, out, err = adc(verb, "node-c", "-o", "json", token="operator")
        assert code == 0, err
        assert json.loads(out)["action"] == verb
    code, _, err = adc("drain", "node-c", token="user")
    assert code == 1 and "403" in err
