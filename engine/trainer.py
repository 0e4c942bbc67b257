"""BaseTrainer: the one training loop shared by detection, segmentation, classification and pose.

Task subclasses (engine/tasks/*.py) override a few hooks: `get_data`, `build_model(nc, names, resumed)`,
`build_dataset(path, mode, stride)`, `build_validator()`, `preprocess_batch`, and optionally `plot_training_batch`,
`train_sampler`, `fit_model_to_data` and `predict_source`. The trainer holds its options and hyperparameters and a few
parts, each owning its state (engine/parts.py): `run` (the run folder, device, precision, ranks, the resumed
checkpoint), `data_plan` (the dataset dict, batch, loaders, validator), `optim` (the model, criterion, schedule,
optimizer, scheduler, scaler, EMA) and `state` (the loop's position, engine/checkpointer.LoopState). Hooks get what
they need as arguments or read the parts, which `_setup` builds before calling them; read-only properties name what
they read most (save_dir, data, names, nc, batch_size, model, criterion, ...). The loop itself knows nothing about
tasks or YOLO versions: the model brings its criterion (`model.init_criterion`). Checkpoints are the Checkpointer's
(engine/checkpointer.py), logging and plots are listeners of the loop's events (engine/callbacks.py), which carry
their data (`Event`): no listener reads the trainer.
"""

import dataclasses
import signal
import time
from copy import deepcopy
from pathlib import Path

import torch
from tqdm import tqdm

from data.augment import apply_hsv_batch, multi_scale
from data.labels import problems_listed_on_failure, write_problems
from data.loader import default_workers, set_loader_epoch
from engine.callbacks import Callbacks, Event
from engine.checkpointer import AGREE_EVERY, Checkpointer, EMAWeights, LoopState, Weights, sigterm_deferred
from engine.hyp import read_hyp, run_hyp
from engine.inherit import dataset_file
from engine.interrupt import StopRequests, ended_by_signals
from engine.loggers import build_loggers
from engine.messages import SCRIPTS, RunETA, banner, next_commands, plural, position, resume_command, shown
from engine.options import TrainOptions
from engine.parts import DataPlan, Optimisation, RunContext
from engine.resume import AUTO, forget_run_dir, plan_run, run_model_yaml, saved_hyp
from evaluation.charts import RunPlots
from models.checkpoints import attempt_load
from models.registry import use_modules
from utils import dist as du
from utils.autobatch import cpu_batch, cuda_auto_batch
from utils.cli import Parsed, check_imgsz
from utils.errors import Interrupted
from utils.files import yaml_save
from utils.log import LOGGER, set_logging
from utils.profiling import RunProfile
from utils.schedule import Schedule
from utils.torch_utils import (
    EarlyStopping,
    ModelEMA,
    build_optimizer,
    device_name,
    freeze_layers,
    init_seeds,
    labels_to,
    memory_format,
    memory_used,
    peak_memory,
)


