"""A run's checkpoints: what one holds, when one is written, how a run continues from one, and what is left of them
when the run ends.

A checkpoint holds everything a run needs to continue exactly: the state of each of the run's components, which the
trainer names and hands over (`Checkpointer.checkpoint`, `restore`): the loop's state (`LoopState`), the model and its
EMA (`Weights`, `EMAWeights`: the portable form of a model), the optimizer, LR scheduler and AMP scaler, the
listeners' own states (the trackers' run ids); the options and hyperparameters as a record; and every rank's own
random states and running mean loss (`ranks`). Each component saves and loads its own entries (`state_dict`,
`load_state_dict`); the Checkpointer lays them out as every checkpoint of this project has held them. Rank 0 writes
it with the other ranks' states gathered. `Checkpointer.save` writes last.pt at each epoch's end (best.pt when fitness
improved, epochN.pt every --save-period epochs); `due` says when to write last.pt inside an epoch (--save-interval, a
stop request); `restore` continues from one; `strip_optimizer` leaves the EMA weights alone in a finished run's files.
"""

import contextlib
import dataclasses
import os
import random
import re
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from engine.messages import position
from models.checkpoints import load_checkpoint, model_to_ckpt, save_checkpoint, to_safe
from utils import dist as du
from utils.errors import BadOption
from utils.files import ROOT, atomic_copy
from utils.log import LOGGER


def project_version():
    """The version pyproject.toml declares (read from the file: a checkout runs without being installed)."""
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    return found.group(1) if found else "unknown"


@dataclasses.dataclass
class LoopState:
    """Where the training loop is and what it carries from epoch to epoch: a component whose entries sit at the
    checkpoint's top level (`state_dict` / `load_state_dict`, the one place they are written and read);
    `mean_losses` is each rank's own and travels in `ranks`."""

    epoch: int = 0  # the epoch being trained, from 0
    batch: int = 0  # batches of it done (a run resumed inside an epoch starts there)
    last_opt_step: int = -1  # global batch number of the last optimizer step: accumulation counts from it
    best_fitness: float = 0.0
    best_epoch: int = 0  # the epoch of best_fitness, for early stopping
    metrics: dict = dataclasses.field(default_factory=dict)  # the last validation's results
    mean_losses: torch.Tensor = None  # this rank's running mean of the epoch's loss items
    done: bool = False  # no epoch is left to train (the last one, or early stopping): only the run's end is
    # what the epoch's batches leave for its results.csv row, by column; never saved: the row is made before a
    # checkpoint could end the epoch
    losses: dict = dataclasses.field(default_factory=dict)  # the mean loss items over every rank
    learning_rates: dict = dataclasses.field(default_factory=dict)  # each parameter group's lr at the epoch's end

    def state_dict(self):
        # "epoch" is the last finished epoch (-1: none), as every checkpoint of this project has stored it
        return {"epoch": self.epoch - 1, "batch": self.batch, "last_opt_step": self.last_opt_step,
                "best_fitness": self.best_fitness, "best_epoch": self.best_epoch, "metrics": self.metrics,
                "done": self.done}

    def load_state_dict(self, ckpt):
        """The loop's entries of `ckpt`; `mean_losses` is left as it is (each rank's own, in `ranks`)."""
        self.epoch, self.batch, self.last_opt_step = ckpt["epoch"] + 1, ckpt["batch"], ckpt["last_opt_step"]
        self.best_fitness, self.best_epoch, self.metrics = ckpt["best_fitness"], ckpt["best_epoch"], ckpt["metrics"]
        self.done = bool(ckpt.get("done"))


