"""Errors the user can fix, and the one way every script reports them.

Raise a `UserError` subclass where the mistake is detected, with a message that names the file or option and the
problem. A script's `if __name__ == "__main__":` line is `run_cli(main, parse_opt)`: a UserError becomes one
`error: <message>` line on stderr and exit status 2, on every rank; any other exception is a bug in the project and
keeps its traceback. Each subclass is also a ValueError, so callers that catch ValueError keep working.
A user's stop (Ctrl-C, SIGTERM) ends with status 128 + the signal number and no traceback either (`Interrupted`).
Running out of memory (host or GPU) is reported the same way as a user error: the fix is in the command (a smaller
batch or image size), and a traceback would only bury the one line of torch's that says how much was asked for.
A rank whose collective fails because another process of the run ended (killed, crashed, its machine lost) says so
in one `error:` line and exits with status 1 once the launcher stops it: the process that ended first and the
launcher's summary say why, and its own traceback would only bury theirs.
"""

import gc
import os
import re
import signal
import sys
import time

from utils.heap import keep_freed_memory
from utils.text import escape_controls

PEER_GRACE_S = 30.0  # at most this long a rank that met a user error waits for the others to meet it too (they
# may first have to build the model, slow on a loaded machine); all ranks usually arrive within seconds
_ERROR_KEY = "yolo/user_error_ranks"


class UserError(Exception):
    """Something the user can fix: an option, a file, a dataset, a model YAML or a checkpoint."""


class BadOption(UserError, ValueError):
    """A command-line option or hyperparameter has a value that cannot work (names the option)."""


class BadFile(UserError, ValueError):
    """A file the user named is missing, unreadable or malformed (names the file)."""


class BadDataset(UserError, ValueError):
    """A dataset YAML or dataset folder is malformed or missing (names the YAML or folder)."""


class BadModelYaml(UserError, ValueError):
    """A model YAML has an unknown module, a bad argument or a bad layer reference (names the YAML line)."""


class BadCheckpoint(UserError, ValueError):
    """A weights / last.pt file is truncated, not ours, or does not fit the run (names the file)."""


# how a collective or the launcher's store fails when the other end of its connection is gone: gloo's TCP pairs,
# the TCP store, NCCL's remote-error report
LOST_PEER = re.compile(r"(?:(?:Read|Write) error \[[^\]]*\]:\d+: )?(?:Connection (?:closed|reset) by peer"
                       r"(?: \[[^\]]*\]:\d+)?|Broken pipe)|remote process exited or there was a network error")
CPU_OUT_OF_MEMORY = "DefaultCPUAllocator: can't allocate memory"  # torch raises a bare RuntimeError on the host


def _torch():
    """torch where a script has imported it, else None: this module is imported before the options are parsed, and
    torch's import (seconds) would make --help wait; an error of torch's can only come once torch is imported."""
    return sys.modules.get("torch")


def _in_group():
    """Whether this process is in a torch.distributed process group."""
    torch = _torch()
    return torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized()


def is_out_of_memory(e):
    torch = _torch()
    return isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError)) or (
        isinstance(e, RuntimeError) and CPU_OUT_OF_MEMORY in str(e))


def out_of_memory(e):
    """The one line for running out of memory: what was being allocated (the first line of torch's or numpy's
    message), and what to change."""
    said = str(e).strip().splitlines()
    what = said[0][:300] if said else "no details"
    return (f"out of memory ({what}): the command needs more memory than this machine has; a smaller --batch-size "
            "or --img needs less")


def lost_peer(e):
    """What a failed collective says of the process it lost (`Connection closed by peer [host]:port`), or None when
    `e` is not such a failure of a running process group."""
    if not (isinstance(e, RuntimeError) and _in_group()):
        return None
    found = LOST_PEER.search(str(e))
    return found.group(0) if found else None


class Interrupted(BaseException):
    """The user stopped the command with a signal. A BaseException, as KeyboardInterrupt is, so that no `except
    Exception` on the way up mistakes it for a failure to recover from. `message` is what is left to say (the trainer
    has already said how to resume); the exit status is 128 + the signal number, as the shell reports a signal."""

    def __init__(self, signum=signal.SIGINT, message=""):
        super().__init__(message)
        self.code, self.message = 128 + int(signum), message


def report_user_error(e, file=None):
    """Print the one line a user sees for `e` (whatever a file name in it holds: its control characters, line
    breaks included, are escaped)."""
    text = str(e).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    print(f"error: {escape_controls(text)}", file=file or sys.stderr, flush=True)


