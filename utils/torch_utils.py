"""Training utilities: seeding, EMA, optimizer parameter groups, LR schedules, early stopping, timing."""

import math
import os
import platform
import random
import re
import sys
import time
from copy import deepcopy
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from utils.errors import BadOption
from utils.log import LOGGER


def init_seeds(seed=0, deterministic=False):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True


@lru_cache(maxsize=None)
def cpu_bf16_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU flags that say it computes bfloat16 in hardware (avx512_bf16, amx_bf16), as a sorted tuple; empty
    without /proc/cpuinfo (macOS, Windows)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return ()
    return tuple(sorted(set(re.findall(r"\b(avx512_bf16|amx_bf16)\b", text))))


def cpu_bf16_native(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16). torch's own mkldnn check also passes
    on CPUs that only emulate bf16, where it is slower than fp32; without /proc/cpuinfo the answer is no, and fp32
    stays the default."""
    return bool(cpu_bf16_flags(cpuinfo))


def precision_text(device, amp):
    """What --amp resolves to on `device`, and why: for the line a run starts with."""
    enabled, dtype = amp_settings(device, amp)
    what = "fp32" if not enabled else "fp16 autocast + GradScaler" if dtype == torch.float16 else "bf16 autocast"
    if amp != "auto":
        why = f"--amp {amp}"
    elif device.type != "cpu":
        why = f"--amp auto on {device.type.upper()}"
    elif enabled:
        why = f"--amp auto: the CPU has {' and '.join(cpu_bf16_flags()) or 'native bf16'}"
    else:
        why = "--amp auto: the CPU has no native bf16 (avx512_bf16, amx_bf16)"
    return f"{what} ({why})"


def device_name(device):
    """The hardware behind a torch device: the GPU's name, or the CPU model from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        found = None
    return found.group(1).strip() if found else platform.processor() or platform.machine() or "CPU"


GIB = 2**30  # memory is reported in GiB, as nvidia-smi's MiB and every peer's "G" are binary units


def memory_used(device):
    """The progress bar's `mem`, in GiB: GPU memory torch holds (reserved) on CUDA, the process's resident memory
    on CPU (its peak where /proc is missing)."""
    if device.type == "cuda":
        return torch.cuda.memory_reserved(device) / GIB
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
    except ImportError:  # Windows: no /proc and no resource module; the column shows 0
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024) / GIB  # bytes on macOS, KiB on Linux


def peak_memory(device, reset=False):
    """(allocated, reserved): the peaks of torch's CUDA allocator on `device` in GiB since the last reset, which
    `reset` then starts again; None on other devices, where torch keeps no such count."""
    if device.type != "cuda":
        return None
    peaks = torch.cuda.max_memory_allocated(device) / GIB, torch.cuda.max_memory_reserved(device) / GIB
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peaks


def memory_format(device):
    """channels_last on CPU, where oneDNN convolves NHWC faster, in training and inference alike (bench.py, 2-core
    AVX512 CPU, fp32 train img/s at 320 px: yolov5n +22 %, yolov8n +18 %, yolov7-tiny +41 %, v8n-seg +14 %, v8n-cls
    at 96 px unchanged); CUDA keeps the default layout until it is measured there."""
    return torch.channels_last if device.type == "cpu" else torch.contiguous_format


def amp_settings(device, amp):
    """(enabled, dtype) for training's autocast. 'auto' = fp16 on CUDA, bf16 on CPUs with native bf16, off elsewhere;
    'bf16' works on CPU and CUDA. bf16 on CPU was chosen by a study (benchmarks/study.py, shapes benchmark set, 30
    epochs, seeds 0-2): mean mAP50-95 yolov8n 0.359 against fp32's 0.369, yolov5n 0.194 against 0.187, with
    whole runs 1.3-1.6x faster; docs/recipes.md has the table."""
    if amp == "auto":
        amp = "fp16" if device.type == "cuda" else "bf16" if device.type == "cpu" and cpu_bf16_native() else "off"
    if amp == "off":
        return False, torch.float32
    if amp == "fp16" and device.type != "cuda":
        raise BadOption("--amp fp16 needs CUDA; use --amp bf16 on CPU")
    return True, torch.float16 if amp == "fp16" else torch.bfloat16


