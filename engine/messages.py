"""What a run tells its user: the line it starts with, where it is, how to resume it, what to run next, and which
script takes a model of another task."""

import shlex
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from utils import dist as du
from utils.errors import BadOption
from utils.files import ROOT
from utils.tasks import TASKS
from utils.torch_utils import precision_text

# where each task's scripts are, so that a model given to the wrong script is sent to the right one: detection's at the
# root (detect.py predicts), every other task's in a folder of its name (obb/train.py), so a new task adds no line here
SCRIPTS = {t: {"train": "train.py", "val": "val.py", "predict": "detect.py"} if t == "detect" else
           {role: f"{t}/{role}.py" for role in ("train", "val", "predict")} for t in TASKS}


def check_task(task, accepted, what, role):
    """Refuse a model serving `task` where only `accepted` tasks fit: `what` names it (`--weights best.pt`), `role`
    is the script's ('train', 'val' or 'predict')."""
    if task not in accepted:
        where = SCRIPTS[task][role] if task in SCRIPTS else "none of this project's scripts"
        takes = " or ".join([", ".join(accepted[:-1]), accepted[-1]] if len(accepted) > 1 else accepted)
        raise BadOption(f"{what}: a {task or 'headless'} model; this script takes {takes} models (use {where})")


def plural(n, noun, ending="s"):
    return f"{n} {noun}{'' if n == 1 else ending}"


def banner(devices, device, amp, workers, save_dir):
    """The line a training run starts with: every rank's device (`devices`), the precision --amp gives on `device`
    and why, torch, processes, threads, dataloader workers and the run folder."""
    where = ", ".join(f"{n} x {d}" if n > 1 else d for d, n in Counter(devices).items())
    n, threads = len(devices), torch.get_num_threads()
    return (f"Training on {where}; {precision_text(device, amp)}; torch {torch.__version__}; "
            f"{plural(n, 'process', 'es')} with {plural(threads, 'thread')} and {plural(workers, 'dataloader worker')}"
            f"{' each' if n > 1 else ''}; run folder {save_dir}")


def position(epoch, batch, epochs, batches_per_epoch):
    """Where a run is, numbered as the progress bar and results.csv number epochs (from 1): `epoch` is the 0-based
    index of the epoch under way, `batch` the batches of it done (0: none, the previous epoch is complete)."""
    if batch:
        return f"at epoch {epoch + 1}/{epochs} batch {batch}/{batches_per_epoch}"
    return f"after epoch {epoch}/{epochs}" if epoch else f"at the start of epoch 1/{epochs}"


def shown(path):
    """A path as a user types it: relative to the working directory when inside it, quoted for the shell."""
    p = Path(path).resolve()
    try:
        p = p.relative_to(Path.cwd())
    except ValueError:
        pass
    return shlex.quote(str(p))


# the task of the `yolo` command running this script (yolo/cli.py sets it; None under `python`): where it is set, what
# to run next and how to resume are said as `yolo` lines
YOLO_TASK = None


def resume_command(last, auto=False):
    """The command line that continues from `last`: this script, under the launcher it was started by; with `auto`
    (--resume auto), the command that was run."""
    script, path = shown(sys.argv[0]), shown(last)
    if auto:
        return f"the same command (--resume auto continues {shown(Path(last).parent.parent)})"
    if du.launcher() == "srun":
        return f"srun python {script} --resume {path} (in an allocation of {du.get_world_size()} tasks)"
    if not du.is_distributed():
        return f"yolo {YOLO_TASK} train resume model={path}" if YOLO_TASK else f"python {script} --resume {path}"
    nodes = "" if du.get_world_size() == du.get_local_world_size() else " --nnodes ... (on every machine)"
    return f"python -m torch.distributed.run --nproc_per_node {du.get_local_world_size()}{nodes} {script} " \
           f"--resume {path}"


def next_commands(scripts, weights, data, source, imgsz, half=False):
    """Validate, predict and export commands for a finished run's weights. `scripts` is the task's (val, predict)
    pair of script paths under the repository root; `data` the --data given, `source` what to predict on; `half`:
    the run validated in fp16, which val.py repeats with --half."""
    val, predict = (shown(ROOT / s) for s in scripts)
    w, img = shown(weights), f"--img {imgsz}"
    data = shown(data) if Path(data).exists() else shlex.quote(str(data))  # else a name found under data/
    if YOLO_TASK:
        return [f"yolo {YOLO_TASK} val model={w} data={data} imgsz={imgsz}{' half=True' if half else ''}",
                f"yolo {YOLO_TASK} predict model={w} source={source} imgsz={imgsz}",
                f"yolo export model={w} format=onnx imgsz={imgsz}"]
    return [f"python {val} --weights {w} --data {data} {img}{' --half' if half else ''}",
            f"python {predict} --weights {w} --source {source} {img}",
            f"python {shown(ROOT / 'export.py')} --weights {w} --include onnx {img}"]


class RunETA:
    """The whole run's time left, for the progress bar: the time per batch this process has taken so far (validation,
    saving and plotting included once an epoch has ended) times the batches left. `done` counts global batches (over
    epochs) from the run's start; a resumed run measures from where it resumed. The final validation of best.pt is
    not in it until the first epoch's validation is."""

    def __init__(self, epochs, batches_per_epoch, done, clock=time.monotonic):
        self.total, self.start, self.clock = epochs * batches_per_epoch, done, clock
        self.t0 = clock()

    def seconds_left(self, done):
        """Seconds left after `done` batches of the whole run, or None before the first batch of this process."""
        measured = done - self.start
        if measured < 1:
            return None
        return (self.clock() - self.t0) / measured * max(self.total - done, 0)

    def text(self, done):
        left = self.seconds_left(done)
        if left is None:
            return "run ETA ?"
        h, rest = divmod(int(round(left)), 3600)
        return f"run ETA {h}:{rest // 60:02d}:{rest % 60:02d}"
