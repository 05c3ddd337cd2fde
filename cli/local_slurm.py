"""A one-host Slurm cluster in a folder, for trying the Slurm backend and for the tests: munged, slurmctld
and one slurmd (Debian's slurm-wlm and munge), with GPUs that are character devices standing in for real
ones (gres.conf with AutoDetect=off, one gres type per GPU as ADC expects, deploy/slurm/README.md).

    python -m cli.local_slurm DIR [--gpus 4] [--node node-1]

writes DIR/slurm.conf, starts the daemons and prints the SLURM_CONF to export; Ctrl-C stops them.
Everything runs as root (slurmd must, to run jobs as other users), with its state, logs and sockets in DIR.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
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


class LocalSlurm:
    def __init__(self, home: Path, node: str = "node-1", gpus: int = 4, cpus: int = 8) -> None:
        self.home = home.resolve()
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
        self._spawn("slurmd", [_tool("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        self.wait_node_up(timeout_s)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.home / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
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
