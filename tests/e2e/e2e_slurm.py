"""A Slurm cluster on one machine, made of Debian's slurmctld, slurmd and munge (`make slurm-tool` installs them):
the controller and each node in a network namespace of its own (e2e_netns), each with its own hostname (a UTS
namespace) and address, all reaching one another over a bridge that the test's own namespace also sits on, so the
test submits with `sbatch` as a user on a login node would. One munged serves the whole cluster (its socket is a
file, which every namespace sees), and every file of the cluster is under one folder."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from e2e_netns import NetworkNamespaces, namespaces_unavailable

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "scontrol", "squeue", "scancel")
CONTROLLER = "ctl"
# Every host's interface has this one name, as on a cluster's nodes, so one GLOO_SOCKET_IFNAME fits all.
INTERFACE = "eth0"
START_SECONDS = 60.0

SLURM_CONF = """\
ClusterName=zb{tag}
SlurmctldHost={controller}({controller_address})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again (slurm.conf(5), AuthInfo; 120 s by
# default, 5 at least): long enough for the requeue test's failed node to be back before the job starts again,
# shorter than the default.
AuthInfo=socket={root}/munge/munge.socket,cred_expire=60
CredType=cred/munge
StateSaveLocation={root}/ctld
SlurmctldPidFile={root}/ctld/slurmctld.pid
SlurmctldLogFile={root}/ctld/slurmctld.log
SlurmdSpoolDir={root}/nodes/%n
SlurmdPidFile={root}/nodes/%n/slurmd.pid
SlurmdLogFile={root}/nodes/%n/slurmd.log
SlurmdParameters=config_overrides
# The nodes share one kernel: no cgroup of their own, so steps are tracked by their process tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# A node that stops answering is down within seconds, its job requeued; it comes back when its slurmd registers.
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=10
KillWait=10
ReturnToService=2
JobRequeue=1
{nodes}
PartitionName=zb Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
CGROUP_CONF = "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"


def slurm_unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here, or None when it can."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (`make slurm-tool` installs Debian's slurmctld, slurmd, munge)"
    if shutil.which("unshare") is None:
        return "the `unshare` command (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"`unshare --uts` (a hostname for each node) failed: {probe.stderr.strip()}"
    return namespaces_unavailable()


def _wait(condition, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            said = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{said}")
        time.sleep(0.5)


class SlurmCluster:
    """A controller and `nodes` compute nodes (n1, n2, ...) with 2 CPUs each, in `root`; every host's address is
    on its interface eth0."""

    def __init__(self, root: Path, nodes: int):
        self.root = root
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.net = NetworkNamespaces([CONTROLLER, *self.nodes])
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: dict[str, subprocess.Popen] = {}
        self._munged: subprocess.Popen | None = None

    def start(self) -> SlurmCluster:
        self.net.create()
        for host, netns in self.net.namespaces.items():
            inside = self.net.interfaces[host]
            for change in (["down"], ["name", INTERFACE], ["up"]):
                subprocess.run(["ip", "-n", netns, "link", "set", "dev", inside, *change], check=True, timeout=30)
                inside = INTERFACE if change[0] == "name" else inside
        for folder in ("munge", "ctld", *(f"nodes/{n}" for n in self.nodes)):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self._start_munged()
        nodes = "\n".join(f"NodeName={n} NodeAddr={self.net.addresses[n]} CPUs=2 State=UNKNOWN" for n in self.nodes)
        self.conf.write_text(SLURM_CONF.format(tag=secrets.token_hex(3), controller=CONTROLLER, root=self.root,
                                               controller_address=self.net.addresses[CONTROLLER], nodes=nodes))
        (self.root / "cgroup.conf").write_text(CGROUP_CONF)
        self._daemons[CONTROLLER] = self._in_host(CONTROLLER, ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self.start_node(node)
        _wait(lambda: self.node_states() == dict.fromkeys(self.nodes, "idle"), START_SECONDS,
              "every node idle", self.root / "ctld" / "slurmctld.log")
        return self

    def _start_munged(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self._munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge / 'munge.socket'}", f"--key-file={key}",
             f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait(lambda: (munge / "munge.socket").exists(), 30, "munged's socket", munge / "munged.log")

    def _in_host(self, host: str, command: list[str]) -> subprocess.Popen:
        """`command` inside host's network namespace with its own hostname, in a session of its own."""
        log = self.root / f"{host}.out"
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.net.namespaces[host], "unshare", "--uts", "sh", "-c",
                 f'hostname {host} && exec "$@"', host, *command],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)

    def start_node(self, node: str) -> None:
        self._daemons[node] = self._in_host(node, ["slurmd", "-D", "-f", str(self.conf)])

    def fail_node(self, node: str) -> None:
        """The node as if its power went: its slurmd and everything running there killed at once."""
        self._daemons.pop(node).kill()
        self.kill_processes(node)

    def kill_processes(self, host: str) -> None:
        for pid in self.processes(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def processes(self, host: str) -> list[int]:
        """Every process in host's network namespace."""
        listed = subprocess.run(["ip", "netns", "pids", self.net.namespaces[host]], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]

    def job_processes(self, host: str) -> list[str]:
        """What runs on host beside its slurmd: the command lines of whatever a job left there."""
        daemon = self._daemons.get(host)
        left = []
        for pid in self.processes(host):
            if daemon is not None and pid == daemon.pid:
                continue
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{pid}: {command.strip()}")
        return left

    def run(self, *command: str, timeout: float = 60) -> str:
        done = subprocess.run(list(command), capture_output=True, text=True, env=self.env, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        try:
            shown = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        except (AssertionError, FileNotFoundError):
            return {}
        return dict(line.split() for line in shown.splitlines() if line.strip())

    def sbatch(self, script: Path, *options: str, env: dict[str, str]) -> int:
        done = subprocess.run(["sbatch", "--parsable", *options, str(script)], capture_output=True, text=True,
                              env={**self.env, **env}, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"sbatch: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def controller_log(self, chars: int = 4000) -> str:
        """The end of slurmctld's log: why the controller requeued, cancelled or failed a job."""
        log = self.root / "ctld" / "slurmctld.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no controller log)"

    def job(self, job: int) -> dict[str, str]:
        """`scontrol show job`'s fields (empty once the controller has forgotten the job)."""
        try:
            shown = self.run("scontrol", "show", "job", "-o", str(job))
        except AssertionError:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def steps(self, job: int) -> dict[str, str]:
        """The job's running steps: name -> step id."""
        shown = self.run("squeue", "-h", "-s", "-j", str(job), "-o", "%i %j")
        return {name: step for step, name in (line.split(None, 1) for line in shown.splitlines() if line.strip())}

    def close(self) -> None:
        for name in [*self.nodes, CONTROLLER]:
            daemon = self._daemons.pop(name, None)
            if daemon is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.wait(15)
        if self._munged is not None:
            self._munged.terminate()
            self._munged.wait(15)
        # Anything a job left in a namespace goes with it (close kills what is still there).
        self.net.close()

