"""The trainer's network: a namespace of its own, where no service of the host can be reached.

A single-node trainer gets bubblewrap's `--unshare-net`: a namespace holding only its own loopback
(its ranks meet there). Postgres, NATS, the api and every other host address are simply not in it.

A multi-node job's trainers must reach each other, and nothing else. Each job gets a switch: a
network namespace `adcsw-<job tag>` holding one bridge and nothing else (no address, no process, no
route); the host's own network stack never sees these interfaces. Each trainer gets a namespace
`adc-<node tag>-<trainer tag>` with its loopback and `eth0`, one end of a veth pair whose other end
is a port of its job's switch. `eth0`'s address derives from the node rank alone (10.200.0.0/16, rank
r at 10.200.(r+1)//256.(r+1)%256), so every worker of the job agrees on rank 0's address (the
rendezvous) without telling each other; two jobs never share a switch, so equal addresses never meet.
The trainer runs as an unprivileged uid without capabilities: it cannot add an address, a route or
an interface, or send a raw frame. Gloo and NCCL are told to use `eth0` by the worker.

All workers of a job share one host here, so its switch is one bridge. On a real multi-host cluster
the switch would also enslave the job's VLAN on a dedicated trainer interface of each node (never an
interface the host has an address on), which is what carries the peers' traffic between hosts.

Only root can make namespaces: a worker that is not root runs multi-node trainers on the host's network
(it says so once). Namespaces are removed when their trainer ends, and on a worker's start those of its
node that no live trainer uses, with switches that have no port left.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
INTERFACE = "eth0"
PREFIX_LEN = 16
SUBNET = (10, 200)
TRAINER_PREFIX = "adc-"
SWITCH_PREFIX = "adcsw-"
SWITCH_GRACE_S = 60.0
# A switch here is one host's bridge: its frames never leave the host, so its links take the largest
# MTU a veth allows, as loopback's; at Ethernet's 1,500 gloo's and NCCL's transfers cost several
# times the packets. A switch that spans hosts takes its trainer interface's MTU instead.
LINK_MTU = 65535
# The switch filters nothing (it holds no rule), so its bridge's frames skip iptables' hooks, which
# br_netfilter, where loaded, otherwise runs for each one: a few microseconds a message between ranks.
BRIDGE_FILTER_KEYS = ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables")
BRIDGE_FILTER_SYSCTLS = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def _tag(*parts: object, length: int = 12) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:length]


def rank_address(node_rank: int) -> str:
    """The address of node rank `node_rank`'s trainer on its job's switch."""
    host = node_rank + 1
    if not 0 < host < 65535:
        raise ValueError(f"node rank {node_rank} is out of range")
    return f"{SUBNET[0]}.{SUBNET[1]}.{host >> 8}.{host & 255}"


def node_prefix(node: str) -> str:
    return f"{TRAINER_PREFIX}{_tag(node, length=8)}-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done


class NetworkError(RuntimeError):
    """The trainer's namespace could not be made (the start is refused with this)."""


@functools.cache
def _warn_not_root() -> None:
    log.warning("the worker is not root: multi-node trainers share the host's network (only root makes namespaces)")


@functools.cache
def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("nsenter") is not None


