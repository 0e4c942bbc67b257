"""The parts a training run is made of, each owning its own state (engine/trainer.py holds one of each):

- `RunContext`: where and how this process trains: its run folder and the lock on it, the device and precision, its
  rank among the others, the run it resumes;
- `DataPlan`: what it trains and validates on: the dataset dict, the per-rank batch, the training set and loader,
  the validator with its share of the validation set;
- `Optimisation`: what is trained and how it is updated: the model (unwrapped, and as DDP wraps it), its criterion,
  the schedule (accumulation, warmup, LR), the optimizer, LR scheduler, AMP scaler and EMA.

The loop's own position is `engine.checkpointer.LoopState`; the events the loop fires carry what listeners read
(engine/callbacks.Event), so no listener reads a part.
"""

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from data.loader import build_dataloader, dropped_batch_warning
from engine.resume import run_dir
from engine.run_lock import RunLock, busy
from utils import dist as du
from utils.errors import BadOption
from utils.log import LOGGER
from utils.torch_utils import amp_settings, to_float32


@dataclasses.dataclass(frozen=True)
class RunContext:
    """This process's run, fixed once the trainer is made (engine/trainer.BaseTrainer.__init__): every rank agrees
    on it before any work, so nothing may change it later."""

    save_dir: Path  # the run folder, agreed on by every rank
    device: torch.device
    rank: int  # global rank, -1 outside torchrun
    local_rank: int
    world_size: int
    amp: bool  # autocast in training, with `amp_dtype` (utils/torch_utils.amp_settings)
    amp_dtype: Optional[torch.dtype]
    project: str  # --project as given, or the task's default: what trackers call the project
    resume_from: Optional[Path] = None  # the last.pt this run continues (None: a new run)
    lock: Optional[RunLock] = None  # held by rank 0 while it trains in the folder (engine/run_lock.py)

    @classmethod
    def launch(cls, opt, device, project, resume_from, save_dir):
        """This process's context, its run folder locked: its ranks (the batch must split among them), the precision
        --amp asks of `device`, and the folder, `save_dir` where the run is known (a resume, a torchrun restart), else
        a new one under `project` (engine/resume.run_dir)."""
        rank, local_rank, world_size = du.get_rank(), du.get_local_rank(), du.get_world_size()
        if opt.batch_size == -1 and world_size > 1:
            raise BadOption("--batch-size -1 (AutoBatch) sizes one GPU's batch: give the total batch under torchrun")
        if opt.batch_size % world_size:
            raise BadOption(f"--batch-size {opt.batch_size} must be a multiple of WORLD_SIZE {world_size}")
        save_dir = run_dir(Path(project) / opt.name, opt.exist_ok, save_dir, rank in (-1, 0))
        amp, amp_dtype = amp_settings(device, opt.amp)
        run = cls(save_dir, device, rank, local_rank, world_size, amp, amp_dtype, str(project), resume_from,
                  RunLock(save_dir))
        run.lock_dir()
        return run

    @property
    def is_main(self):
        return self.rank in (-1, 0)

    @property
    def half(self):
        """Whether training runs in fp16, which the final validation and the suggested commands then use too."""
        return self.amp and self.amp_dtype == torch.float16

    def lock_dir(self):
        """Rank 0 locks the run folder once it exists; every rank refuses a folder another process trains in."""
        held_by = self.lock.holder() if self.is_main and self.save_dir.is_dir() else None
        held_by = du.broadcast_object(held_by)
        if held_by:
            raise busy(self.save_dir, held_by)


@dataclasses.dataclass
class DataPlan:
    """The data of a run, built in set-up's order: the dataset dict, then the training set and loader, then the
    validator (every rank validates its share of the validation set, engine/validator.py)."""

    batch_size: int  # per rank
    data: dict = dataclasses.field(default_factory=dict)  # train/val paths, names, nc (a task's get_data)
    train_set: Any = None
    train_loader: Any = None
    # this rank's batches in a whole epoch, counted when the loader is built: the loader's len() is what is left of
    # the epoch it is set to (a run resumed inside one starts there)
    batches_per_epoch: int = 0
    validator: Any = None

    def build_train_loader(self, opt, run, sampler=None):
        """The training loader of this rank's share, `sampler` a task's own (--image-weights) or None for the
        default shuffle; a last batch of one image is left out (BatchNorm cannot train on it), with a warning."""
        self.train_loader = build_dataloader(
            self.train_set, self.batch_size, opt.loader_workers, shuffle=True, rank=run.rank,
            world_size=run.world_size, seed=opt.seed, sampler=sampler, drop_single=True,
        )
        self.batches_per_epoch = len(self.train_loader)
        if self.train_loader.drop_last and run.is_main:
            LOGGER.warning(dropped_batch_warning(self.train_loader, self.batch_size))

    @property
    def nc(self):
        return self.data.get("nc", 0)

    @property
    def names(self):
        return self.data.get("names", {})


@dataclasses.dataclass
class Optimisation:
    """The model being trained and everything that updates it."""

    model: nn.Module  # unwrapped: EMA, saving and validation read it
    train_model: nn.Module  # what DDP wraps (the model itself in one process)
    criterion: Any  # the model's own (model.init_criterion)
    schedule: Any = None  # utils/schedule.Schedule: accumulation, scaled weight decay, warmup, LR factor
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None  # torch.amp.GradScaler, enabled for fp16 only
    ema: Any = None  # utils/torch_utils.ModelEMA, on every rank (each validates with it)

    def forward_backward(self, batch, run, sync=True):
        """One micro-step, in the precision of `run` (a RunContext). On accumulation steps DDP skips the gradient
        all-reduce (no_sync); the step that updates reduces the gradients accumulated so far in one go."""
        ddp = isinstance(self.train_model, nn.parallel.DistributedDataParallel)
        ctx = self.train_model.no_sync() if ddp and not sync else contextlib.nullcontext()
        with ctx:
            with torch.autocast(run.device.type, dtype=run.amp_dtype, enabled=run.amp):
                preds = self.train_model(batch["img"])
            loss, items = self.criterion(to_float32(preds), batch)
            # the criterion returns a sum over this rank's images; DDP averages gradients over ranks, so scale by
            # WORLD_SIZE to make the update the sum over the global batch, the same as one process would compute
            loss = loss * run.world_size
            self.scaler.scale(loss).backward()
        return loss.detach(), items.detach()

    def step(self):
        """The optimizer step on the gradients accumulated so far (clipped), then the EMA."""
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=10.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        self.ema.update(self.model)

    def learning_rates(self):
        """{results.csv column: lr} of each parameter group."""
        return {f"lr/pg{j}": g["lr"] for j, g in enumerate(self.optimizer.param_groups)}