def _grace_for_peers(seconds=PEER_GRACE_S):
    """Under torchrun, count this rank in the launcher's key-value store and wait, at most `seconds`, until every
    rank has: a mistake in the options or the data is usually met by all ranks at once, and the launcher stops every
    rank as soon as one exits, which would cut off the others' own `error:` line and exit status."""
    if not _in_group():
        return
    dist = _torch().distributed
    # this rank has reported its mistake: when the launcher stops it (SIGTERM) because a peer left first, its exit
    # status is still the user error's
    signal.signal(signal.SIGTERM, lambda *_: os._exit(2))
    try:
        store = dist.distributed_c10d._get_default_store()  # no public accessor; the store outlives rank 0
        deadline, n = time.monotonic() + seconds, store.add(_ERROR_KEY, 1)
        while n < dist.get_world_size() and time.monotonic() < deadline:
            time.sleep(0.05)
            n = store.add(_ERROR_KEY, 0)
    except (RuntimeError, ValueError):  # the store may already be gone with the launcher: leave anyway
        pass


# How long an OpenMP thread that ends a parallel region waits, spinning, for the next before it sleeps: GNU OpenMP's
# spin count (torch's Linux wheels) and the LLVM/Intel runtimes' block time in ms (macOS wheels, conda builds).
OPENMP_SPIN = {"GOMP_SPINCOUNT": "3000", "KMP_BLOCKTIME": "0"}


def bounded_openmp_spin(environ):
    """Set OPENMP_SPIN's variables in `environ` unless it sets them or OMP_WAIT_POLICY. Read once, when torch loads
    its OpenMP runtime. GNU OpenMP's default spins 300,000 times: on busy cores the spinning thread holds a core the
    other needs, and a 2-core training step took 5x as long. Not spinning at all (OMP_WAIT_POLICY=PASSIVE) made
    every step 17-30 % slower on idle cores (a wake-up per region; issue 57). 3,000 spins is as fast as the default
    on idle cores and as robust as not spinning on busy ones (docs/performance.md, "OpenMP threads"). The LLVM and
    Intel runtimes count in milliseconds, far coarser: they do not spin."""
    if "OMP_WAIT_POLICY" not in environ:
        for key, value in OPENMP_SPIN.items():
            environ.setdefault(key, value)


def run_cli(main, parse_opt):
    """`main(parse_opt())` once torch and torchvision are known to work together (utils/versions.py), turning a
    UserError or running out of memory into `error: ...` and exit status 2; the C heap keeps what a step frees
    (utils/heap.py).

    Under torchrun the process then leaves with os._exit after a bounded grace period: a clean exit would destroy
    the process group and run atexit handlers, which can wait on peers blocked in a collective (or gone). The
    launcher stops any rank still running, so none hangs.
    """
    keep_freed_memory()
    bounded_openmp_spin(os.environ)  # before torch is imported: the scripts import it in main()
    try:
        opt = parse_opt()
        from utils.versions import check_torch_pair  # imports torch: after parsing, for a quick --help

        check_torch_pair()
        result = main(opt)
        # The process ends next. Python's shutdown garbage-collects the whole heap, which torch's and torchvision's
        # imports fill with cyclic objects: 1.2 s of a 2-core CPU after every command. Frozen objects are skipped
        # by the collector and freed by the OS; every file the scripts write is closed by then.
        gc.freeze()
        return result
    except Exception as e:
        if lost := lost_peer(e):
            _leave_with_the_group(lost)
        if not (isinstance(e, UserError) or is_out_of_memory(e)):
            raise  # a bug of ours: its traceback
        report_user_error(e if isinstance(e, UserError) else out_of_memory(e))
        if _in_group():
            _grace_for_peers()
            _exit_now(2)
        sys.exit(2)
    except (KeyboardInterrupt, Interrupted) as e:
        stop = e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT, "interrupted (Ctrl-C)")
        if stop.message:
            print(stop.message, file=sys.stderr, flush=True)
        if _in_group():
            _exit_now(stop.code)  # the ranks stopped together; leaving the group cleanly could wait on a peer
        sys.exit(stop.code)


def _leave_with_the_group(lost, seconds=PEER_GRACE_S):
    """One line for a collective whose peer is gone, then wait (at most `seconds`) for the launcher's SIGTERM and exit
    with status 1. torchrun names as the root cause the first failed worker it sees; leaving at once would put this
    rank, which only met the failure, beside the one that had it."""
    signal.signal(signal.SIGTERM, lambda *_: _exit_now(1))
    rank = _torch().distributed.get_rank()
    report_user_error(f"rank {rank} lost contact with another process of this run ({lost}): that "
                      "process's own output and the launcher's summary say why it ended; with --max-restarts, "
                      "torchrun restarts the group from the last checkpoint")
    time.sleep(seconds)
    _exit_now(1)


def _exit_now(code):
    """Leave at once (no atexit handlers, no process-group teardown), with what was printed flushed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
