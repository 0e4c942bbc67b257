"""What every experiment tracker sends, when, and how a failing one never costs the run.

A tracker (W&B, MLflow, ClearML, Comet) is a listener of the declared events (engine/callbacks.py), attached on global
rank 0 only (engine.loggers.build_loggers), so no other rank imports its package. A subclass says how to talk to its
package (`open`, `log_step`, `log_final`, `log_weights`, `close`); this class decides what goes when:
- set-up done: a run is opened with the options and hyperparameters as its config, named after --project and the run
  folder, or the run whose id the checkpoint holds is continued: a --resume and a torchrun restart go on in the same
  tracker run. The tracker keeps the id and gives it to every checkpoint, under `tracker_runs`, as a component of the
  run (`state_dict`, `load_state_dict`: engine/callbacks.py); it has it before any checkpoint is written. labels.jpg
  goes too.
- each epoch's end: the epoch's results.csv row under the same names, at step = the epoch as results.csv numbers it
  (from 1), and the pictures drawn since (the first training batches). A resumed run starts after the last saved
  epoch, so no step is sent twice.
- the end: the final validation's pictures and results.png, its per-class table, best.pt (unless --no-log-model),
  then the run is closed as finished. A run that ends early sends best.pt where one exists and is closed as killed
  (a stop request or a signal: --resume continues it) or failed (an error); never left running, but by a process
  killed outright (SIGKILL), whose --resume closes it.
Any Exception on the way (the package not installed, no login, a network error, a bug in the package) is one warning
naming the tracker; the tracker is then off for the rest of the run, and training goes on.
A tracker never changes the run either: each call into its package (importing it included) is made with the process
state it may touch kept aside and put back after (`kept_process_state`), so the random streams, the signal handlers
that stop the loop on Ctrl-C, sys.excepthook and sys.exit are those of a run without it.
"""

import contextlib
import importlib
import random
import re
import signal
import sys
import threading

from utils.log import LOGGER

PICTURES = ("*.jpg", "*.png")  # what the run draws into its folder (evaluation/charts.py, evaluation/plots.py)


class TrackerOff(Exception):
    """Why a tracker cannot start, said in full by its message (no exception type needed in the warning)."""


