"""BaseValidator: the one evaluation path, for per-epoch validation in the trainer and for the stand-alone val scripts.

Under DDP every rank validates a disjoint share of whole batches (`ShardedBatchSampler`) and keeps one record per
batch (matches, confidences, classes, losses, COCO JSON rows); rank 0 gathers the records, puts them back in batch
order and computes the metrics from them. Each batch holds the same images at the same letterbox shape as in a
single process, so the model sees the same tensors and the metrics come out identical to one process.

The task's validator (engine/tasks: a family's class bound to the task's record) implements `get_data`,
`build_dataset`, `init_metrics`, `postprocess` (the batch's predictions, one record per image holding what the later
steps need), `update_metrics` (returns the batch's record of matches), `get_stats` (from the merged records) and
`print_results`. What a batch is (e.g. how its masks read) travels in the
batch dict; nothing per batch is kept on the validator between these calls.
"""

import contextlib
import dataclasses
import math
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler
from tqdm import tqdm

from data.labels import problems_listed_on_failure, write_problems
from data.loader import loader_workers, seed_worker
from engine.eval_memory import settle_batch
from engine.inherit import run_values
from engine.messages import check_task
from engine.options import ValOptions
from models.backend import InferenceBackend, static_input, validation_model
from models.checkpoints import check_class_ids
from models.registry import use_modules
from utils import dist as du
from utils.errors import BadCheckpoint
from utils.files import increment_path
from utils.log import LOGGER, set_logging
from utils.profiling import RunProfile
from utils.torch_utils import labels_to, memory_format, time_sync, to_float32

LOSS_LABELS = ("targets",)  # what the criterion reads of a batch whose labels stay on the CPU


class ShardedBatchSampler(Sampler):
    """Batches of consecutive dataset indices, as a single process makes them; rank r of W takes batches r, r + W, ...

    Whole batches, not images, are dealt out, so a rect dataset's per-batch letterbox shape stays what it is in one
    process; every image is in exactly one batch of one rank, also when the count does not divide. `batch_ids` are
    the global numbers of this rank's batches, in the order they are yielded.
    """

    def __init__(self, n, batch_size, rank=-1, world_size=1):
        n_batches = math.ceil(n / batch_size)
        self.n, self.batch_size = n, batch_size
        self.batch_ids = list(range(max(rank, 0), n_batches, max(world_size, 1)))

    def __iter__(self):
        for b in self.batch_ids:
            yield list(range(b * self.batch_size, min((b + 1) * self.batch_size, self.n)))

    def __len__(self):
        return len(self.batch_ids)


