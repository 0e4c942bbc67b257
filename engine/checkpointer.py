"""A run's checkpoints: what one holds, when one is written, how a run continues from one, and what is left of them
when the run ends.

A checkpoint holds everything a run needs to continue exactly: the loop's state (`LoopState`), the model and its EMA,
the optimizer, LR scheduler and AMP scaler states, the options and hyperparameters, and every rank's own random
states and running mean loss (`ranks`). Rank 0 writes it with the other ranks' states gathered. `Checkpointer.save`
writes last.pt at each epoch's end (best.pt when fitness improved, epochN.pt every --save-period epochs); `due`
says when to write last.pt inside an epoch (--save-interval, a stop request); `restore` continues from one;
`strip_optimizer` leaves the EMA weights alone in a finished run's files.
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
from utils.loggers import LOGGER


def project_version():
    """The version pyproject.toml declares (read from the file: a checkout runs without being installed)."""
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    return found.group(1) if found else "unknown"


@dataclasses.dataclass
class LoopState:
    """Where the training loop is and what it carries from epoch to epoch. `to_checkpoint` / `from_checkpoint` are
    the one place its checkpoint keys are written and read; `mean_losses` is each rank's own and travels in `ranks`.
    """

    epoch: int = 0  # the epoch being trained, from 0
    batch: int = 0  # batches of it done (a run resumed inside an epoch starts there)
    last_opt_step: int = -1  # global batch number of the last optimizer step: accumulation counts from it
    best_fitness: float = 0.0
    best_epoch: int = 0  # the epoch of best_fitness, for early stopping
    metrics: dict = dataclasses.field(default_factory=dict)  # the last validation's results
    mean_losses: torch.Tensor = None  # this rank's running mean of the epoch's loss items
    # {tracker name: its run id}, recorded by the tracker listeners (utils/loggers/tracker.py) when they open a run:
    # a --resume or a torchrun restart continues that run instead of opening another
    tracker_runs: dict = dataclasses.field(default_factory=dict)
    done: bool = False  # no epoch is left to train (the last one, or early stopping): only the run's end is

    def to_checkpoint(self):
        # "epoch" is the last finished epoch (-1: none), as every checkpoint of this project has stored it
        return {"epoch": self.epoch - 1, "batch": self.batch, "last_opt_step": self.last_opt_step,
                "best_fitness": self.best_fitness, "best_epoch": self.best_epoch, "metrics": self.metrics,
                "tracker_runs": dict(self.tracker_runs), "done": self.done}

    @classmethod
    def from_checkpoint(cls, ckpt, mean_losses=None):
        return cls(epoch=ckpt["epoch"] + 1, batch=ckpt["batch"], last_opt_step=ckpt["last_opt_step"],
                   best_fitness=ckpt["best_fitness"], best_epoch=ckpt["best_epoch"], metrics=ckpt["metrics"],
                   mean_losses=mean_losses, tracker_runs=dict(ckpt.get("tracker_runs") or {}),  # older: none
                   done=bool(ckpt.get("done")))


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
    def checkpoint(trainer, state, ranks):
        """The checkpoint of `trainer` at `state` (rank 0 writes it), with every rank's `rank_state` in `ranks`.
        to_safe converts what weights_only loading refuses, so anything added here is stored safely."""
        return to_safe({
            **state.to_checkpoint(),
            "ranks": ranks,
            "model": model_to_ckpt(trainer.model, half=False),
            "ema": model_to_ckpt(trainer.ema.ema, half=False),
            "updates": trainer.ema.updates,
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "scaler": trainer.scaler.state_dict(),
            "opt": trainer.opt.to_dict(),
            "hyp": trainer.hyp,
            "date": datetime.now().isoformat(),
            "version": project_version(),
        })

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

    def restore(self, trainer, path):
        """Load `path` into `trainer` (model, EMA, optimizer, scheduler, scaler; this rank's RNG states) and return
        the LoopState to continue from. Every rank continues from rank 0's copy (the others may be on machines
        without it)."""
        ckpt = du.broadcast_object(load_checkpoint(path) if trainer.is_main else None)
        state = LoopState.from_checkpoint(ckpt)
        state.done = state.done or state.epoch >= trainer.epochs  # older checkpoints: the last epoch says it
        trainer.model.load_state_dict({k: v.float() for k, v in ckpt["model"]["state_dict"].items()})
        load_optimizer(trainer.optimizer, ckpt["optimizer"])
        trainer.scheduler.load_state_dict(ckpt["scheduler"])
        load_scaler(trainer.scaler, ckpt["scaler"], path)
        trainer.ema.ema.load_state_dict({k: v.float() for k, v in ckpt["ema"]["state_dict"].items()})
        trainer.ema.updates = ckpt["updates"]
        ranks = ckpt["ranks"]
        if len(ranks) == max(trainer.world_size, 1):
            mine = ranks[max(trainer.rank, 0)]
            set_rng_state(mine["rng"])
            state.mean_losses = mine["mloss"].to(trainer.device)
        else:
            LOGGER.warning(f"{path} holds the state of {len(ranks)} ranks, this run has {trainer.world_size}: "
                           f"continuing with fresh random states, from the start of epoch {state.epoch}")
            state.batch = 0  # another world size shards the epoch differently
        self.saved(state.epoch * trainer.batches_per_epoch + state.batch - 1)
        if state.done:
            LOGGER.info(f"Finishing {path}: its training is done; the final validation and the strip are left")
        else:
            LOGGER.info(f"Resuming training from {path} "
                        f"{position(state.epoch, state.batch, trainer.epochs, trainer.batches_per_epoch)}")
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
