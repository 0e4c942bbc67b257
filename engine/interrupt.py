"""Stopping a training run on request: Ctrl-C (SIGINT), SIGUSR1, and SIGTERM outside torchrun.

The first signal only asks: the loop stops at its next safe point (right after an optimizer step, when no
accumulated gradient would be lost, or at the end of an epoch; under DDP the ranks share their requests every
AGREE_EVERY optimizer steps, engine/checkpointer.py), every rank agreeing on the same step, writes
last.pt with the exact position, prints how to resume and exits 128 + the signal's number (130, 138, 143). A second
Ctrl-C in a single process started by hand exits at once, without saving.

Under torchrun SIGTERM stays the launcher's: the agent sends it to the surviving workers when a peer died, to restart
the group, and the peers cannot agree on anything then (engine/checkpointer.py only defers it while a checkpoint is
written). The agent also passes the terminal's Ctrl-C on to its workers, which are in the terminal's process group as
well, so each worker sees one Ctrl-C twice: there a repeated signal is not a second request, and the agent ends
workers that take longer than its shutdown timeout. The same holds in a SLURM job, whose scheduler may signal a rank
directly and again through the batch script (examples/slurm/train.sbatch); it kills what is left after its grace time
itself. SIGUSR1 is what `sbatch --signal=USR1@T` sends every task before a time limit; no launcher uses it, so it
asks for a stop under torchrun too.
"""

import contextlib
import os
import signal
import threading

from utils import dist as du
from utils.errors import Interrupted
from utils.log import LOGGER

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1"}


class StopRequests:
    """Signal handlers for the training loop (a context manager); `signum` is the first signal received, or None.

    DataLoader workers are forked with these handlers and ignore the signals (the pid check): the terminal sends
    Ctrl-C to them too, and a worker that died of it would take the batches the loop still needs to reach its stop.
    """

    def __init__(self, announce=True, within=1):
        self.announce = announce  # rank 0 says that the stop is under way
        self.within = within  # optimizer steps between the checks for a request (engine/checkpointer.AGREE_EVERY)
        self.torchrun = du.launcher() == "torchrun"  # whose SIGTERM restarts groups
        self.repeats = self.torchrun or bool(du.slurm_job())  # a signal may come twice: once is a request
        self.signum, self.pid, self.previous = None, os.getpid(), {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for s in (signal.SIGINT, signal.SIGUSR1) + (() if self.torchrun else (signal.SIGTERM,)):
                self.previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def _handle(self, signum, frame):
        if os.getpid() != self.pid:
            return
        if self.signum is None:
            self.signum = signum
            if self.announce:
                again = "" if self.repeats else "; Ctrl-C again exits at once, without saving"
                when = "the next optimizer step" if self.within == 1 else f"at most {self.within} optimizer steps"
                LOGGER.warning(f"\n{NAMES[signum]}: stopping after {when} or at the end of the epoch, to save "
                               f"last.pt{again}")
        elif not self.repeats:
            raise Interrupted(signum, f"{NAMES[signum]} again: exiting at once, without saving")

    def agreed(self):
        """Whether any rank was asked to stop: a collective, so every rank calls it at the same step."""
        return du.any_rank(self.signum is not None)


@contextlib.contextmanager
def ended_by_signals():
    """Around a whole run, outside the loop's safe points (set-up, the final validation), where there is no step to
    stop at: SIGTERM (outside torchrun, whose SIGTERM restarts groups) ends the run at once as Interrupted, as Ctrl-C
    does as KeyboardInterrupt, so that the listeners hear it (trackers close their run as killed) instead of the
    process vanishing; the loop's StopRequests take both signals over while it runs. last.pt is as the last
    checkpoint left it: a run stopped in its final validation is finished by --resume."""
    if du.launcher() == "torchrun" or threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def stop(signum, frame):
        if os.getpid() == pid:  # not in a DataLoader worker forked meanwhile
            raise Interrupted(signum, f"{NAMES[signum]}: stopped")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
