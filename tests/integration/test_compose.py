"""docker-compose.yml wires the same topology as `adc up`."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_compose_has_every_process_and_a_gpu_worker():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert {"nats", "postgres", "migrate", "api", "audit-sink", "decider", "executor", "collector", "worker"} <= set(
        services
    )
    assert "-js" in services["nats"]["command"]
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]
    assert services["migrate"]["command"] == ["adc", "db", "migrate"]
    for name in ("api", "api-2", "decider", "executor", "worker", "audit-sink"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["depends_on"]["bus-init"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["ADC_BUS_CREDENTIALS_DIR"] == "/secrets/nats"
    # The replicated topology: two of each controller (one decider and one executor lead), two apis.
    for name in ("decider", "executor", "audit-sink"):
        assert services[name]["deploy"]["replicas"] == 2
    assert services["api-2"]["ports"] != services["api"]["ports"]


def test_compose_runs_nats_with_the_generated_authorization():
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    secrets = services["secrets"]["command"]
    assert secrets[:3] == ["adc", "secrets", "init"]
    auth = secrets[secrets.index("--nats-config") + 1]
    nats = services["nats"]["command"]
    assert nats[nats.index("-c") + 1] == auth
    assert services["nats"]["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
    assert services["bus-init"]["command"] == ["adc", "bus", "init"]
    assert "postgresql://adc:" not in str(services["api"]["environment"])  # services never log in as the admin
    # TLS on: the server's certificate names the host the services dial (shared/infra/bus_tls.py)
    assert "--no-tls" not in secrets and secrets[secrets.index("--tls-host") + 1] == "nats"
    assert services["api"]["environment"]["NATS_URL"].startswith("nats://nats:")


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose is not installed")
def test_compose_file_is_valid():
    run = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