def to_float32(x):
    """Outputs of an autocast forward in fp32 (losses and NMS in half precision lose small values)."""
    if isinstance(x, torch.Tensor):
        return x.float()
    if isinstance(x, (list, tuple)):
        return type(x)(to_float32(v) for v in x)
    return x


def inference_bf16(device, amp):
    """Whether a predict script (--amp auto|off|bf16) runs in bfloat16: True only when asked, on any device; False
    (off) fp32 everywhere; None (auto) each format's default: a `.pt` in fp32 (fp16 with --half on CUDA), so its
    boxes are its fp32 exports' (bf16 moves some of them: docs/benchmarks, 4 boxes against the export's 5 on one
    image), an OpenVINO model in OpenVINO's own choice for the CPU (docs/deploy.md)."""
    return {"auto": None, "off": False, "bf16": True}[amp]


def labels_to(batch, device, keys=None):
    """`batch` with its labels on `device`: the tensors `keys` names that it holds, or (None) every tensor besides the
    images (targets, masks, cls: whatever the collate function made), as the loader made them. The
    copies do not block: from the loader's pinned memory they run behind the host, which would otherwise wait for the
    device's queued work at each."""
    if keys is None:  # tensors, and records of them that move as one (data/targets.Targets)
        keys = [k for k, v in batch.items() if k not in ("img", "hsv") and callable(getattr(v, "to", None))]
    for k in keys:
        if k in batch:
            batch[k] = batch[k].to(device, non_blocking=True)
    return batch


def time_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.time()


class ModelEMA:
    """Exponential moving average of the weights (and BN buffers), decay ramped as decay * (1 - exp(-updates / tau)).

    The ramp keeps the early average from being dominated by the random initialisation.
    """

    def __init__(self, model, decay=0.9999, tau=2000, updates=0):
        self.ema = deepcopy(model).eval()
        self.updates = updates
        self.decay_fn = lambda x: decay * (1 - math.exp(-x / tau))
        for p in self.ema.parameters():
            p.requires_grad_(False)
        self._pairs = None  # (model, EMA tensors, its tensors), from the first update

    def _tensor_pairs(self, model):
        """The floating-point tensors of the EMA and of `model`, paired by state-dict key, found once per model:
        rebuilding two state dicts every step was most of an update's time. The trainer's model and the EMA change
        their tensors only in place (a step, a checkpoint loaded), so the pairs stay theirs. Frozen parameters are
        left out: they cannot change, and averaging a constant would only add rounding to them."""
        if self._pairs is None or self._pairs[0] is not model:
            new = model.state_dict(keep_vars=True)  # the tensors themselves, not detached views
            frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
            pairs = [(v, new[k]) for k, v in self.ema.state_dict(keep_vars=True).items()
                     if v.dtype.is_floating_point and k not in frozen]
            self._pairs = (model, [e for e, _ in pairs], [n for _, n in pairs])
        return self._pairs[1:]

    @torch.no_grad()
    def update(self, model):
        self.updates += 1
        d = self.decay_fn(self.updates)
        ema, new = self._tensor_pairs(model)
        if ema:  # one fused kernel per step for all tensors: a launch per tensor costs more than the math on a GPU
            torch._foreach_lerp_(ema, new, 1 - d)  # ema + (1 - d)(new - ema): one pass, where * then + took two


class EarlyStopping:
    """Stop when fitness has not improved for `patience` epochs (patience <= 0 disables it)."""

    def __init__(self, patience=30, best_fitness=0.0, best_epoch=0):
        self.best_fitness = best_fitness
        self.best_epoch = best_epoch
        self.patience = patience if patience > 0 else float("inf")

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        stop = (epoch - self.best_epoch) >= self.patience
        if stop:
            LOGGER.info(
                f"Early stop: no improvement in the last {self.patience} epochs; best at epoch {self.best_epoch + 1}"
            )
        return stop


def freeze_layers(model, freeze):
    """Stop training some layers: `freeze` = [N] for the first N layers, or a list of layer indices. Their
    parameters get requires_grad False, so the optimizer leaves them out and DDP (wrapped afterwards) neither
    expects nor reduces their gradients. Returns the frozen parameter names."""
    layers = range(freeze[0]) if len(freeze) == 1 else freeze
    given = f"--freeze {' '.join(map(str, freeze))}"
    beyond = [i for i in layers if i >= len(model.model)]
    if beyond:
        raise BadOption(f"{given}: the model has layers 0-{len(model.model) - 1} only")
    prefixes = tuple(f"model.{i}." for i in layers)
    frozen = [name for name, p in model.named_parameters() if name.startswith(prefixes)]
    if len(frozen) == len(list(model.parameters())):
        raise BadOption(f"{given}: that freezes every layer, which leaves nothing to train")
    for name, p in model.named_parameters():
        if name.startswith(prefixes):
            p.requires_grad_(False)
    if frozen:
        LOGGER.info(f"freezing layers {list(layers)}: {len(frozen)} parameter tensors")
    return frozen


