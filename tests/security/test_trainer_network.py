"""What a trainer's network namespace lets it reach: real namespaces, real bwrap, a small Python program in
place of the trainer run as the trainers' unprivileged uid without capabilities (light: no training).
A real trainer against its namespace is tests/security/test_trainer_confinement.py; a multi-node job
across two workers is tests/e2e/test_protocols.py::test_multi_node_job_runs_as_one_and_moves_as_one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from shared.infra.config import SandboxConfig
from worker.sandbox import bubblewrap, bwrap_argv, command_env_problems, trainer_identity
from worker.trainer_network import (
    BRIDGE_FILTER_KEYS,
    BRIDGE_FILTER_SYSCTLS,
    LINK_MTU,
    NETNS_DIR,
    TrainerNetwork,
    node_prefix,
    rank_address,
    sweep,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root makes network namespaces")
UNPRIVILEGED = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--no-new-privs",
    "--",
]

PROBE = r"""
import json, socket, sys
results = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, port))
        results["%s:%d" % (host, port)] = "open:" + s.recv(16).decode(errors="replace")
    except OSError as err:
        results["%s:%d" % (host, port)] = type(err).__name__
    finally:
        s.close()
print(json.dumps(results))
"""

SERVE = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(sys.argv[2].encode())
    c.close()
"""