class Weights:
    """A model as a checkpoint holds it: the portable form (`models.checkpoints.model_to_ckpt`: class, YAML, weights,
    names) in fp32, so that training continues exactly; loaded back as fp32 weights into the model as built."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        return model_to_ckpt(self.model, half=False)

    def load_state_dict(self, entry):
        self.model.load_state_dict({k: v.float() for k, v in entry["state_dict"].items()})


class EMAWeights:
    """A `utils.torch_utils.ModelEMA` as a checkpoint holds it: its model as `Weights` ("ema") and its count of
    updates ("updates"), which sets the decay's ramp; both entries at the checkpoint's top level."""

    def __init__(self, ema):
        self.ema = ema

    def state_dict(self):
        return {"ema": Weights(self.ema.ema).state_dict(), "updates": self.ema.updates}

    def load_state_dict(self, ckpt):
        Weights(self.ema.ema).load_state_dict(ckpt["ema"])
        self.ema.updates = ckpt["updates"]


# The components whose entries sit at the checkpoint's top level, as every checkpoint of this project has held them
# (the others are each one entry, under its name)
AT_TOP = ("loop", "ema")
# The order of a checkpoint's entries, as every checkpoint of this project has written them (any other entry follows)
ORDER = ("epoch", "batch", "last_opt_step", "best_fitness", "best_epoch", "metrics", "tracker_runs", "done", "ranks",
         "model", "ema", "updates", "optimizer", "scheduler", "scaler", "opt", "hyp", "date", "version")


# Under DDP, optimizer steps between the collectives that share a stop request and rank 0's --save-interval clock:
# a stop or a timed save comes at most this many steps late
AGREE_EVERY = 10


class Checkpointer:
    """last.pt, best.pt and epochN.pt of one run folder, and when to write them."""

    def __init__(self, save_dir, save_interval="0", save_period=-1):
        self.wdir = Path(save_dir) / "weights"
        self.last, self.best = self.wdir / "last.pt", self.wdir / "best.pt"
        self.interval = parse_save_interval(save_interval)  # (kind, every): inside epochs, by time or by steps
        self.period = save_period
        self.last_save = (time.monotonic(), -1)  # (time, global batch number) of the last checkpoint
        self.steps = 0  # optimizer steps `due` was asked about, which every rank counts alike

    @staticmethod
    def checkpoint(components, ranks):
        """The checkpoint of a run whose `components` ({name: component}) are where they are now, with every rank's
        `rank_state` in `ranks` (rank 0 writes it). A component has `state_dict()`; anything else (the options, the
        hyperparameters) is a record of the run, written as it is and never loaded back. to_safe converts what
        weights_only loading refuses, so anything added here is stored safely."""
        entries = {"ranks": ranks, "date": datetime.now().isoformat(), "version": project_version()}
        for name, part in components.items():
            state = part.state_dict() if hasattr(part, "state_dict") else part
            entries.update(state if name in AT_TOP else {name: state})
        first = [k for k in ORDER if k in entries]
        return to_safe({k: entries[k] for k in (*first, *(k for k in entries if k not in first))})

    @staticmethod
    def rank_state(state):
        """What differs between ranks and must survive a restart: the RNG states, the epoch's running mean loss."""
        return {"rng": rng_state(), "mloss": state.mean_losses.cpu()}

    def save(self, ckpt, epoch, improved):
        """At the end of `epoch`: last.pt, best.pt where fitness `improved`, epochN.pt every --save-period epochs
        (counted from 1). The others are copies of last.pt's file: a large model's checkpoint is serialised once."""
        save_checkpoint(ckpt, self.last)
        if improved:
            atomic_copy(self.last, self.best)
        if self.period > 0 and (epoch + 1) % self.period == 0:
            atomic_copy(self.last, self.wdir / f"epoch{epoch + 1}.pt")

    def save_last(self, ckpt):
        save_checkpoint(ckpt, self.last)

    def saved(self, step):
        """Count --save-interval from here: a checkpoint holds the run after global batch `step`."""
        self.last_save = (time.monotonic(), step)

    def due(self, step, stop_asked, is_main):
        """(stop, save) right after the optimizer step at global batch `step`: whether a stop was asked on any rank,
        and whether to write last.pt (for the stop, or --save-interval, where rank 0's clock decides for all). A
        count of steps ('500it') is the same on every rank; the rest needs every rank's word, which one collective
        gives for both, every AGREE_EVERY optimizer steps under DDP (on CUDA, reading its answer makes the host wait
        for the GPU's queued work), at each one in a single process. Every rank takes the same decisions at the
        same step."""
        kind, every = self.interval
        t, last_step = self.last_save
        counted = kind == "it" and step - last_step >= every
        self.steps += 1
        if du.is_distributed() and self.steps % AGREE_EVERY:
            return False, counted
        timed = kind == "s" and is_main and time.monotonic() - t >= every
        stop, timed = du.any_ranks(stop_asked, timed)
        return stop, stop or timed or counted

    def restore(self, path, components, epochs, batches_per_epoch):
        """Load `path` into `components` ({name: component}, as `checkpoint` takes them: each loads its own entries;
        a record is not loaded) and this rank's RNG states, and return the LoopState to continue from: "loop", whose
        `mean_losses` is this rank's saved one (on the CPU). Every rank continues from rank 0's copy (the others may be
        on machines without it). `epochs` and `batches_per_epoch` are this run's."""
        rank, world_size = du.get_rank(), du.get_world_size()
        ckpt = du.broadcast_object(load_checkpoint(path) if rank in (-1, 0) else None)
        for name, part in components.items():
            if hasattr(part, "load_state_dict"):
                load_component(part, ckpt if name in AT_TOP else ckpt.get(name), path)
        state = components["loop"]
        state.done = state.done or state.epoch >= epochs  # older checkpoints: the last epoch says it
        ranks = ckpt["ranks"]
        if len(ranks) == max(world_size, 1):
            mine = ranks[max(rank, 0)]
            set_rng_state(mine["rng"])
            state.mean_losses = mine["mloss"]
        else:
            LOGGER.warning(f"{path} holds the state of {len(ranks)} ranks, this run has {world_size}: "
                           f"continuing with fresh random states, from the start of epoch {state.epoch}")
            state.batch = 0  # another world size shards the epoch differently
        self.saved(state.epoch * batches_per_epoch + state.batch - 1)
        if state.done:
            LOGGER.info(f"Finishing {path}: its training is done; the final validation and the strip are left")
        else:
            LOGGER.info(f"Resuming training from {path} "
                        f"{position(state.epoch, state.batch, epochs, batches_per_epoch)}")
        return state

    def finish_best(self):
        """At the end of training, before the final validation: best.pt keeps only what inference and fine-tuning
        need (a fresh file where best.pt is a link to last.pt's, which keeps the run's whole state)."""
        if not self.best.exists():
            return
        if self.last.exists() and os.path.samefile(self.last, self.best):
            strip_optimizer(self.last, self.best)
        else:
            strip_optimizer(self.best)

    def finish_last(self):
        """After the final validation: last.pt is stripped too, which marks the run finished (--resume refuses it)."""
        if self.last.exists():
            strip_optimizer(self.last)