class BaseTrainer:
    """Train a model; every rank runs this, rank 0 alone validates, logs and saves."""

    default_project = "runs/train"
    options = TrainOptions  # the task's options class (engine/options.py)
    task = "detect"  # the task of the heads this trainer's loss and labels fit (a head's `task`)

    def __init__(self, opt, device, resume_from=None, save_dir=None):
        """What the options and the launch environment decide (the run context); the data plan, the optimisation and
        the loop's state are built by `_setup` from the data, the model and the hyperparameters, in one place and one
        order. `save_dir` continues a known run folder (a resume, a torchrun restart); None chooses a new one."""
        opt = opt if isinstance(opt, self.options) else self.options.from_values(opt)
        workers = default_workers(device) if opt.workers is None else opt.workers
        self.opt = dataclasses.replace(opt, loader_workers=workers)
        self.hyp = {}  # read by _setup: the model's, --hyp's, or a resumed run's own
        self.run = RunContext.launch(self.opt, device, self.opt.project or self.default_project, resume_from, save_dir)
        self.data_plan = DataPlan(self.opt.batch_size // self.run.world_size)
        self.optim = None  # built by _setup, with the model
        self.state = LoopState()  # the loop's position: what a checkpoint holds of it
        self.checkpointer = Checkpointer(self.run.save_dir, self.opt.save_interval, self.opt.save_period)
        self.profile = RunProfile.for_run(self.opt.profile and self.run.is_main, device)  # --profile: rank 0's table
        # its signal handlers are set while the loop runs; under DDP the ranks share a request every AGREE_EVERY steps
        self.stop_requests = StopRequests(announce=self.run.is_main, within=AGREE_EVERY if self.run.world_size > 1
                                          else 1)
        self.eta = None  # the whole run's time left, shown in the progress bar (engine/messages.RunETA)
        self.callbacks = Callbacks()
        for listener in self.default_callbacks():
            self.callbacks.attach(listener)

    # ---------------------------------------------------------------- what the task hooks read, by its usual name
    save_dir = property(lambda self: self.run.save_dir)
    device = property(lambda self: self.run.device)
    rank = property(lambda self: self.run.rank)
    world_size = property(lambda self: self.run.world_size)
    is_main = property(lambda self: self.run.is_main)
    resume_from = property(lambda self: self.run.resume_from)
    data = property(lambda self: self.data_plan.data)
    nc = property(lambda self: self.data_plan.nc)
    names = property(lambda self: self.data_plan.names)
    batch_size = property(lambda self: self.data_plan.batch_size)  # per rank
    train_set = property(lambda self: self.data_plan.train_set)
    validator = property(lambda self: self.data_plan.validator)
    model = property(lambda self: self.optim.model)  # unwrapped
    criterion = property(lambda self: self.optim.criterion)

    # ---------------------------------------------------------------- hooks for task subclasses
    def get_data(self):
        """Return the dataset dict (train/val paths, names, nc)."""
        raise NotImplementedError

    def build_model(self, nc, names, resumed=None):
        """(model, given): the model to train for `nc` classes `names`, and the state-dict keys --weights gave it
        (None where no --weights seeded it: from scratch, or resumed, where the checkpoint restores everything).
        `resumed`: a resumed run's model YAML (engine/resume.run_model_yaml), built as it is; nothing else is read."""
        raise NotImplementedError

    def build_dataset(self, path, mode, stride):
        """The training set (mode 'train'); stride is the model's largest stride (image sizes are multiples of it).
        The validation set comes from the validator's own `build_dataset`, shared with the val scripts."""
        raise NotImplementedError

    def build_validator(self):
        """The task's validator (engine/validator.py), given the training criterion for the validation losses."""
        raise NotImplementedError

    def preprocess_batch(self, batch):
        """The batch on the device: the uint8 images as floats in [0, 1], and its labels."""
        img = batch["img"].to(self.device, non_blocking=True).float() / 255
        if "hsv" in batch:  # the colour the loader drew and left to the device (YOLODataset device_hsv)
            img = apply_hsv_batch(img, batch["hsv"].to(self.device, non_blocking=True))
        batch["img"] = img
        return labels_to(batch, self.device)

    def plot_training_batch(self, batch, step):
        """Optional: save an image of the first training batches."""

    def train_sampler(self):
        """Optional: a sampler for the training loader (--image-weights); None for the default shuffle/DDP split.
        Like those, it has `set_epoch(epoch, skip)`, `epoch` and `reads_validation` (whether an epoch's order depends
        on the validation before it)."""

    def fit_model_to_data(self):
        """Optional: adapt the model to the training set before training starts (AutoAnchor). Every rank calls it."""

    def predict_source(self):
        """The --source of the predict command a finished run suggests: the validation images."""
        val = self.data["val"]
        return shown(val if isinstance(val, (str, Path)) else val[0])

    # ---------------------------------------------------------------- callbacks (engine/callbacks.py)
    def default_callbacks(self):
        """Rank 0's listeners: unless --noplots the run's pictures, then the --loggers (results.csv, TensorBoard,
        trackers), which send those pictures on. The other ranks write and report nothing."""
        if not self.run.is_main:
            return []
        plots = not self.opt.noplots
        loggers = build_loggers(self.opt.loggers, self.run.save_dir, plots=plots, log_model=self.opt.log_model)
        return [RunPlots(), *loggers] if plots else loggers

    def run_callbacks(self, event, more=None, **data):
        """Fire `event` with its `data` (engine/callbacks.Event), and what `more()` returns where that data costs
        work, on rank 0 only unless the event is declared for every rank; listeners' time is charged to
        plotting/logging. The event is built only where it has listeners."""
        if self.callbacks.fires(event, main=self.run.is_main):
            with self.profile("plots_logs"):
                self.callbacks.fire(self.event(event, **data, **(more() if more else {})))

    def event(self, name, **data):
        """What every event tells its listeners (the run folder, the weights' paths, the position, the best fitness),
        with `data`, the event's own. `epoch` counts the finished epochs: the loop's position unless `data` says."""
        s = self.state
        return Event(name=name, save_dir=self.run.save_dir, main=self.run.is_main, **{
            "epoch": s.epoch, "batch": s.batch, "best": self.checkpointer.best, "last": self.checkpointer.last,
            "best_fitness": s.best_fitness, "best_epoch": s.best_epoch, **data})

    def _setup_event(self):
        """on_pretrain_routine_end's data: what the trackers open their run with, and what labels.jpg draws."""
        return dict(project=self.run.project, config={**self.opt.to_dict(), "hyp": dict(self.hyp)},
                    names=self.data_plan.names, labels=self.data_plan.train_set.label_arrays(), model=self.optim.model)

    def _end_event(self):
        """on_train_end's data: best.pt's metrics, and its per-class rows, which rank 0 alone holds (it merged the
        validation's shards)."""
        table = self.data_plan.validator.class_table() if self.run.is_main else ((), ())
        return dict(metrics=dict(self.state.metrics), class_table=table)

    # ---------------------------------------------------------------- set-up
    def _setup(self):
        """Build everything the loop needs, in dependency order."""
        run, plan = self.run, self.data_plan
        init_seeds(self.opt.seed + 1 + max(run.rank, 0), deterministic=self.opt.deterministic)
        self._setup_model()
        if self.opt.batch_size == -1:  # AutoBatch: a batch that fits the device, decided before the loader is built
            total = cuda_auto_batch(self.optim.train_model, self.opt.train_imgsz, run.device,
                                    autocast_dtype=run.amp_dtype if run.amp else None) \
                if run.device.type == "cuda" else cpu_batch()
            self.opt, plan.batch_size = dataclasses.replace(self.opt, batch_size=total), total
        self._setup_data()
        self._setup_optimizer()
        self.optim.ema = ModelEMA(self.optim.model)  # on every rank, which all validate with it
        self.optim.scaler = torch.amp.GradScaler(run.device.type, enabled=run.half)
        self.state = LoopState()
        if run.resume_from:  # self.state and every other component loaded in place
            self.checkpointer.restore(run.resume_from, self.components(), self.opt.epochs, plan.batches_per_epoch)
        if self.state.mean_losses is None:
            self.state.mean_losses = torch.zeros(len(self.optim.criterion.loss_names))
        self.state.mean_losses = self.state.mean_losses.to(run.device)
        if run.is_main:
            run.save_dir.mkdir(parents=True, exist_ok=True)
            yaml_save(run.save_dir / "opt.yaml", self.opt.to_dict())
            yaml_save(run.save_dir / "hyp.yaml", self.hyp)
            write_problems(run.save_dir, {"train": plan.train_set.problems,
                                          "val": plan.validator.dataloader.dataset.problems})
        run.lock_dir()  # a new run's folder exists from here

    def _setup_model(self):
        """The dataset dict, the model, the training size, the hyperparameters and the criterion."""
        run, plan = self.run, self.data_plan
        with du.torch_distributed_zero_first(run.local_rank):
            plan.data = self.get_data()  # may download or generate; rank 0 of each machine goes first
        # a resume trains the checkpoint's own model: global rank 0 reads it, as it alone reads the run folder
        resumed = du.on_main(run_model_yaml, run.resume_from, plan.names, self.opt.data) if run.resume_from else None
        with du.torch_distributed_zero_first(run.local_rank):
            model, given = self.build_model(plan.nc, plan.names, resumed)  # may download weights: one per machine
        self.opt = dataclasses.replace(self.opt, train_imgsz=check_imgsz(self.opt.imgsz, int(max(model.stride))),
                                       data_path=dataset_file(plan.data, self.opt.data))
        if given is not None:  # a resumed run keeps its own record
            self.opt = dataclasses.replace(self.opt, new_params=sorted(
                n for n, _ in model.named_parameters() if n not in given))
        saved = du.on_main(saved_hyp, run.resume_from) if run.resume_from else None  # a resume trains with its own
        self.hyp = run_hyp(model, self.opt.hyp, self.opt.label_smoothing, saved, run.resume_from)
        criterion = model.init_criterion(self.hyp, imgsz=self.opt.train_imgsz)
        freeze_layers(model, self.opt.freeze)  # before DDP wraps the model, which reduces only trainable parameters
        if run.is_main:
            model.info(imgsz=self.opt.train_imgsz)  # layers, parameters (trainable), GFLOPs at the training size
        train_model, model = du.prepare_model(model, run.device, self.opt.sync_bn, memory_format(run.device))
        self.optim = Optimisation(model, train_model, criterion)

    def _setup_data(self):
        """The training set and loader, and the validator with this rank's share of the validation set."""
        run, plan = self.run, self.data_plan
        stride = int(max(self.optim.model.stride))
        with problems_listed_on_failure(run.save_dir, "train", write=run.is_main):
            with du.torch_distributed_zero_first(run.local_rank):
                plan.train_set = self.build_dataset(plan.data["train"], "train", stride)
        self.fit_model_to_data()
        plan.build_train_loader(self.opt, run, self.train_sampler())
        # every rank validates its share of the val set (engine/validator.py), so every rank has the loader
        plan.validator = self.build_validator()
        plan.validator.profile = self.profile  # its plots are timed apart from validation
        with problems_listed_on_failure(run.save_dir, "val", {"train": plan.train_set.problems}, write=run.is_main):
            plan.validator.build_dataloader(plan.data["val"], stride)

    def _setup_optimizer(self):
        """The schedule (accumulation, scaled weight decay, optimizer choice, warmup; utils/schedule.py), the optimizer
        and the LR scheduler."""
        plan, optim = self.data_plan, self.optim
        s = optim.schedule = Schedule.plan(
            self.hyp, self.opt.optimizer, self.opt.epochs, plan.batch_size * self.run.world_size,
            len(plan.train_set), plan.batches_per_epoch, plan.nc, pretrained=bool(self.opt.weights),
            cos_lr=self.opt.cos_lr, chosen=self.opt.chosen_optimizer)
        if self.opt.optimizer == "auto":  # kept in the run's options, so that a --resume builds the same optimizer
            self.opt = dataclasses.replace(self.opt, chosen_optimizer=s.optimizer)
        optim.optimizer = build_optimizer(optim.model, s.optimizer, s.lr0, s.momentum, s.weight_decay,
                                          fused=self.run.device.type == "cuda", new=self.opt.new_params,
                                          new_lr=s.new_lr0)
        optim.scheduler = torch.optim.lr_scheduler.LambdaLR(optim.optimizer, lr_lambda=s.lr_factor)

    # ---------------------------------------------------------------- checkpoints (engine/checkpointer.py)
    def components(self, state=None):
        """What a checkpoint holds of this run, by name: the loop's `state` (this run's unless given), the model, its
        EMA, the optimizer, LR scheduler and AMP scaler and the listeners' states (engine/callbacks.py), each saving
        and loading its own; the options and hyperparameters as a record."""
        o = self.optim
        return {"loop": self.state if state is None else state, "model": Weights(o.model), "ema": EMAWeights(o.ema),
                "optimizer": o.optimizer, "scheduler": o.scheduler, "scaler": o.scaler, "opt": self.opt.to_dict(),
                "hyp": self.hyp, **self.callbacks.components()}

    def save_position(self, epoch, batch):
        """last.pt after `batch` batches of `epoch` (0: at its start); every rank takes part (each one's RNG states
        go to rank 0)."""
        with sigterm_deferred(), self.profile("checkpoints"):
            ranks = du.gather_objects(self.checkpointer.rank_state(self.state))
            if self.run.is_main:
                state = dataclasses.replace(self.state, epoch=epoch, batch=batch)
                self.checkpointer.save_last(self.checkpointer.checkpoint(self.components(state), ranks))
            du.barrier()  # the checkpoint is on disk before any rank goes on (and may die)
        self.checkpointer.saved(batch - 1 + self.data_plan.batches_per_epoch * epoch)

    def interrupted(self, epoch, batch):
        """Stop on request, last.pt holding `batch` batches of `epoch` (written by the caller; at an epoch's start
        under --nosave, here). Rank 0 says how to resume; every rank leaves with the signal's exit status."""
        if not batch and self.opt.nosave:
            self.save_position(epoch, 0)
        if self.run.is_main:
            forget_run_dir()  # the user stopped the run: no torchrun restart is to continue it
            where = position(epoch, batch, self.opt.epochs, self.data_plan.batches_per_epoch)
            LOGGER.info(f"interrupted {where}: resume with "
                        f"{resume_command(self.checkpointer.last, self.opt.resume == AUTO)}")
        raise Interrupted(self.stop_requests.signum or signal.SIGINT)

    def log_banner(self):
        """One line on rank 0, before any work, saying what runs: devices, precision and why, torch, processes,
        threads, workers and the run folder. Every rank names its device (a collective)."""
        device = self.run.device
        kind = {"cuda": "GPU", "cpu": "CPU"}.get(device.type, device.type)
        devices = du.gather_objects(f"{kind} {device_name(device)}")
        if self.run.is_main:
            LOGGER.info(banner(devices, device, self.opt.amp, self.opt.loader_workers, self.run.save_dir))

    # ---------------------------------------------------------------- the loop
    def train(self):
        """Set up, train, validate best.pt and finish the checkpoints. However the run ends early (a stop request, a
        signal, an error), the listeners hear it (`on_train_interrupted`, `on_train_failed`: trackers close their
        run as killed or failed) and the run folder is unlocked."""
        try:
            with ended_by_signals():
                return self._train()
        except BaseException as e:
            self.run_callbacks("on_train_interrupted" if isinstance(e, (Interrupted, KeyboardInterrupt))
                               else "on_train_failed")
            raise
        finally:
            self.run.lock.release()

    def _train(self):
        self.log_banner()
        with self.profile("setup"):
            self._setup()
        first, n = self.state.epoch, self.data_plan.batches_per_epoch
        try:
            if not self.state.done:  # a run killed in its final validation: --resume only finishes it
                self.load_ahead(first, self.state.batch)  # with workers it loads while the listeners start
            self.run_callbacks("on_pretrain_routine_end", more=self._setup_event)
            self.run_callbacks("on_train_start")
            if self.run.is_main:
                LOGGER.info(f"Image sizes {self.opt.train_imgsz} train, {self.opt.train_imgsz} val; {n} batches of "
                            f"{self.data_plan.batch_size} per rank x {self.run.world_size} ranks; accumulate "
                            f"{self.optim.schedule.accumulate}")
            t0 = time.time()
            self.eta = RunETA(self.opt.epochs, n, first * n + self.state.batch)
            with self.stop_requests:
                self.epochs_from(first)
        finally:
            self.data_plan.train_loader.stop_loading()  # an epoch loaded ahead that will not run: a stop, an error
        if self.run.is_main and self.state.epoch > first:
            LOGGER.info(f"{plural(self.state.epoch - first, 'epoch')} completed in {(time.time() - t0) / 3600:.3f} "
                        "hours.")
        self.final_eval()
        if self.run.is_main:
            forget_run_dir()
        du.barrier()
        # the trackers close their run: until then --resume finishes this one
        self.run_callbacks("on_train_end", more=self._end_event)
        if self.run.is_main:
            self.finish_run()
        self.profile.report(self.run.save_dir)
        return self.state.metrics

    def epochs_from(self, first):
        """Train, validate and save epoch after epoch from `first`, until the last, a stop decision or a stop request
        (which raises Interrupted); none when the run's epochs are done (`state.done`)."""
        for epoch in range(first, self.opt.epochs if not self.state.done else first):
            with self.profile("train_loop"):
                done = self.train_epoch(epoch)
            self.log_peak_memory(f"training epoch {epoch + 1}")
            if done:
                self.interrupted(epoch, done)
            if not self.data_plan.train_loader.sampler.reads_validation:  # --image-weights: its order waits for it
                self.load_ahead(epoch + 1)
            stop = self.end_epoch(epoch)
            # every rank must leave the loop together, or the ones that stay block forever in the next collective
            if du.broadcast_object(stop):
                break
            if epoch + 1 < self.opt.epochs and self.stop_requests.agreed():  # last.pt was written by end_epoch
                self.interrupted(epoch + 1, 0)

    def train_epoch(self, epoch):
        """Epoch `epoch`, from batch `state.batch` (a run resumed inside it). Returns the batches done when it stopped
        on request (Ctrl-C) after writing last.pt; else None, the epoch's mean losses over every rank and its learning
        rates kept in the state, and the LR scheduler stepped."""
        start, n, optim = self.state.batch, self.data_plan.batches_per_epoch, self.optim
        self._start_epoch(epoch, start)
        batches = enumerate(self.profile.timed(self.data_plan.train_loader, "data_wait"), start)
        bar = self._progress_bar(batches, start) if self.run.is_main else batches
        optim.optimizer.zero_grad()
        for i, batch in bar:
            step = i + n * epoch  # global batch number
            if step <= optim.schedule.warmup_iters:
                optim.schedule.warmup(optim.optimizer, step, epoch)
            batch = self.multi_scale(self.preprocess_batch(batch), step)
            step_now = step - self.state.last_opt_step >= optim.schedule.accumulate_at(step)
            with self.profile("forward_backward", items=len(batch["img"]) * self.run.world_size):  # all ranks' images
                _, items = optim.forward_backward(batch, self.run, sync=step_now)
            self.state.mean_losses = (self.state.mean_losses * i + items) / (i + 1)
            self.state.batch = i + 1
            if step_now and self._step(epoch, i + 1, step):
                if self.run.is_main:
                    bar.close()
                return i + 1
            if self.run.is_main:
                self._show_progress(bar, batch, epoch, step)
                self.run_callbacks("on_train_batch_end")
        if self.run.is_main:
            bar.close()  # before any message, which would otherwise share the bar's line
        names = optim.criterion.loss_names
        self.state.losses = {f"train/{k}_loss": float(v) for k, v in
                             zip(names, du.all_reduce_mean(self.state.mean_losses))}
        self.state.learning_rates = optim.learning_rates()
        optim.scheduler.step()

    def _start_epoch(self, epoch, start):
        """Train mode, the epoch's data (the loader goes on with what `load_ahead` started), the running mean
        reset."""
        self.optim.train_model.train()
        self._epoch_data(epoch, start)
        if not start:
            self.state.mean_losses = torch.zeros(len(self.optim.criterion.loss_names), device=self.run.device)

    def _epoch_data(self, epoch, start=0):
        """Mosaic closed for the last epochs; the loader set to the epoch from batch `start` on: the order, the
        augmentations and the worker seeds of the epoch, from (seed, epoch, rank) alone."""
        train_set, schedule = self.data_plan.train_set, self.optim.schedule
        if schedule.mosaic_closed(epoch) and getattr(train_set, "mosaic", False):
            LOGGER.info(f"Closing mosaic from epoch {epoch + 1}/{self.opt.epochs} on (close_mosaic: "
                        f"{schedule.close_mosaic} epochs)")
            train_set.close_mosaic()
        set_loader_epoch(self.data_plan.train_loader, epoch, start)

    def load_ahead(self, epoch, start=0):
        """Set up `epoch`'s data from batch `start` and start loading it now, so that its workers start and each
        loads a group while the loop does other work: the listeners' start (label plots, the model's graph) before the
        first epoch, the validation and checkpoints before the others. Otherwise the epoch's first batch waits for new
        workers to load a whole group (data/loader.GroupedLoader). The batches are the same: they depend on
        (seed, epoch, rank) alone. Not after the last epoch, nor without workers (nothing would run beside the loop)."""
        if epoch < self.opt.epochs and self.data_plan.train_loader.num_workers:
            self._epoch_data(epoch, start)
            self.data_plan.train_loader.load_ahead()

    def _step(self, epoch, done, step):
        """The optimizer step after `done` batches of `epoch`; then last.pt if due. Returns whether to stop (a stop
        request). Decided only right after a step, so no accumulated gradient is lost with the process; the epoch's
        last step is followed by end_epoch's checkpoint."""
        with self.profile("optimizer_step"):
            self.optim.step()
        self.state.last_opt_step = step
        if done == self.data_plan.batches_per_epoch:
            return False
        stop, save = self.checkpointer.due(step, self.stop_requests.signum is not None, self.run.is_main)
        if save:
            self.save_position(epoch, done)
        return stop

    def _progress_bar(self, batches, start):
        names = self.optim.criterion.loss_names
        LOGGER.info(("\n" + "%11s" * (4 + len(names))) % ("Epoch", "mem", *names, "Instances", "Size"))
        return tqdm(batches, total=self.data_plan.batches_per_epoch, initial=start,
                    bar_format="{l_bar}{bar:10}{r_bar}")

    def _show_progress(self, bar, batch, epoch, step):
        """The progress bar's line and the first batches' pictures (rank 0)."""
        with self.profile("plots_logs"):
            mem = f"{memory_used(self.run.device):.3g}GiB"  # GPU memory reserved, or this process's RSS
            n_inst = len(batch["targets"]) if "targets" in batch else len(batch["img"])
            losses = self.state.mean_losses.tolist()  # one read from the device (one per value formatted from it)
            bar.set_description(
                ("%11s" * 2 + "%11.4g" * (2 + len(losses)))
                % (f"{epoch + 1}/{self.opt.epochs}", mem, *losses, n_inst, batch["img"].shape[-1])
            )
            bar.set_postfix_str(self.eta.text(step + 1), refresh=False)  # the bar's own ETA is the epoch's
            if not self.opt.noplots:
                self.plot_training_batch(batch, step)

    def multi_scale(self, batch, step):
        """--multi-scale: global batch `step`'s images resized by `data.augment.multi_scale`, which draws the
        same size on every rank without communicating, so no rank waits on a larger batch."""
        if self.opt.multi_scale:
            batch["img"] = multi_scale(batch["img"], self.opt.train_imgsz, int(self.optim.model.stride.max()),
                                       f"{self.opt.seed}-{step}")
            if "targets" in batch:  # normalised labels keep their values on the resized canvas
                batch["targets"] = batch["targets"].on_canvas(batch["img"].shape[2:])
        return batch

    def end_epoch(self, epoch):
        """Every rank validates its share; rank 0 logs and saves while the others wait at the barrier. Returns the
        stop decision; the state then points at the next epoch."""
        stop = False
        ranks = du.gather_objects(self.checkpointer.rank_state(self.state))  # for the checkpoint
        final = epoch + 1 == self.opt.epochs
        self.run_callbacks("on_train_epoch_end", epoch=epoch + 1, losses=dict(self.state.losses))
        if not self.opt.noval or final:
            # rank 0's EMA: the ranks' EMA parameters agree, their BatchNorm buffers (each rank's own statistics) not
            with self.profile("validation"):
                self.state.metrics = self.data_plan.validator(du.broadcast_state(self.optim.ema.ema),
                                                              amp_dtype=self.run.amp_dtype if self.run.amp else None)
            self.log_peak_memory(f"validation {epoch + 1}")
            self.run_callbacks("on_val_end", epoch=epoch + 1, metrics=dict(self.state.metrics))
        if self.run.is_main:
            stop = self._log_and_save(epoch, final, ranks)
        du.barrier()
        self.state.epoch, self.state.batch = epoch + 1, 0
        return stop

    def log_peak_memory(self, what):
        """On CUDA, rank 0's line of the GPU memory torch's allocator peaked at during `what` (counted from the last
        such line: each epoch's training, each validation and the final one get their own)."""
        peaks = peak_memory(self.run.device, reset=True)
        if peaks and self.run.is_main:
            LOGGER.info(f"GPU memory peak in {what}: {peaks[0]:.2f} GiB allocated, {peaks[1]:.2f} GiB reserved")

    def _log_and_save(self, epoch, final, ranks):
        """Rank 0 at an epoch's end: fitness, early stopping, the epoch's row, the checkpoints. Returns the stop."""
        s = self.state
        fitness = s.metrics.get("fitness", 0.0)
        improved = fitness >= s.best_fitness
        # the stopper's best is the state's: one made from the state each epoch decides as one kept through the run
        stopper = EarlyStopping(self.opt.patience, s.best_fitness, s.best_epoch)
        stop = stopper(epoch, fitness)
        s.best_fitness, s.best_epoch = max(s.best_fitness, fitness), stopper.best_epoch
        metrics = {k: float(v) for k, v in s.metrics.items()}
        row = {**s.losses, **metrics, **s.learning_rates}
        done = dict(epoch=epoch + 1, batch=0)
        if not self.opt.nosave or final:
            with sigterm_deferred(), self.profile("checkpoints"):
                # done: what is left of the run is the final validation and the strip, which --resume then does
                after = dataclasses.replace(s, **done, done=final or stop)
                self.checkpointer.save(self.checkpointer.checkpoint(self.components(after), ranks), epoch, improved)
            self.run_callbacks("on_model_save", **done, improved=improved)
        self.run_callbacks("on_fit_epoch_end", **done, row=row, metrics=metrics)
        return stop

    def final_eval(self):
        """Rank 0 strips the optimizer from best.pt; then every rank validates best.pt once more, with per-class
        output. last.pt keeps the whole state until `finish_run`, so a run killed here is finished by --resume.
        Rank 0 reads the file and sends the weights: the other ranks may run on other machines. The model is the one
        val.py validates (fused, in the device's layout), so that both report the same mAP: an fp16 run's in fp16, as
        `val.py --half` (in fp32 it would take twice the memory of training's validations), any other in fp32."""
        best, run = self.checkpointer.best, self.run
        if run.is_main:
            with self.profile("checkpoints"):
                self.checkpointer.finish_best()
        if du.broadcast_object(best.exists()):
            LOGGER.info(f"\nValidating {best}...")
            with self.profile("validation"):
                model = attempt_load(best, device=run.device) if run.is_main else deepcopy(self.optim.ema.ema).fuse()
                model.to(memory_format=memory_format(run.device))
                self.state.metrics = self.data_plan.validator(du.broadcast_state(model), final=True, half=run.half)
            self.log_peak_memory("the final validation")
            self.run_callbacks("on_val_end", metrics=dict(self.state.metrics))

    def finish_run(self):
        """Rank 0, once the listeners heard the end: last.pt is stripped, which ends the run, and the next commands
        are said (with --half where the final validation ran in fp16, as final_eval decides)."""
        best = self.checkpointer.best
        with self.profile("checkpoints"):
            self.checkpointer.finish_last()
        LOGGER.info(f"Results saved to {self.run.save_dir}")
        if best.exists():
            scripts = SCRIPTS[self.task]["val"], SCRIPTS[self.task]["predict"]
            commands = next_commands(scripts, best, self.opt.data, self.predict_source(), self.opt.train_imgsz,
                                     self.run.half)
            for i, command in enumerate(commands):
                LOGGER.info(f"{'Next:' if i == 0 else '':<6}{command}")


def run(trainer_cls, opt, callbacks=None, given=()):
    """Entry point shared by every task's train.py: device, process group, resume, train, clean exit.

    `opt`: a train script's parsed command line (utils/cli.Parsed: its options, typed here once, and the names it
    gave, which --resume may refuse), or the task's options with the names its caller gave in `given`. `callbacks`:
    listener objects with `on_<event>` methods, or a dict {event: [functions taking the event]}, added after the
    default ones (engine/callbacks.py names the events and what each carries). Under torchrun, a restarted worker
    group continues the run it belongs to (engine/resume.py).
    """
    set_logging(du.get_rank())
    if isinstance(opt, Parsed):
        opt, given = opt
    if not isinstance(opt, TrainOptions):
        opt = trainer_cls.options.from_values(opt)
    if opt.hyp:  # checked before any work (the options were, by the parser)
        read_hyp(opt.hyp)
    use_modules(opt.modules)  # before any model is built or checkpoint read, on every rank
    device = du.select_device(opt.device, opt.batch_size)
    with du.session(device):
        # rank 0 reads the disk and decides; a user error there is raised on every rank
        opt, resume_from, save_dir = du.on_main(plan_run, opt, trainer_cls.default_project, given, trainer_cls.options,
                                                    trainer_cls.task)
        trainer = trainer_cls(opt, device, resume_from=resume_from, save_dir=save_dir)
        trainer.callbacks.extend(callbacks)
        metrics = trainer.train()
    return trainer, metrics
