"""What a trainer can see and touch inside its sandbox: real bubblewrap and setpriv, a shell in place
of the trainer (light: no training). The trainer itself is checked in test_trainer_sandbox.py."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from shared.infra.config import SandboxConfig
from worker.sandbox import SandboxError, bubblewrap, bwrap_argv, trainer_identity

needs_root_and_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or bubblewrap() is None and not os.environ.get("CI"),
    reason="needs root and a working bwrap (scripts/install.sh installs it)",
)


@pytest.fixture
def layout(tmp_path):
    """A storage root with this job and another team's job, two teams' folders, a secret."""
    for folder in ("storage/jobs/mine/output", "storage/jobs/theirs/output", "alpha/data", "beta/data", "etc-adc"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "alpha" / "data" / "train.json").write_text("[]")
    (tmp_path / "beta" / "data" / "secret.json").write_text("beta's data")
    (tmp_path / "storage" / "jobs" / "theirs" / "output" / "weights").write_text("theirs")
    (tmp_path / "etc-adc" / "nats.creds").write_text("credential")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    os.chown(tmp_path / "storage" / "jobs" / "mine" / "output", 65534, 65534)
    return tmp_path


def _sandboxed(layout: Path, script: str) -> subprocess.CompletedProcess:
    identity = trainer_identity(SandboxConfig(), "alpha", "mine")
    argv = bwrap_argv(
        bubblewrap(),
        identity,
        ["sh", "-c", script],
        writable=layout / "storage" / "jobs" / "mine",
        readable=[layout / "alpha"],
        hidden=[layout / "storage", layout / "alpha", layout / "beta", layout / "etc-adc"],
    )
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "L": str(layout)}
    )


@needs_root_and_bwrap
def test_a_trainer_sees_its_job_folder_and_its_teams_data_only(layout):
    out = _sandboxed(
        layout,
        (
            "id -u; echo x > $L/storage/jobs/mine/output/ok && echo job-writable; "
            "cat $L/alpha/data/train.json && echo team-readable; "
            "echo x > $L/alpha/data/new 2>/dev/null || echo team-read-only; "
            "ls -A $L/beta; ls -A $L/etc-adc; ls -A $L/storage/jobs; "
            "echo x > /tmp/t && echo tmp-writable; echo x > /usr/evil 2>/dev/null || echo root-read-only"
        ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "65534", out.stdout
    for seen in ("job-writable", "team-readable", "team-read-only", "tmp-writable", "root-read-only"):
        assert seen in out.stdout, (seen, out.stdout)
    assert "secret.json" not in out.stdout and "nats.creds" not in out.stdout, out.stdout  # other team, secrets
    assert "theirs" not in out.stdout and "mine" in out.stdout, out.stdout  # only its own job folder
    assert (layout / "storage/jobs/mine/output/ok").read_text() == "x\n"  # written through to the real folder


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches uids")
def test_root_is_refused_unless_allowed_for_development():
    with pytest.raises(SandboxError, match="may not run as root"):
        trainer_identity(SandboxConfig(user=0), "alpha", "j1")
    assert trainer_identity(SandboxConfig(user=0, allow_root=True), "alpha", "j1").uid == 0
    assert trainer_identity(SandboxConfig(uid_mode="per_team", team_uids={"alpha": 20001}), "alpha", "j").uid == 20001
    per_job = trainer_identity(SandboxConfig(uid_mode="per_job", uid_range=(300000, 1000)), "alpha", "j1")
    assert 300000 <= per_job.uid < 301000
    with pytest.raises(SandboxError, match="no uid"):
        trainer_identity(SandboxConfig(uid_mode="per_team"), "alpha", "j1")


@needs_root_and_bwrap
def test_a_trainer_cannot_see_another_trainers_processes_or_files_through_proc(layout):
    """Trainers share the default uid: without a pid namespace of its own, one would read another team's
    files through that team's trainer's /proc/<pid>/root (and its environment in /proc/<pid>/environ)."""
    identity = trainer_identity(SandboxConfig(), "beta", "theirs")
    beta = subprocess.Popen(
        bwrap_argv(
            bubblewrap(),
            identity,
            ["sleep", "60"],
            writable=layout / "storage" / "jobs" / "theirs",
            readable=[layout / "beta"],
            hidden=[layout / "storage", layout / "alpha", layout / "beta"],
        )
    )
    try:
        deadline = time.monotonic() + 30
        while not [c for c in psutil.Process(beta.pid).children(recursive=True) if c.name() == "sleep"]:
            assert time.monotonic() < deadline and beta.poll() is None, "beta's sandbox did not start"
            time.sleep(0.05)
        out = _sandboxed(
            layout,
            "for p in /proc/[0-9]*; do cat $p/root$L/beta/data/secret.json 2>/dev/null; "
            'tr "\\0" " " < $p/cmdline 2>/dev/null; echo; done',
        )
    finally:
        beta.kill()
        beta.wait()
    assert out.returncode == 0, out.stderr
    assert "beta's data" not in out.stdout and "sleep 60" not in out.stdout, out.stdout
    assert "sh -c" in out.stdout, out.stdout  # it does see its own processes