# How torch.optim runs a step, which this run's device decides (fused kernels on CUDA), not the checkpoint's
IMPLEMENTATION = ("fused", "foreach", "capturable")


def load_optimizer(optimizer, saved):
    """`saved` into `optimizer`, each group keeping this run's implementation: a checkpoint trained on CUDA says
    `fused`, which a CPU run resumed from it would otherwise take, and torch places each loaded step count by the
    flags of the state it loads (on the GPU for fused kernels, else where it was saved)."""
    groups = [{**g, **{k: own[k] for k in IMPLEMENTATION if k in own}}
              for g, own in zip(saved["param_groups"], optimizer.param_groups)]
    optimizer.load_state_dict({**saved, "param_groups": groups})


def load_scaler(scaler, saved, path):
    """The GradScaler state of an fp16 run. A run without one (fp32, bf16: a CPU run resumed on CUDA) saved an
    empty state, which torch refuses to load into an enabled scaler: that one starts fresh. A disabled scaler (a
    fp16 run resumed on a CPU) ignores what it is given."""
    if scaler.is_enabled() and not saved:
        LOGGER.info(f"{path} was trained without fp16 gradient scaling: the GradScaler starts at its initial scale")
        return
    scaler.load_state_dict(saved)


def load_component(part, entry, path):
    """`entry` (of checkpoint `path`) into `part` by its own `load_state_dict`; torch's optimizers and scalers by
    `load_optimizer` and `load_scaler`, which keep what this run's device decides."""
    if isinstance(part, torch.optim.Optimizer):
        load_optimizer(part, entry)
    elif isinstance(part, torch.amp.GradScaler):
        load_scaler(part, entry, path)
    else:
        part.load_state_dict(entry)


def parse_save_interval(value):
    """--save-interval: '10m', '90s', '2h' -> ('s', seconds); '500it' -> ('it', iterations); '0' or '' -> off."""
    text = str(value or "0").strip().lower()
    units = {"it": ("it", 1), "s": ("s", 1), "m": ("s", 60), "h": ("s", 3600)}
    for suffix, (kind, scale) in units.items():
        number = text[: -len(suffix)]
        if text.endswith(suffix) and number.replace(".", "", 1).isdigit():
            return (kind, float(number) * scale) if float(number) > 0 else ("off", 0)
    if text.replace(".", "", 1).isdigit() and float(text) == 0:
        return "off", 0
    raise BadOption(f"--save-interval {value}: expected minutes, seconds, hours or iterations, e.g. 10m, 90s, 500it")


def strip_optimizer(path, to=None):
    """Keep only what inference and fine-tuning need: the EMA weights in fp16 as `model`, no optimizer, no training
    position (smaller file; a bare --resume then knows the run has finished). Written to `to` when given, else over
    `path`."""
    ckpt = load_checkpoint(path)
    if ckpt.get("ema"):
        ckpt["model"] = ckpt["ema"]
    sd = ckpt["model"]["state_dict"]
    ckpt["model"]["state_dict"] = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    # "rng": where a checkpoint without per-rank states keeps its random states
    for k in ("ema", "optimizer", "scheduler", "scaler", "ranks", "rng", "updates"):
        ckpt[k] = None
    save_checkpoint(to_safe(ckpt), to or path)  # to_safe: a checkpoint written without it may hold numpy arrays


@contextlib.contextmanager
def sigterm_deferred():
    """Finish a checkpoint before dying of SIGTERM: when a peer dies, torchrun sends SIGTERM to the survivors, and
    rank 0 is then often in the middle of saving the state the restart needs. Re-raised when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            os.kill(os.getpid(), signal.SIGTERM)


# ------------------------------------------------------------------------------------------------ random states
# Stored as tensors, ints, floats and lists, which a weights_only load accepts.
def rng_state():
    """This process's global RNG states (torch, CUDA, numpy, python)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "gauss": float(gauss)},
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss_next},
    }


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss"]))
