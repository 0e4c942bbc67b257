"""A one-node SLURM cluster on 127.0.0.1 for the scheduler tests (tests/test_slurm.py).

munged, slurmctld and slurmd run in the foreground as children of the test process, from a temporary slurm.conf,
key and state folder, on free ports: nothing of the machine's own SLURM or MUNGE set-up is read or changed. The node
has 2 CPUs and two partitions: `low`, whose jobs a `high` job preempts by requeueing them (PreemptMode=REQUEUE,
with a grace time), and `high`. `stop` cancels every job, waits for them to end, then stops the daemons.
"""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.ddp_utils import free_port

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")  # the parts of Debian's slurm-wlm these tests use
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
GRACE_S = 180  # a preempted job's time to stop (it stops in seconds; the rest is room for a loaded machine)


class ClusterError(RuntimeError):
    """The cluster could not be set up here (the tests skip, saying why)."""


def install():
    """Install SLURM and MUNGE from Debian's packages when a command is missing: apt-get update once, then install.
    Raises ClusterError where that cannot be done (not root, no apt-get, no network)."""
    if all(shutil.which(c) for c in COMMANDS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise ClusterError("SLURM is not installed, and installing it needs root and apt-get (Debian's "
                           f"{' '.join(PACKAGES)})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{' '.join(cmd)} took more than 600 s") from None
        if r.returncode:
            raise ClusterError(f"{' '.join(cmd)} failed: {(r.stdout + r.stderr).strip()[-500:]}")


class Cluster:
    def __init__(self, root):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons = []  # (name, Popen), in start order
        # the node's name is what jobs see in their node list: one that resolves, as on a real cluster
        self.node = socket.gethostname() if _resolves(socket.gethostname()) else "localhost"

    def start(self):
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.write_conf(user_signal=True)
        sock = self.root / "munge.sock"
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                                f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'log/munged.log'}",
                                f"--seed-file={self.root / 'munged.seed'}"])
        self._wait(lambda: sock.exists(), 30, "munged made no socket")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
        self._wait(lambda: self.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", 60,
                   "the node did not become idle")

    def write_conf(self, user_signal):
        """slurm.conf; `user_signal`: a preemption sends the job's --signal to its batch script instead of SIGTERM to
        its tasks (preempt_send_user_signal). The requeued job may start again 10 s after it ended (cred_expire),
        and the scheduler looks every 2 s, instead of SLURM's 120 s and 60 s."""
        r = self.root
        lines = [
            "ClusterName=yolotest", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={r / 'munge.sock'},cred_expire=10",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log/slurmctld.log'}", f"SlurmdLogFile={r / 'log/slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=2", "ReturnToService=2", "KillWait=30",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
            *(["SlurmctldParameters=preempt_send_user_signal"] if user_signal else []),
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            f"PartitionName=low Nodes={self.node} Default=YES PriorityTier=1 PreemptMode=REQUEUE "
            f"GraceTime={GRACE_S} MaxTime=INFINITE",
            f"PartitionName=high Nodes={self.node} PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE",
        ]
        if self.conf.exists():  # the ports stay those the daemons listen on
            ports = [line for line in self.conf.read_text().splitlines() if re.match(r"Slurm(ctld|d)Port=", line)]
            lines = [line for line in lines if not re.match(r"Slurm(ctld|d)Port=", line)] + ports
        self.conf.write_text("\n".join(lines) + "\n")

    def reconfigure(self, user_signal):
        self.write_conf(user_signal)
        r = self.run("scontrol", "reconfigure")
        if r.returncode:
            raise ClusterError(f"scontrol reconfigure: {r.stderr.strip()}")

    def _daemon(self, name, cmd):
        out = open(self.root / "log" / f"{name}.out", "w")
        self.daemons.append((name, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)))

    def _wait(self, ready, seconds, what):
        deadline = time.monotonic() + seconds
        while not ready():
            dead = [n for n, p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"{what} in {seconds} s"
                raise ClusterError(f"{why}: {self.logs()}")
            time.sleep(0.5)

    def logs(self, n=600):
        """The end of each daemon's log, for a failure's message."""
        logs = sorted((self.root / "log").iterdir())
        return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-n:]}" for p in logs)

    def run(self, *cmd, timeout=60):
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, *args, env=None):
        r = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})}, capture_output=True,
                           text=True, timeout=60)
        if r.returncode:
            raise AssertionError(f"sbatch {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id):
        """`scontrol show job`'s fields of a job, as a dict ({} once SLURM has forgotten it)."""
        out = self.run("scontrol", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_job(self, job_id, done, seconds, log=None):
        """Poll until done(fields of the job) is true; on timeout, an AssertionError with the job's log."""
        deadline = time.monotonic() + seconds
        while True:
            fields = self.job(job_id)
            if done(fields):
                return fields
            if time.monotonic() > deadline:
                tail = Path(log).read_text(errors="replace")[-4000:] if log and Path(log).exists() else ""
                raise AssertionError(f"job {job_id} still {fields.get('JobState')} after {seconds} s:\n{tail}")
            time.sleep(1)

    def stop(self):
        """Cancel every job and wait (bounded) for them to end, then stop the daemons, last started first."""
        with contextlib.suppress(Exception):
            if any(p.poll() is None for _, p in self.daemons):
                self.run("scancel", "--full", "--user", "root")
                deadline = time.monotonic() + 60
                while self.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
                    time.sleep(1)
        for _, p in reversed(self.daemons):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
        self.daemons = []


def _resolves(host):
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False
