"""A one-host Slurm cluster in a folder, for trying the Slurm backend and for the tests: munged, slurmctld
and one slurmd (Debian's slurm-wlm and munge), with GPUs that are character devices standing in for real
ones (gres.conf with AutoDetect=off, one gres type per GPU as ADC expects, deploy/slurm/README.md).

    python -m cli.local_slurm DIR [--gpus 4] [--node node-1]

writes DIR/slurm.conf, starts the daemons and prints the SLURM_CONF to export; Ctrl-C stops them.
Everything runs as root (slurmd must, to run jobs as other users), with its state, logs and sockets in DIR.

slurmd runs in a mount namespace of its own, the compute node's view of the files: where a folder its jobs
need (ADC's code, its two Python environments, DIR, the `reachable` folders) lies under one the team uids
cannot pass through (a home folder of mode 0700, pytest's temporary root), that outer folder is an empty
tmpfs there with only the needed folders bound back in. A real compute node has them at such paths
(deploy/slurm/README.md); nothing on the host changes.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from cli.local_services import free_port


def slurm_missing() -> str | None:
    """Why a local Slurm cannot run here, or None."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "scontrol"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users and must be root"
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def adc_code() -> list[Path]:
    """What the jobs on a node run: ADC's code, the trainer's environment and the worker's (the launcher's)."""
    from worker.launch_check import code_folders

    return [*code_folders(), Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parents[1]]


def _passable(path: Path) -> bool:
    """Whether any uid may pass through the folder (others' execute bit)."""
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def node_view(reachable: Iterable[Path]) -> dict[Path, list[Path]]:
    """The outermost folders no team uid can pass through on the way to a `reachable` one, each with the
    reachable folders under it (to be bound back into an empty tmpfs over it)."""
    view: dict[Path, list[Path]] = {}
    for path in sorted({Path(os.path.realpath(p)) for p in reachable if Path(p).exists()}):
        closed = next((a for a in reversed(path.parents) if a != Path("/") and not _passable(a)), None)
        if closed is None:
            continue
        under = view.setdefault(closed, [])
        if not any(path.is_relative_to(p) for p in under):
            under.append(path)
    return view


_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV, _MNT_DETACH = (
    0x20000,
    0x1000,
    0x4000,
    1 << 18,
    0x2,
    0x4,
    2,
)


def _enter_view(view: dict[Path, list[Path]], staging: Path) -> None:
    """In slurmd's child before exec: its own mount namespace, each closed folder an empty tmpfs with the
    reachable folders under it bound back (from the original, seen through `staging` while it is built)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        check(
            libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, data and data.encode()),
            f"mount {source} on {target}",
        )

    check(libc.unshare(_CLONE_NEWNS), "unshare")
    mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    for i, (closed, paths) in enumerate(view.items()):
        original = staging / str(i)
        mount(str(closed), str(original), None, _MS_BIND | _MS_REC)
        mount("tmpfs", str(closed), "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)  # inside the new tmpfs: 0755 folders on the way
            mount(str(original / path.relative_to(closed)), str(path), None, _MS_BIND | _MS_REC)
        check(libc.umount2(str(original).encode(), _MNT_DETACH), f"umount {original}")


class LocalSlurm:
    def __init__(
        self, home: Path, node: str = "node-1", gpus: int = 4, cpus: int = 8, reachable: Iterable[Path] = ()
    ) -> None:
        """`reachable`: folders the node's jobs use besides ADC's code and `home` (the storage root, models)."""
        self.home = home.resolve()
        self.reachable = [*adc_code(), self.home, *reachable]
        self.staging: Path | None = None
        self.node = node
        self.gpus = gpus
        self.cpus = cpus
        self.conf = self.home / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ctld_port = 0

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("state", "spool", "log", "run", "dev"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        # slurmstepd runs each batch script from the spool folder as the job's user, who must pass through.
        for folder in (self.home, self.home / "spool"):
            folder.chmod(folder.stat().st_mode | 0o011)
        key = self.home / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o600)
        gres_lines = ["AutoDetect=off"]
        for i in range(self.gpus):
            dev = self.home / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o644 | 0o020000, os.makedev(1, 3))  # a character device, as gres needs
            gres_lines.append(f"NodeName={self.node} Name=gpu Type=i{i} File={dev}")
        (self.home / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        self.ctld_port = self.ctld_port or free_port()
        h, host = self.home, socket.gethostname()
        gres = ",".join(f"gpu:i{i}:1" for i in range(self.gpus))
        self.conf.write_text(
            f"""# Written by cli/local_slurm.py: a one-host cluster for ADC's Slurm backend.