def param_groups(model, which=None):
    """Three groups as YOLOv5: weights with decay, BatchNorm weights without, biases without (and warmed up apart);
    of the parameters whose name `which` accepts where given."""
    decay, no_decay, biases = [], [], []
    norm_types = tuple(v for k, v in vars(nn).items() if "Norm" in k and isinstance(v, type))
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or (which is not None and not which(f"{module_name}.{name}".lstrip("."))):
                continue
            if name == "bias":
                biases.append(p)
            elif isinstance(module, norm_types):
                no_decay.append(p)
            else:
                decay.append(p)
    return decay, no_decay, biases


def build_optimizer(model, name, lr, momentum, weight_decay, fused=False, new=(), new_lr=None):
    """SGD / Adam / AdamW over the YOLOv5 parameter groups; weight decay only on conv/linear weights. `new`: names of
    parameters that step at `new_lr` instead, in three groups of their own after those (only where the lrs differ,
    so that an optimizer saved without them loads). `fused` (for CUDA): one kernel updates every tensor of a group,
    and under a GradScaler the step reads the overflow flag on the GPU instead of copying it to the host; a CPU keeps
    torch's default implementation."""
    new = set(new) if new_lr is not None and new_lr != lr else set()
    decay, no_decay, biases = param_groups(model, which=lambda n: n not in new)
    fused = fused or None  # False would forbid torch's foreach default, not only the fused kernels
    if name == "SGD":
        opt = torch.optim.SGD(no_decay, lr=lr, momentum=momentum, nesterov=True, fused=fused)
    elif name == "Adam":
        opt = torch.optim.Adam(no_decay, lr=lr, betas=(momentum, 0.999), fused=fused)
    elif name == "AdamW":
        opt = torch.optim.AdamW(no_decay, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, fused=fused)
    else:
        raise ValueError(f"unknown optimizer {name!r}: choose SGD, Adam, AdamW or auto")
    opt.add_param_group({"params": decay, "weight_decay": weight_decay})
    opt.add_param_group({"params": biases, "weight_decay": 0.0})
    said = ""
    if new:
        new_decay, new_no_decay, new_biases = param_groups(model, which=new.__contains__)
        for params, wd in ((new_no_decay, 0.0), (new_decay, weight_decay), (new_biases, 0.0)):
            opt.add_param_group({"params": params, "weight_decay": wd, "lr": new_lr})
        count = len(new_no_decay) + len(new_decay) + len(new_biases)
        said = f"; {count} new ones (not from --weights) at lr={new_lr:.5g}"
    LOGGER.info(
        f"optimizer: {name}(lr={lr:.5g}, momentum={momentum}) with groups {len(no_decay)} norm weights (no decay), "
        f"{len(decay)} weights (decay={weight_decay:.3g}), {len(biases)} biases (no decay){said}"
    )
    return opt


def resolve_optimizer(name, lr0, momentum, nc, iterations, lr_gain=1.0):
    """`auto` follows the Ultralytics rule: long runs (> 10k iterations) use SGD at the hyp's lr0; short runs use
    AdamW at a small nc-dependent lr, because from scratch on a small dataset SGD at 0.01 barely moves in a few
    epochs. That lr was fitted on YOLOv8; `lr_gain` multiplies it (the hyp's `lr_auto_gain`, utils/schedule.py).
    Returns (name, lr0, momentum)."""
    if name != "auto" or iterations > 10000:
        return ("SGD" if name == "auto" else name), lr0, momentum
    return "AdamW", round(0.002 * 5 / (4 + nc) * lr_gain, 6), 0.9


def lr_lambda(epochs, lrf, cos):
    """LR multiplier per epoch: linear 1 -> lrf, or cosine (one-cycle) 1 -> lrf."""
    if cos:
        return lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda x: (1 - x / epochs) * (1.0 - lrf) + lrf
