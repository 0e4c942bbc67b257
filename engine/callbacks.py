"""The events a training run fires, and the callbacks that listen to them.

A callback is a function taking the event (`Event`: its name and the data it carries), or an object whose methods are
named after events (`on_fit_epoch_end(self, event)`); `Callbacks.attach` adds every such method. A listener reads what
the event gives it, never the trainer's attributes: the trainer's parts are its own to change. Names are checked
against `EVENTS` when a callback is added, so a misspelled event is refused instead of never firing. The run's pictures
(`evaluation.charts.RunPlots`) and the --loggers (results.csv, TensorBoard, trackers such as W&B and MLflow:
engine/loggers/) are callbacks attached on rank 0 by `BaseTrainer.default_callbacks`.

A listener object may keep state that a run's checkpoints hold (the trackers' run ids, which a resumed run
continues): it names the checkpoint entry (`checkpoint_entry`, one of `STATE_ENTRIES`) and has `state_dict()` (its
own keys of the entry) and `load_state_dict(entry)`; `Callbacks.components()` hands each entry to the Checkpointer as a
component (engine/checkpointer.py), so no listener writes the trainer's attributes.

A callback that raises an Exception is reported as one warning naming it and the event, and the run goes on: a
listener never ends the training it listens to. A BaseException (Ctrl-C, `utils.errors.Interrupted`, SystemExit)
passes through, so a callback can still stop a run on purpose.
"""

import dataclasses
from pathlib import Path
from typing import Any, Optional

from utils.log import LOGGER

# event: what has just happened, and the fields of its `Event` beyond those every event carries
EVENTS = {
    "on_pretrain_routine_end": "set-up is done (data, model, criterion, optimizer, a resumed state); save_dir exists: "
                               "project, config, names, labels, model",
    "on_train_start": "the first epoch is about to start after `epoch` epochs and `batch` batches (a resumed run "
                      "starts inside one)",
    "on_train_batch_end": "`batch` batches of the epoch after `epoch` are done",
    "on_train_epoch_end": "the batches of epoch `epoch` are done, before its validation: losses (means over every "
                          "rank)",
    "on_val_end": "a validation is done (each epoch's and the final one): metrics",
    "on_fit_epoch_end": "epoch `epoch` is done, validated and saved: row (what results.csv gets), metrics, "
                        "best_fitness, best_epoch",
    "on_model_save": "last.pt was written, and best.pt where `improved`: last, best, best_fitness, best_epoch",
    "on_train_interrupted": "the run stops on request or a signal (Ctrl-C, SIGTERM); last.pt holds the position to "
                            "resume from (written at the stop inside the loop, the last checkpoint's elsewhere)",
    "on_train_failed": "the run ends with an error (a user's mistake or a bug): listeners close what they opened",
    "on_train_end": "training and the final validation are done: metrics (best.pt's), class_table, best_fitness, "
                    "best_epoch",
}
# fired on every rank (a callback that writes files checks `event.main`); every other event fires on rank 0 only
EVERY_RANK = frozenset({"on_train_start", "on_train_end"})
# checkpoint entry: what listeners keep in it. Each is in every checkpoint, empty where no listener of the run keeps
# state there (listeners run on rank 0 alone, and a run may have none)
STATE_ENTRIES = {"tracker_runs": "{tracker name: run id}: a --resume or a torchrun restart continues that run"}


