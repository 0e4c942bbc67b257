"""One training process per run folder: a run folder is locked while a process trains in it.

Two processes writing one folder (an orphaned run still going in another terminal, and its `--resume`; two new runs
that chose the same `--name`) would each write last.pt and results.csv over the other's, and neither would notice.
Global rank 0 takes an exclusive POSIX record lock (`fcntl.lockf`) on `<run>/.train.lock` and writes its pid and
host there; a second process finds the lock taken and ends with one `error:` line naming that pid. The kernel drops
the lock when its process ends, however it ends (kill -9, out of memory, a lost machine's NFS lease), so a stale
lock file never blocks a resume. Record locks belong to the process, not to its open file: DataLoader workers forked
from it do not hold it, and closing another descriptor of the same file in the holder would drop it (nothing here
opens the file twice in one process). Windows has no fcntl: there the folder is not locked.
"""

import os
import socket
from pathlib import Path

from utils.errors import BadOption

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_NAME = ".train.lock"


class RunBusy(BadOption):
    """Another process trains in the run folder (names it and its pid)."""


class RunLock:
    """The lock of one run folder, taken by `acquire` and held until `release` or the end of the process."""

    def __init__(self, run_dir):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd = None

    def holder(self):
        """Try to take the lock: None when this process holds it now, else what the holding process wrote ('pid
        1234 on host h')."""
        if fcntl is None or self.fd is not None:
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            said = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            return said or "another process"
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        self.fd = fd
        return None

    def acquire(self):
        """Take the lock, or RunBusy naming the process that holds it."""
        held_by = self.holder()
        if held_by is not None:
            raise busy(self.path.parent, held_by)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # drops the lock; the file stays, harmless: the next holder rewrites it
            self.fd = None


def busy(run_dir, held_by):
    return RunBusy(f"{run_dir} is in use: {held_by} is training in it (two processes would write one last.pt and "
                   "results.csv); wait for it to end or stop it, or train into another --name")