@dataclass
class TrainerNetwork:
    """The namespace of one multi-node trainer, on its job's switch."""

    node: str
    job_id: str
    attempt: int
    node_rank: int

    @property
    def name(self) -> str:
        return f"{node_prefix(self.node)}{_tag(self.job_id, self.attempt, self.node_rank)}"

    @property
    def switch(self) -> str:
        return f"{SWITCH_PREFIX}{_tag(self.job_id, self.attempt)}"

    @property
    def port(self) -> str:
        return f"p{self.node_rank}"  # inside the switch's namespace: no other name can clash with it

    @property
    def address(self) -> str:
        return rank_address(self.node_rank)

    def enter(self) -> list[str]:
        """The argv prefix that runs a command in this namespace (nsenter execs it: no extra process)."""
        return ["nsenter", f"--net={NETNS_DIR / self.name}", "--"]

    @property
    def environment(self) -> dict[str, str]:
        """Which interface gloo and NCCL use: set by the worker, never from a command."""
        return {"GLOO_SOCKET_IFNAME": INTERFACE, "NCCL_SOCKET_IFNAME": INTERFACE, "NCCL_IB_DISABLE": "1"}

    def create(self) -> None:
        _remove_namespace(self.name)  # a leftover of a killed worker's, same attempt (never the shared switch)
        _ip("netns", "add", self.name)
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
            self._ensure_switch()
            _ip(
                "-n",
                self.switch,
                "link",
                "add",
                self.port,
                "mtu",
                str(LINK_MTU),
                "type",
                "veth",
                "peer",
                "name",
                INTERFACE,
                "mtu",
                str(LINK_MTU),
                "netns",
                self.name,
            )
            _ip("-n", self.switch, "link", "set", self.port, "master", "br0", "up")
            _ip("-n", self.name, "addr", "add", f"{self.address}/{PREFIX_LEN}", "dev", INTERFACE)
            _ip("-n", self.name, "link", "set", INTERFACE, "up")
        except NetworkError:
            self.remove()
            raise

    def _ensure_switch(self) -> None:
        if not (NETNS_DIR / self.switch).exists():
            made = _ip("netns", "add", self.switch, check=False)
            if made.returncode != 0 and not (NETNS_DIR / self.switch).exists():
                raise NetworkError(f"ip netns add {self.switch}: {made.stderr.strip()[:300]}")
        if _ip("-n", self.switch, "link", "show", "br0", check=False).returncode != 0:
            made = _ip("-n", self.switch, "link", "add", "br0", "mtu", str(LINK_MTU), "type", "bridge", check=False)
            if made.returncode != 0 and _ip("-n", self.switch, "link", "show", "br0", check=False).returncode != 0:
                raise NetworkError(f"bridge of {self.switch}: {made.stderr.strip()[:300]}")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        if BRIDGE_FILTER_SYSCTLS.parent.is_dir():  # br_netfilter loaded: it would hook every frame
            subprocess.run(
                ["ip", "netns", "exec", self.switch, "sysctl", "-q", "-w"]
                + [f"net.bridge.{name}=0" for name in BRIDGE_FILTER_KEYS],
                capture_output=True,
                timeout=30,
            )

    def remove(self) -> None:
        """The trainer's namespace and veth pair, then the job's switch if no port is left."""
        _remove_namespace(self.name)
        remove_switch_if_unused(self.switch)


def _remove_namespace(name: str) -> None:
    """A trainer's namespace; its veth first (the peer, the switch's port, goes with it at once), since a
    namespace's own interfaces go some time after `ip netns del`."""
    if (NETNS_DIR / name).exists():
        _ip("-n", name, "link", "del", INTERFACE, check=False)
        _ip("netns", "del", name, check=False)


def remove_switch_if_unused(switch: str) -> None:
    if not (NETNS_DIR / switch).exists():
        return
    ports = _ip("-n", switch, "-o", "link", "show", "master", "br0", check=False)
    if ports.returncode == 0 and not ports.stdout.strip():
        _ip("netns", "del", switch, check=False)


def sweep(node: str, keep: set[str]) -> list[str]:
    """Remove this node's trainer namespaces that are not in `keep`, then switches without a port."""
    if not can_make_namespaces() or not NETNS_DIR.is_dir():
        return []
    removed = []
    prefix = node_prefix(node)
    for entry in sorted(NETNS_DIR.iterdir()):
        if entry.name.startswith(prefix) and entry.name not in keep:
            _remove_namespace(entry.name)
            removed.append(entry.name)
    for entry in sorted(NETNS_DIR.iterdir()):
        # A young switch may be another worker's, about to get its first port.
        if entry.name.startswith(SWITCH_PREFIX) and time.time() - _made_at(entry) > SWITCH_GRACE_S:
            remove_switch_if_unused(entry.name)
    if removed:
        log.info("removed %d stale trainer network namespaces", len(removed))
    return removed


def _made_at(entry: Path) -> float:
    try:
        return entry.lstat().st_mtime
    except OSError:
        return time.time()


def multi_node_network(node: str, job_id: str, attempt: int, node_rank: int) -> TrainerNetwork | None:
    """The namespace a multi-node trainer runs in, or None where the worker cannot make one."""
    if not can_make_namespaces():
        _warn_not_root()
        return None
    return TrainerNetwork(node, job_id, attempt, node_rank)