@dataclasses.dataclass(frozen=True)
class Event:
    """What a listener is told: the event's name, what every event carries (the run folder, the weights' paths, the
    position), and the event's own data (EVENTS says which; the others keep their empty defaults). Built only when
    the event has listeners, on the ranks it fires on."""

    name: str
    save_dir: Path  # the run folder (results.csv, the pictures, weights/)
    main: bool  # global rank 0: an every-rank event fires on the others too
    epoch: int  # epochs done, one this event ends included: results.csv's number of the last (0: none yet)
    batch: int = 0  # batches done of the epoch after `epoch` (a run stopped or resumed inside one)
    best: Optional[Path] = None  # weights/best.pt and last.pt, written or not
    last: Optional[Path] = None
    best_fitness: float = 0.0  # the best validation fitness so far, and the epoch (numbered from 0) that had it
    best_epoch: int = -1
    improved: bool = False  # on_model_save: best.pt was written too
    losses: dict = dataclasses.field(default_factory=dict)  # {results.csv column: the epoch's mean training loss}
    metrics: dict = dataclasses.field(default_factory=dict)  # the validation's {name: value} (fitness included)
    row: dict = dataclasses.field(default_factory=dict)  # the epoch's results.csv row: losses, metrics, learning rates
    project: str = ""  # --project as given, or the task's default (runs/train): what trackers name their project
    config: dict = dataclasses.field(default_factory=dict)  # every option, and the hyperparameters under `hyp`
    names: dict = dataclasses.field(default_factory=dict)  # {class id: name}
    labels: Any = None  # (classes (n,), normalised xywh boxes (n, 4) or None) of the training labels
    model: Any = None  # the model being trained (unwrapped): a listener may read it, never change it
    class_table: tuple = ((), ())  # (columns, rows) of the final validation's per-class results


def callback_name(fn):
    """How a message names a callback: `Class.method` or the function's name."""
    return getattr(fn, "__qualname__", None) or repr(fn)


class SharedEntry:
    """A checkpoint entry (a dict) that listeners keep their state in, each its own keys, as a component: the keys no
    listener of this run claims (a tracker that a resumed run's --loggers dropped) stay as the checkpoint held them,
    so a later resume with that tracker continues its run."""

    def __init__(self):
        self.keepers = []  # the listeners that keep their state here
        self.loaded = {}  # the entry as the checkpoint this run resumed from held it

    def state_dict(self):
        return {**self.loaded, **{k: v for keeper in self.keepers for k, v in keeper.state_dict().items()}}

    def load_state_dict(self, entry):
        self.loaded = dict(entry or {})  # older checkpoints: none
        for keeper in self.keepers:
            keeper.load_state_dict(self.loaded)


class Callbacks:
    """The listeners of one run, by event, in the order they were added, and the state they keep."""

    def __init__(self):
        self.listeners = {event: [] for event in EVENTS}
        self.states = {entry: SharedEntry() for entry in STATE_ENTRIES}

    def add(self, event, fn):
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r} for callback {callback_name(fn)}; events: {', '.join(EVENTS)}")
        if not callable(fn):
            raise TypeError(f"callback for {event} is not callable: {fn!r}")
        self.listeners[event].append(fn)

    def attach(self, listener):
        """Add every `on_*` method of `listener` under its name; a method named like an event but not one is refused
        (a misspelling would otherwise never fire)."""
        names = [n for n in dir(listener) if n.startswith("on_") and callable(getattr(listener, n))]
        if not names:
            raise ValueError(f"{type(listener).__name__} has no on_* method; events: {', '.join(EVENTS)}")
        entry = getattr(listener, "checkpoint_entry", None)
        if entry is not None and entry not in STATE_ENTRIES:
            raise ValueError(f"{type(listener).__name__} keeps its state in checkpoint entry {entry!r}; entries: "
                             f"{', '.join(STATE_ENTRIES)}")
        for name in names:
            self.add(name, getattr(listener, name))
        if entry is not None:
            self.states[entry].keepers.append(listener)
        return listener

    def components(self):
        """{checkpoint entry: the listeners' state in it}, a component each (engine/checkpointer.py)."""
        return dict(self.states)

    def extend(self, callbacks):
        """Callbacks as `run` takes them: a dict {event: [functions]}, or an iterable of listener objects."""
        if isinstance(callbacks, dict):
            for event, fns in callbacks.items():
                for fn in fns if isinstance(fns, (list, tuple)) else [fns]:
                    self.add(event, fn)
        else:
            for listener in callbacks or ():
                self.attach(listener)

    def fires(self, event, main=True):
        """Whether `event` has listeners to call here (rank-0 events none where `main` is False)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}")
        return bool(self.listeners[event]) and (main or event in EVERY_RANK)

    def fire(self, event):
        """Call the listeners of `event` (an Event) with it."""
        for fn in self.listeners[event.name]:
            try:
                fn(event)
            except Exception as e:  # a BaseException (a stop) passes; anything else must not end the run
                LOGGER.warning(f"WARNING: callback {callback_name(fn)} failed on {event.name} and is skipped this "
                               f"time: {type(e).__name__}: {e}")