class HostService:
    """A host service on every address (as the api and, in many installs, NATS listen), answering 'host'."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET6)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind(("::", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.sendall(b"host")
            conn.close()


def host_addresses() -> list[str]:
    found = {"127.0.0.1", "::1"}
    for entries in psutil.net_if_addrs().values():
        found |= {e.address for e in entries if e.family in (socket.AF_INET, socket.AF_INET6) and "%" not in e.address}
    return sorted(found)


def probe(prefix: list[str], targets: list[tuple[str, int]]) -> dict[str, str]:
    out = subprocess.run(
        [*prefix, *UNPRIVILEGED, sys.executable, "-c", PROBE, json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def service():
    s = HostService()
    yield s
    s.sock.close()


@pytest.mark.skipif(os.geteuid() != 0 or bubblewrap() is None, reason="needs root and a working bwrap")
def test_a_single_node_trainer_reaches_no_host_address_only_its_own_loopback(tmp_path, service):
    targets = [(a, p) for a in host_addresses() for p in (5432, 4222, service.port)]
    tmp_path.chmod(0o755)
    argv = bwrap_argv(
        bubblewrap(),
        trainer_identity(SandboxConfig(), "alpha", "j"),
        ["true"],
        writable=tmp_path,
        readable=[Path(sys.prefix), Path(sys.base_prefix)],
        hidden=[],
    )
    prefix = argv[: argv.index("--chdir")] + ["--chdir", str(tmp_path)]  # the sandbox, a program of our own in it
    reached = {t: how for t, how in probe(prefix, targets).items() if how.startswith("open")}
    assert not reached, f"a sandboxed trainer reached host services: {reached}"
    # Its own loopback works (its ranks meet there): a server and a client inside one sandbox.
    both = (
        f"import subprocess, sys, time; srv = subprocess.Popen([sys.executable, '-c', {SERVE!r}, '29400', 'own'],"
        " stdout=subprocess.PIPE); srv.stdout.readline();"
        f" exec({PROBE!r}.replace('json.loads(sys.argv[1])', '[[\"127.0.0.1\", 29400]]')); srv.kill()"
    )
    out = subprocess.run(
        [*prefix, *UNPRIVILEGED, sys.executable, "-c", both], capture_output=True, text=True, timeout=120
    )
    assert json.loads(out.stdout.splitlines()[-1]) == {"127.0.0.1:29400": "open:own"}, (out.stdout, out.stderr)


@pytest.fixture
def networks():
    made: list[TrainerNetwork] = []

    def make(node: str, job: str, rank: int) -> TrainerNetwork:
        net = TrainerNetwork(node, job, 1, rank)
        net.create()
        made.append(net)
        return net

    yield make
    for net in made:
        net.remove()


def _serve(net: TrainerNetwork, port: int, reply: str) -> subprocess.Popen:
    server = subprocess.Popen(
        [*net.enter(), *UNPRIVILEGED, sys.executable, "-c", SERVE, str(port), reply], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout.readline().strip() == "ready"
    return server


@root_only
def test_a_multi_node_jobs_trainers_reach_each_other_and_nothing_else(networks, service):
    job = f"jnet-{os.getpid()}"
    rank0 = networks("node-a", job, 0)
    rank1 = networks("node-b", job, 1)
    other = networks("node-a", job + "-other", 0)  # another job: the same addresses, its own switch
    assert rank0.address == other.address == rank_address(0) and rank1.address == rank_address(1)
    servers = [_serve(rank0, 29500, "rank0"), _serve(other, 29501, "other")]
    try:
        seen = probe(
            rank1.enter(),
            [(rank0.address, 29500), (rank0.address, 29501)]
            + [(a, p) for a in host_addresses() for p in (5432, 4222, service.port)],
        )
        assert seen.pop(f"{rank0.address}:29500") == "open:rank0", seen  # its peer, by the derived address
        assert seen.pop(f"{rank0.address}:29501") != "open:other", seen  # never another job's trainer
        assert not {t: how for t, how in seen.items() if how.startswith("open")}, seen  # no host service
        # The other job's trainer does not reach this job's rank 0 at the address they share.
        assert not probe(other.enter(), [(rank0.address, 29500)])[f"{rank0.address}:29500"].startswith("open")
    finally:
        for server in servers:
            server.kill()
            server.wait()
    # No interface of these namespaces is the host's: the host's own stack has none of them.
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "br0" not in host_links and " p0@" not in host_links, host_links


@root_only
def test_a_jobs_switch_carries_frames_as_large_as_loopbacks_unfiltered(networks):
    # At Ethernet's 1,500 the ranks' gradient transfers cost several times the packets they do on the host.
    net = networks("node-a", f"jmtu-{os.getpid()}", 0)
    links = {
        where: subprocess.run(["ip", "-n", where, "-o", "link"], capture_output=True, text=True, check=True).stdout
        for where in (net.name, net.switch)
    }
    mtus = {
        (where, line.split(":")[1].strip().split("@")[0]): int(line.split(" mtu ")[1].split()[0])
        for where, listing in links.items()
        for line in listing.splitlines()
        if " mtu " in line and ": lo:" not in line
    }
    assert mtus and all(mtu == LINK_MTU == 65535 for mtu in mtus.values()), mtus
    assert {name for _, name in mtus} >= {"eth0", "br0"}, mtus
    if BRIDGE_FILTER_SYSCTLS.exists():  # br_netfilter loaded: the switch's frames skip iptables
        hooked = subprocess.run(
            ["ip", "netns", "exec", net.switch, "sysctl", "-n"] + [f"net.bridge.{k}" for k in BRIDGE_FILTER_KEYS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert hooked == ["0", "0", "0"], hooked


@root_only
def test_the_worker_sets_the_interface_and_a_command_cannot():
    net = TrainerNetwork("node-a", "j", 1, 0)
    assert net.environment["GLOO_SOCKET_IFNAME"] == net.environment["NCCL_SOCKET_IFNAME"] == "eth0"
    problems = command_env_problems({"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"})
    assert len(problems) == 2 and all("not an NCCL tuning key" in p for p in problems), problems


@root_only
def test_a_workers_start_removes_its_nodes_stale_namespaces_and_empty_switches(networks, monkeypatch):
    job = f"jsweep-{os.getpid()}"
    stale, live = networks("node-s", job, 0), networks("node-s", job + "-live", 0)
    elsewhere = networks("node-t", job, 1)  # another worker's trainer of the same job, on this host
    stale_alone = TrainerNetwork("node-s", job + "-alone", 1, 0)
    stale_alone.create()
    removed = sweep("node-s", keep={live.name})
    assert set(removed) == {stale.name, stale_alone.name}, removed
    names = {p.name for p in NETNS_DIR.iterdir()}
    assert live.name in names and elsewhere.name in names and elsewhere.switch in names
    assert stale_alone.switch in names  # without a port, but young: another worker may be about to plug in
    monkeypatch.setattr("worker.trainer_network.SWITCH_GRACE_S", 0.0)
    sweep("node-s", keep={live.name})
    names = {p.name for p in NETNS_DIR.iterdir()}
    assert stale_alone.switch not in names and elsewhere.switch in names  # no port left: removed
    assert not [n for n in names if n.startswith(node_prefix("node-s")) and n != live.name]
