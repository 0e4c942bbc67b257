"""One training process per run folder (engine/run_lock.py): a second one, here a train.py into the folder a live
process holds, ends with one `error:` line naming that process's pid before any work; the lock goes with its
process however it ends (SIGKILL included), so a resume afterwards is not blocked by a stale lock file."""

import os
import signal
import socket
import subprocess
import sys
import time

from engine.run_lock import LOCK_NAME, RunLock
from utils.files import ROOT

HOLD = ("import sys, time; from engine.run_lock import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(300)")


def _holder(folder):
    """A process holding the lock of `folder` (it says so before the test goes on)."""
    p = subprocess.Popen(["timeout", "300", sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _pid_of(holder):
    """The python process under `timeout`."""
    return int(subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True, text=True).stdout.split()[0])


def _gone(pid):
    """Wait (30 s at most) until `pid` has exited: `timeout` can be reaped before its child has finished dying, and
    the child's lock goes only with its exit."""
    for _ in range(600):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)


def test_a_second_process_is_refused_naming_the_first_until_that_one_dies(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    holder = _holder(folder)
    try:
        pid = _pid_of(holder)
        assert RunLock(folder).holder() == f"pid {pid} on host {socket.gethostname()}"
        r = subprocess.run(["timeout", "300", sys.executable, str(ROOT / "train.py"), "--project", str(tmp_path),
                            "--name", "exp", "--exist-ok", "--epochs", "1", "--data", "nowhere.yaml"],
                           cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.splitlines() == [
            f"error: {folder} is in use: pid {pid} on host {socket.gethostname()} is training in it (two processes "
            "would write one last.pt and results.csv); wait for it to end or stop it, or train into another --name"]
        assert "Training on" not in r.stdout and sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    _gone(pid)
    mine = RunLock(folder)
    assert mine.holder() is None, "a killed holder's lock is gone with it"
    assert (folder / LOCK_NAME).read_text() == f"pid {os.getpid()} on host {socket.gethostname()}\n"
    mine.release()
