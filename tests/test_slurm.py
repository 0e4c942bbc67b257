"""examples/slurm/train.sbatch on a real SLURM cluster of one node (tests/slurm_cluster.py), both ways: one task
running torchrun with 2 processes, and 2 tasks that take their ranks from SLURM. A high-priority job preempts the
training mid-epoch; every rank stops at one optimizer step and saves, the job requeues itself, and the requeued job
continues in the same folder to the weights of an uninterrupted 2-process run (--deterministic), each epoch once.

Installs Debian's SLURM and MUNGE when absent (root, apt-get), and skips, saying why, where that or the daemons
fail. `pytest -m slurm` runs these tests alone.
"""

import contextlib
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.checkpointer import AGREE_EVERY
from tests.ddp_utils import free_port
from tests.slurm_cluster import Cluster, ClusterError, install
from utils.files import ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = "examples/slurm/train.sbatch"
NB = 16  # batches per epoch: 64 images, 2 per rank and step
# Rank 0's stop line, not anchored to a line's start: SLURM merges the ranks' stdout (these lines) and stderr (the
# progress bar, which a stop leaves without its newline) into one file, in chunks that may break a line anywhere
STOPPED = re.compile(r"interrupted (at epoch \d/2 batch \d+/16|after epoch \d/2): resume with the same command "
                     r"\(--resume auto continues ([^\r\n]+)\)$", re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        install()
    except ClusterError as e:
        pytest.skip(str(e))
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
    except (ClusterError, OSError, subprocess.SubprocessError) as e:
        c.stop()
        pytest.skip(f"the SLURM daemons did not start: {e}")
    yield c
    c.stop()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """64 images of 64-96 px; nbs 4 makes every batch an optimizer step. The reference: the same training as one
    uninterrupted torchrun of 2 processes, outside SLURM."""
    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml

    root = tmp_path_factory.mktemp("slurm-runs")
    generate_dataset(root / "data", task="detect", n_train=64, n_val=4, seed=0, min_side=64, max_side=96)
    hyp = root / "hyp.yaml"
    hyp.write_text("nbs: 4\n")
    args = ["--data", str(write_yaml(root / "data", "detect")), "--hyp", str(hyp), "--imgsz", "64", "--batch-size",
            "4", "--epochs", "2", "--workers", "0", "--device", "cpu", "--cfg", "yolov5n.yaml", "--deterministic",
            "--noval", "--noplots", "--project", str(root / "runs")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(free_port()), "train.py", *args, "--name", "ref"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return root, args


def _weights(run_dir):
    return torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]["state_dict"]


def _ranks(job):
    """The pids of the job's training processes (not torchrun's agent, srun or the batch shell), from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        named = any(args[i:i + 2] == ["--name", f"job{job}"] for i in range(len(args)))
        if named and Path(args[0]).name.startswith("python") and "torch.distributed.run" not in args:
            found.append(int(entry.name))
    return found


def _status(pid):
    """/proc/<pid>/status as a dict, {} once the process is gone."""
    try:
        return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except OSError:
        return {}


def _held(pid):
    return _status(pid).get("State", "").startswith("T")


def _signalled(pid, signum):
    """Whether held process `pid` has `signum` waiting for it, or is no longer held (SLURM may send SIGCONT before
    its SIGTERM) or gone."""
    fields = _status(pid)
    pending = int(fields.get("ShdPnd", "0"), 16) | int(fields.get("SigPnd", "0"), 16)
    return not fields.get("State", "").startswith("T") or bool(pending >> (signum - 1) & 1)


def _until(ready, seconds, what):
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what} in {seconds} s"
        time.sleep(0.05)


def _preempted_and_requeued(cluster, setup, name, sbatch_options, signum, env=None):
    """Submit the training; once rank 0 is a batch or more into epoch 1, hold every rank (SIGSTOP), preempt the job
    with one of the high partition that needs both CPUs, let the ranks go on (SIGCONT) once `signum` (what the
    preemption makes them receive) waits for each, and wait for the requeued job to finish. Held, the ranks get
    the signal mid-epoch however fast they train and however long SLURM takes to preempt. Returns (job id, the
    batches of epoch 1 rank 0 had reported before the hold, the job's log, its fields)."""
    root, args = setup
    log = root / f"{name}.out"
    job = cluster.sbatch(f"--output={log}", f"--chdir={ROOT}", *sbatch_options, SCRIPT, "train.py", *args,
                         env={"PYTHONPATH": str(ROOT), "PYTHON": sys.executable, **(env or {})})
    progress = re.compile(rf"^ +1/2 .*\| (\d+)/{NB} \[", re.M)
    deadline = time.monotonic() + 400
    while True:
        done = [int(b) for b in progress.findall(log.read_text(errors="replace"))] if log.exists() else []
        if done and done[-1] >= 1:
            break
        fields = cluster.job(job)
        assert fields.get("JobState") in ("PENDING", "RUNNING") and time.monotonic() < deadline, \
            f"{fields.get('JobState')}: {log.read_text(errors='replace')[-4000:] if log.exists() else ''}"
        time.sleep(0.05)
    # rank 0 may be a batch or two further when held: the end of epoch 1 must still be ahead
    assert done[-1] < NB - 2, f"rank 0 was at batch {done[-1]}/{NB} before the test saw it in epoch 1"
    ranks = _ranks(job)
    assert len(ranks) == 2, ranks
    try:
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        _until(lambda: all(_held(pid) for pid in ranks), 60, "the ranks were not held")
        cluster.sbatch("-p", "high", "-n", "2", f"--output={root / f'{name}-high.out'}", "--wrap", "true")
        _until(lambda: all(_signalled(pid, signum) for pid in ranks), 120, f"no {signum.name} reached the ranks")
    finally:
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    fields = cluster.wait_job(job, lambda f: f.get("JobState") not in ("PENDING", "RUNNING", "REQUEUED",
                                                                       "COMPLETING"), 600, log)
    return job, done[-1], log.read_text(errors="replace"), fields


def _exits(text):
    """{task: exit status} from srun's lines "task 1: Exited with exit code 143", "tasks 0-1: ..." (srun reports
    tasks that end together in one line)."""
    exits = {}
    for tasks, code in re.findall(r"srun: error: \S+: tasks? ([\d,-]+): Exited with exit code (\d+)", text):
        for part in tasks.split(","):
            first, _, last = part.partition("-")
            exits.update(dict.fromkeys(range(int(first), int(last or first) + 1), int(code)))
    return exits


def _check(setup, job, before, text, fields, signal_name):
    """The job ran twice, its log holding both starts: every rank stopped after `signal_name` at the first optimizer
    step they agree on after the `before` batches of epoch 1 (the step AGREE_EVERY or the end of the epoch), saved
    it and left; the script requeued the job, which continued from that step in the same folder, each epoch once,
    to the reference's weights."""
    root, _ = setup
    run_dir = root / "runs" / f"job{job}"
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), text[-4000:]
    assert re.findall(rf"job {job} start (\d+) ", text) == ["0", "1"], text[-4000:]
    said = f"{signal_name}: stopping after at most {AGREE_EVERY} optimizer steps or at the end of the epoch"
    assert text.count(said) == 1, text[-4000:]  # rank 0 says
    [(where, folder)] = STOPPED.findall(text)
    assert folder == str(run_dir)
    # held a batch or two after `before` at most, the ranks stop at the first agreement from there
    first = f"at epoch 1/2 batch {AGREE_EVERY}/{NB}"
    assert (where == first) if before < AGREE_EVERY - 2 else (where in (first, "after epoch 1/2")), where
    assert "forcefully exiting" not in text  # torchrun's agent did not kill a rank before it saved
    assert text.count(f"requeueing job {job}") == 1
    assert f"--resume auto: continuing the unfinished run in {run_dir}" in text
    assert f"Resuming training from {run_dir / 'weights' / 'last.pt'} {where}" in text
    assert sorted(p.name for p in (root / "runs").iterdir() if p.name.startswith("job")).count(f"job{job}") == 1
    assert [int(r["epoch"]) for r in csv.DictReader(open(run_dir / "results.csv"))] == [1, 2]
    got, ref = _weights(run_dir), _weights(root / "runs" / "ref")
    diff = max((got[k].float() - ref[k].float()).abs().max().item() for k in ref)
    assert diff == 0, f"the requeued run ends {diff:.3g} away from the uninterrupted one"


def test_torchrun_per_node_is_warned_of_a_preemption_stops_and_requeues(cluster, setup):
    """One task running torchrun (2 processes). With preempt_send_user_signal the preemption sends the script's
    --signal=B:USR1 to the batch shell, which passes a Ctrl-C to every process of the step."""
    cluster.reconfigure(user_signal=True)
    job, before, text, fields = _preempted_and_requeued(cluster, setup, "torchrun", ["--cpus-per-task=2"],
                                                        signal.SIGINT, {"NPROC_PER_NODE": "2"})
    assert "--nproc_per_node 2 " in text
    assert text.count("SIGUSR1: asking every rank to stop and save") == 1
    _check(setup, job, before, text, fields, "Ctrl-C")


def test_srun_tasks_take_a_preemptions_sigterm_stop_and_requeue(cluster, setup):
    """Two tasks, ranks from SLURM's variables. Without preempt_send_user_signal the preemption sends SIGTERM to
    every task directly; the script requeues the job because SLURM set its PreemptTime."""
    cluster.reconfigure(user_signal=False)
    job, before, text, fields = _preempted_and_requeued(cluster, setup, "tasks", ["--ntasks-per-node=2"],
                                                        signal.SIGTERM)
    assert text.count("DDP: rank 0/2 (local 0) backend=gloo from SLURM's task variables") == 2  # each start
    assert "asking every rank to stop" not in text  # the batch shell was not signalled
    assert _exits(text) == {0: 143, 1: 143}, text[-4000:]  # each rank left as a stop on SIGTERM does, after saving
    _check(setup, job, before, text, fields, "SIGTERM")


STUB = """import signal, sys, time
got = []
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda n, f: got.append(n))
print("stub running", flush=True)
deadline = time.time() + 300
while not got and time.time() < deadline:
    time.sleep(0.1)
sys.exit(128 + got[0] if got else 0)
"""


def test_the_time_limit_warning_requeues_and_a_cancel_does_not(cluster, tmp_path):
    """The script's decisions, with two tasks of a stand-in that exits 128 + the first signal it gets, as the ranks
    do: `--signal=B:USR1` before the time limit (sent here with scancel --batch, as SLURM sends it) reaches every
    task as a Ctrl-C and the job is requeued; scancel ends the job for good, though its tasks stop the same way."""
    stub, log = tmp_path / "stub.py", tmp_path / "stub.out"
    stub.write_text(STUB)
    job = cluster.sbatch(f"--output={log}", f"--chdir={ROOT}", "--ntasks-per-node=2", SCRIPT, str(stub),
                         env={"PYTHON": sys.executable})

    def said(text, n):
        return lambda fields: log.exists() and log.read_text(errors="replace").count(text) >= n

    cluster.wait_job(job, said("stub running", 2), 120, log)
    assert cluster.run("scancel", "--batch", "--signal=USR1", job).returncode == 0
    cluster.wait_job(job, lambda f: f.get("Restarts") == "1", 120, log)
    cluster.wait_job(job, said("stub running", 4), 120, log)  # the requeued job's tasks
    text = log.read_text()
    assert "SIGUSR1: asking every rank to stop and save" in text and "stopped (status 130): requeueing" in text
    assert cluster.run("scancel", job).returncode == 0
    # scontrol shows COMPLETING until every process of the job, the batch script too, has ended: past it, the
    # script's requeue has happened (PENDING) or never will
    fields = cluster.wait_job(job, lambda f: f.get("JobState") in ("CANCELLED", "PENDING", "COMPLETED", "FAILED"),
                              120, log)
    assert (fields["JobState"], fields["Restarts"]) == ("CANCELLED", "1"), log.read_text()[-3000:]
    assert log.read_text().count("requeueing") == 1