class Tracker:
    name = ""  # as --loggers names it, and the key of its run id in the checkpoint
    install = ""  # the pip package
    checkpoint_entry = "tracker_runs"  # {tracker name: run id} in every checkpoint (engine/callbacks.STATE_ENTRIES)

    def __init__(self, log_model=True):
        self.log_model = log_model
        self.active = False  # a run is open and nothing has failed
        self.sent = {}  # picture name -> modification time when sent: a redrawn picture is sent again
        self.opened_id = None  # the run opened or continued, which every checkpoint from then on holds
        self.resumed_id = None  # the run the checkpoint this run resumed from holds: it is continued

    # ---------------------------------------------------------------- its state, in the run's checkpoints
    def state_dict(self):
        return {self.name: self.opened_id} if self.opened_id else {}

    def load_state_dict(self, entry):
        self.resumed_id = entry.get(self.name)

    # ---------------------------------------------------------------- what a subclass implements
    def open(self, event, run_id):
        """Open a run, or continue `run_id` (None: a new run), as set-up's `event` describes it (its run folder,
        `project`, `config`); return the run's id."""
        raise NotImplementedError

    def log_step(self, metrics, pictures, step):
        """One step's metrics {name: float} and pictures [paths], either possibly empty, sent for good: a process
        killed after this call has lost nothing it sent."""
        raise NotImplementedError

    def log_final(self, pictures, table, step):
        """The end's pictures and the final validation's per-class `table` (columns, rows; rows may be empty), after
        the last epoch's step `step`."""
        raise NotImplementedError

    def log_weights(self, path, step):
        raise NotImplementedError

    def close(self, status="finished"):
        """Close the run as `status`: 'finished', 'killed' (stopped early: a stop request or a signal) or 'failed'
        (an error, the run's or the tracker's)."""
        raise NotImplementedError

    def where(self):
        """Where the user finds the run, for the start message."""
        return ""

    # ---------------------------------------------------------------- the events
    def on_pretrain_routine_end(self, event):
        self._guarded("starting", self._start, event)

    def on_fit_epoch_end(self, event):
        if self.active:
            self._guarded("logging the epoch", self._log_epoch, event)

    def on_train_end(self, event):
        if self.active:
            self._guarded("finishing", self._finish, event)

    def on_train_interrupted(self, event):
        if self.active:
            self._guarded("closing", self._end, event, "killed")

    def on_train_failed(self, event):
        if self.active:
            self._guarded("closing", self._end, event, "failed")

    def _guarded(self, what, fn, *args):
        with kept_process_state():  # closing after a failure too: ClearML's close sets signal handlers of its own
            try:
                fn(*args)
            except Exception as e:  # a tracker's failure of any kind is reported and ends its logging, never the run
                reason = str(e) if isinstance(e, TrackerOff) else f"{type(e).__name__}: {e}"
                LOGGER.warning(f"WARNING: {self.name}: {what} failed, training goes on without {self.name}: {reason}")
                self.active = False
                try:  # a start that failed after opening its run closes it too; close() with nothing open does nothing
                    self.close("failed")
                except Exception:  # reported once already: the first error is the one worth reading
                    pass

    def _close(self, status):
        self.active = False
        self.close(status)

    # ---------------------------------------------------------------- what is sent when
    def require(self, module):
        """The tracker's package, imported now (never at import time: a run that does not name it needs none)."""
        try:
            return importlib.import_module(module)
        except ImportError as e:
            raise TrackerOff(f"{module} cannot be imported ({e}); pip install {self.install}") from None

    def _start(self, event):
        previous = self.resumed_id
        run_id = self.open(event, previous)
        if not isinstance(run_id, str) or not run_id:  # the checkpoint stores it: plain text, or it could not be saved
            raise TrackerOff(f"{self.name}: the package gave no run id ({type(run_id).__name__} {run_id!r})")
        self.opened_id = run_id
        self.active = True
        LOGGER.info(f"{self.name}: {'continuing' if previous == run_id else 'started'} run {run_id}{self.where()}")
        pictures = self._new_pictures(event.save_dir)
        if previous != run_id and pictures:  # a continued run sent what it drew before it stopped
            self.log_step({}, pictures, event.epoch)

    def _log_epoch(self, event):
        self.log_step(dict(event.row), self._new_pictures(event.save_dir), event.epoch)

    def _finish(self, event):
        self.log_final(self._new_pictures(event.save_dir), event.class_table, event.epoch)
        self._send_best(event.best, event.epoch)
        self._close("finished")

    def _end(self, event, status):
        """A run that ended early: best.pt where it exists, then the run closed as `status`."""
        self._send_best(event.best, event.epoch)
        self._close(status)

    def _send_best(self, best, step):
        if self.log_model and best is not None and best.is_file():
            self.log_weights(best, step)

    def _new_pictures(self, save_dir):
        """The pictures written or redrawn since the last call (all of them the first time)."""
        new = []
        for path in sorted(p for pattern in PICTURES for p in save_dir.glob(pattern)):
            mtime = path.stat().st_mtime_ns
            if self.sent.get(path.name) != mtime:
                self.sent[path.name] = mtime
                new.append(path)
        return new


@contextlib.contextmanager
def kept_process_state():
    """Put back, on the way out, what a tracker's package changes in the process that would change the run: ClearML
    reseeds random, numpy and torch at Task.init and installs its own SIGINT/SIGTERM handlers, sys.excepthook and
    sys.exit; comet_ml replaces sys.excepthook when imported and draws file names from `random`. Signal handlers are
    kept only on the main thread, the only one that may set them."""
    import numpy as np
    import torch

    signals = (signal.SIGINT, signal.SIGTERM)
    handlers = {s: signal.getsignal(s) for s in signals}
    hooks = sys.excepthook, sys.exit
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        sys.excepthook, sys.exit = hooks
        if threading.current_thread() is threading.main_thread():
            for s, handler in handlers.items():
                if handler is not None and signal.getsignal(s) is not handler:  # None: set outside Python
                    signal.signal(s, handler)


def service_project_name(project, max_len):
    """A project name the hosted trackers take (W&B at most 128 characters, Comet 100): none of / \\ # ? % :, each
    run of them one '-' (runs/train -> runs-train)."""
    return re.sub(r"[/\\#?%:]+", "-", project).strip("-")[:max_len] or "yolo"