ClusterName=adc
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={h}/run/munge.sock
StateSaveLocation={h}/state
SlurmdSpoolDir={h}/spool/%n
SlurmctldPidFile={h}/run/slurmctld.pid
SlurmdPidFile={h}/run/slurmd-%n.pid
SlurmctldLogFile={h}/log/slurmctld.log
SlurmdLogFile={h}/log/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PreemptMode=OFF
MinJobAge=600
KillWait=30
NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 Gres={gres} State=UNKNOWN
PartitionName=adc Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )

    def start(self, timeout_s: float = 60) -> None:
        self.write_config()
        h = self.home
        subprocess.run(
            [
                _tool("munged"),
                "--force",
                f"--key-file={h / 'munge.key'}",
                f"--socket={h / 'run' / 'munge.sock'}",
                f"--pid-file={h / 'run' / 'munged.pid'}",
                f"--log-file={h / 'log' / 'munged.log'}",
                f"--seed-file={h / 'run' / 'munge.seed'}",
            ],
            check=True,
        )
        self.start_ctld()
        view = node_view(self.reachable)
        self.staging = Path(tempfile.mkdtemp(prefix="adc-slurm-node-"))
        for i in range(len(view)):
            (self.staging / str(i)).mkdir()
        self._spawn(
            "slurmd",
            [_tool("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)],
            preexec=lambda: _enter_view(view, self.staging),
        )
        self.wait_node_up(timeout_s)

    def _spawn(self, name: str, argv: list[str], preexec=None) -> None:
        out = open(self.home / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=preexec,
        )

    def start_ctld(self) -> None:
        """slurmctld, with the state it saved (-i: ignore a missing or damaged state only on the first start)."""
        first = not any((self.home / "state").iterdir())
        self._spawn("slurmctld", [_tool("slurmctld"), "-D", *(["-i"] if first else []), "-f", str(self.conf)])

    def stop_ctld(self) -> None:
        self._stop("slurmctld")

    def wait_node_up(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.home / 'log'}")
            out = self.run("sinfo", "--noheader", "--format=%t", f"--nodes={self.node}", check=False)
            if out.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.3)
        raise RuntimeError(f"Slurm node {self.node} not up within {timeout_s:.0f}s; see {self.home / 'log'}")

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(
            [_tool(argv[0]), *argv[1:]], capture_output=True, text=True, env=os.environ | self.env, timeout=60
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        try:  # the jobs first: nothing of a test outlives it
            self.run("scancel", "--full", "--partition=adc", check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for name in ("slurmd", "slurmctld"):
            self._stop(name)
        pid_file = self.home / "run" / "munged.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)  # empty folders here: the binds were slurmd's own


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m cli.local_slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("home", type=Path, help="folder for the cluster's config, state and logs")
    parser.add_argument("--node", default="node-1", help="the Slurm node's name (ADC's node name too)")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs the node offers (device files)")
    args = parser.parse_args()
    if why := slurm_missing():
        raise SystemExit(why)
    cluster = LocalSlurm(args.home, args.node, args.gpus)
    cluster.start()
    print(f"export SLURM_CONF={cluster.conf}   # then: adc up --backend slurm --simulate-gpus {args.gpus}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