class BaseValidator:
    """Validate a model on this rank's share of a dataset; rank 0 merges the shares and reports.

    Called as `validator(model, final=...)` with a plain (unwrapped) module that every rank holds identically.
    With a `criterion` (training), the loss of each batch is computed too and reported as `val/<name>_loss`.
    `label_names`: the classes the label files are read with ({id: name}), when they differ from `names`
    (--single-cls); `label_nc` is their count.
    """

    postprocess_name = "post-process"
    tasks = ()  # the tasks of the models whose output it reads (a head's `task`): the task record's (engine/tasks)
    profile = RunProfile(enabled=False)  # the trainer's, under --profile
    options = ValOptions  # the task's options class (engine/options.py), its extras its own fields

    def __init__(self, args, save_dir, names, criterion=None, label_names=None):
        self.args = args
        self.save_dir = Path(save_dir)
        self.names = dict(names) if not isinstance(names, dict) else names
        self.nc = len(self.names)
        self.label_names = label_names or self.names
        self.label_nc = len(self.label_names)
        self.criterion = criterion
        self.dataloader = None
        self.speed = {"preprocess": 0.0, "inference": 0.0, "postprocess": 0.0}
        self.seen = 0
        self.metrics = self.confusion = None  # a validation's, made by init_metrics

    # ---------------------------------------------------------------- hooks for task subclasses
    @staticmethod
    def get_data(data, options):
        """The dataset dict (paths per split, names, nc) for a --data argument."""
        raise NotImplementedError

    def build_dataset(self, path, stride, rect=True):
        """The validation dataset at `path` (the same for training and the val scripts); stride: the model's largest;
        `rect`: each batch letterboxed to its own rectangle, else every image to the square --imgsz (what a static
        export takes)."""
        raise NotImplementedError

    def init_metrics(self, model):
        raise NotImplementedError

    def postprocess(self, preds, batch):
        """The eval output of a batch -> its predictions, one record per image."""
        raise NotImplementedError

    def loss_inputs(self, preds):
        """What the training criterion takes, from the eval-mode output."""
        raise NotImplementedError

    def update_metrics(self, preds, batch):
        """Return this batch's record: a dict of lists (one entry per image or per batch), merged in batch order."""
        raise NotImplementedError

    def get_stats(self, records):
        """The results dict (with 'fitness') from the merged records {key: list}."""
        raise NotImplementedError

    def print_results(self, final=False):
        raise NotImplementedError

    def class_table(self):
        """(columns, rows) of the last validation per class, as the final one prints them; ([], []) where there is
        none. Rank 0 (it merged the shards). Trackers send it at the end of training."""
        return [], []

    def plot_val_batch(self, batch, preds, bi):
        """Optional: save val_batch{bi}_labels.jpg and val_batch{bi}_pred.jpg."""

    def plot_metrics(self):
        """Optional: save the run's metric charts (curves, confusion matrices) to save_dir."""

    def finalize(self, stats):
        """Hook on rank 0 after the stats (e.g. COCO JSON evaluation); may update and return them."""
        return stats

    def merge_shards(self, shards):
        """Combine what is not per batch (rank 0): the confusion matrices are counts, so they add up."""
        if self.confusion is not None:
            self.confusion.matrix = sum(s["confusion"] for s in shards)

    def preprocess(self, batch, device, half):
        """The images (and masks, which are matched on the device) on `device`. The labels stay on the CPU, where
        each image's matching reads them after one copy of its predictions; the loss takes its own (`_loss`)."""
        batch["img"] = batch["img"].to(device, non_blocking=True)
        batch["img"] = (batch["img"].half() if half else batch["img"].float()) / 255
        batch["img"] = batch["img"].contiguous(memory_format=memory_format(device))  # the layout the model has
        return labels_to(batch, device, ("masks", "cls"))

    # ---------------------------------------------------------------- data
    def build_dataloader(self, path, stride, rect=True):
        """This rank's share of the dataset at `path`, in whole batches (see ShardedBatchSampler); `rect`: as
        build_dataset's."""
        with du.torch_distributed_zero_first(du.get_local_rank()):  # one rank per machine writes the label cache
            dataset = self.build_dataset(path, stride, rect)
        sampler = ShardedBatchSampler(len(dataset), self.args.batch, du.get_rank(), du.get_world_size())
        n_workers = loader_workers(self.args.workers, self.args.batch)
        self.dataloader = DataLoader(dataset, batch_sampler=sampler, num_workers=n_workers, worker_init_fn=seed_worker,
                                     collate_fn=getattr(dataset, "collate_fn", None), persistent_workers=n_workers > 0,
                                     pin_memory=torch.cuda.is_available())
        return self.dataloader

    # ---------------------------------------------------------------- the loop
    @torch.no_grad()
    def __call__(self, model, final=False, amp_dtype=None, half=None):
        """Evaluate `model` on every rank; returns the same results dict on every rank.

        `amp_dtype`: the training's autocast dtype, for the per-epoch validations inside training (the official
        trainers validate in half precision there too); the heads decode boxes in fp32 and NMS, losses and metrics
        take fp32 outputs. The final validation and the val scripts run the model in full precision, or in fp16 with
        `half` (None: --half, which a CPU ignores), as the trainer's final validation of an fp16 run does."""
        device = next(model.parameters()).device
        half = self.args.half and device.type == "cuda" if half is None else half
        training = model.training
        model.eval()
        if half:
            model.half()
        self.init_metrics(model)
        plots = final and self.args.plots  # the final or stand-alone run, not each epoch
        records, dt = self._run(model, device, half, plots, amp_dtype)
        if half:
            model.float()
        model.train(training)
        self.speed = {k: v * 1e3 / max(self.seen, 1) for k, v in zip(self.speed, dt)}  # this rank's images
        stats = None
        merged = self._gather(records)
        if merged is not None:  # rank 0
            stats = self.get_stats(merged)
            stats.update(self._losses(merged))
            stats = self.finalize(stats)
            self.print_results(final=final)
            if plots:
                with self.profile("plots_logs"):
                    self.plot_metrics()
        return du.broadcast_object(stats)

    def _run(self, model, device, half, plots, amp_dtype=None):
        """Run this rank's batches; returns [(global batch number, record)] and the time per stage. With plots, the
        rank that holds one of the first 3 batches draws it."""
        self.seen, records, dt = 0, [], [0.0, 0.0, 0.0]
        bar = self.dataloader
        if du.is_main_process():
            bar = tqdm(bar, desc=self.description(), bar_format="{l_bar}{bar:10}{r_bar}")
        for b, batch in zip(self.dataloader.batch_sampler.batch_ids, bar):
            t0 = time_sync()
            batch = self.preprocess(batch, device, half)
            t1 = time_sync()
            with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext():
                preds = to_float32(model(batch["img"]))  # losses, NMS and metrics take fp32 (autocast, --half)
            t2 = time_sync()
            loss = self._loss(preds, batch)
            preds = self.postprocess(preds, batch)
            t3 = time_sync()
            record = self.update_metrics(preds, batch)
            if loss is not None:
                record["loss"] = [loss]
            records.append((b, record))
            if plots and b < 3:
                with self.profile("plots_logs"):
                    self.plot_val_batch(batch, preds, b)
            dt[0], dt[1], dt[2] = dt[0] + t1 - t0, dt[1] + t2 - t1, dt[2] + t3 - t2
        return records, dt

    def _loss(self, preds, batch):
        """The training criterion's loss items of one batch (from the fp32 outputs `_run` made; on the CPU), or None
        without a criterion."""
        if self.criterion is None:
            return None
        device = batch["img"].device
        labels = labels_to(dict(batch), device, LOSS_LABELS)  # a copy: the batch's own labels stay on the CPU
        return self.criterion(self.loss_inputs(preds), labels)[1].detach().cpu().double()

    def _gather(self, records):
        """Every rank's records on rank 0, merged in batch order: {key: list}, as one process would have them.
        None on the other ranks."""
        shard = {"records": records, "seen": self.seen}
        if self.confusion is not None:
            shard["confusion"] = self.confusion.matrix
        shards = du.gather_objects(shard)
        if shards is None:
            return None
        self.seen = sum(s["seen"] for s in shards)
        self.merge_shards(shards)
        ordered = sorted((r for s in shards for r in s["records"]), key=lambda r: r[0])
        merged = {}
        for _, record in ordered:
            for k, v in record.items():
                merged.setdefault(k, []).extend(v)
        return merged

    def _losses(self, merged):
        """Mean of the per-batch loss items over all batches, as the official validators report it."""
        if "loss" not in merged:
            return {}
        mean = torch.stack(merged["loss"]).mean(0)
        return {f"val/{n}_loss": float(v) for n, v in zip(self.criterion.loss_names, mean)}

    def description(self):
        return "validating"

    def print_speed(self, shape):
        s = self.speed
        LOGGER.info(
            f"Speed: {s['preprocess']:.1f}ms pre-process, {s['inference']:.1f}ms inference, "
            f"{s['postprocess']:.1f}ms {self.postprocess_name} per image at shape {tuple(shape)}"
        )

    # ---------------------------------------------------------------- stand-alone (the val scripts)
    @staticmethod
    def split_path(data, split):
        return data["test"] if split == "test" and data.get("test") else data["val"]

    @classmethod
    def val_names(cls, data, model, options):
        """The names a val script reports under: the dataset's, which must count the model's classes and name none
        of them under another id (ids are scored, so such a class would be scored against another)."""
        if data["nc"] != model.nc:
            raise BadCheckpoint(f"--weights {options.weights} predicts {model.nc} classes but --data {options.data} "
                                f"has {data['nc']}")
        check_class_ids(model.names, data["names"], f"--weights {options.weights}", f"--data {options.data}",
                        "validate on data")
        return data["names"]

    @classmethod
    def adapt_to_weights(cls, model, stride, options):
        """Hook for the val scripts: the model and options to validate with, given the loaded weights' stride."""
        return model, options

    @classmethod
    def run_val(cls, opt):
        """Validate a weights file, as `val.py`, `segment/val.py`, `classify/val.py` and `pose/val.py` do (`opt`: the
        script's parsed command line, read once into the task's options); under torchrun every rank validates its
        share."""
        set_logging(du.get_rank())
        options = cls.options.from_cli(opt)
        use_modules(options.modules)
        device = du.select_device(options.device)
        with du.session(device):
            backend = InferenceBackend(options.weights, device=device)
            options = dataclasses.replace(options, **run_values(options, backend.run))
            options = dataclasses.replace(options, **static_input(backend, options.imgsz, options.batch))
            model, stride, task = validation_model(backend, options.imgsz)
            check_task(task, cls.tasks, f"--weights {options.weights}", "val")
            model, options = cls.adapt_to_weights(model, stride, options)
            # the batch its memory allows at this size (a run record may give up to 4096 px), decided by rank 0
            batch = du.on_main(lambda: settle_batch(model, options.imgsz, options.batch, device,
                                                    f"--weights {options.weights}", getattr(options, "max_det", 0)))
            options = dataclasses.replace(options, batch=batch)
            with du.torch_distributed_zero_first(du.get_local_rank()):
                data = cls.get_data(options.data, options)
            options = options.for_dataset(data)
            names = cls.val_names(data, model, options)
            # every rank must agree on one folder; only rank 0 looks at the disk to choose it
            save_dir = None
            if du.is_main_process():
                save_dir = str(increment_path(Path(options.project) / options.name, exist_ok=options.exist_ok,
                                              mkdir=True))
            validator = cls(options, Path(du.broadcast_object(save_dir)), names, label_names=data.get("label_names"))
            with problems_listed_on_failure(validator.save_dir, options.split, write=du.is_main_process()):
                dataset = validator.build_dataloader(cls.split_path(data, options.split), stride,
                                                     rect=backend.dynamic).dataset
            if du.is_main_process():  # as training does
                write_problems(validator.save_dir, {options.split: dataset.problems})
            stats = validator(model, final=True)
            if du.is_main_process():
                LOGGER.info(f"Results saved to {validator.save_dir}")
            return stats
