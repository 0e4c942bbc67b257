"""How every script runs: `run_cli(main, parse_opt)` parses, checks the install, runs `main`, and turns what the
user can fix (utils/errors.py) into one `error:` line and exit status 2 on every rank, a stop into 128 + the signal,
and a lost peer into one line and status 1; it bounds OpenMP's spin-wait and keeps the C heap's freed memory first.
"""

import gc
import os
import signal
import sys
import time

from utils.errors import (
    Interrupted,
    UserError,
    _in_group,
    _torch,
    is_out_of_memory,
    lost_peer,
    out_of_memory,
    report_user_error,
)
from utils.heap import keep_freed_memory

PEER_GRACE_S = 30.0  # at most this long a rank that met a user error waits for the others to meet it too (they
# may first have to build the model, slow on a loaded machine); all ranks usually arrive within seconds
_ERROR_KEY = "yolo/user_error_ranks"


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
