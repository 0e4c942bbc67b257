"""What a val or predict batch costs in memory, settled before the first batch is read: the image size a command
takes from the weights' run record may be up to 4096 px (utils/budget.MAX_IMGSZ), at which one image of YOLOv8x
holds gigabytes of activations.

One image's cost is counted by a dry run of the model's forward pass at the image size (utils/dry_run.py: on the
meta device, nothing allocated), as the bytes it holds live at its peak, times EVAL_PEAK_FACTOR for what a real
device holds beyond them (allocator, convolution workspaces), plus the image as uint8 and float32. A model no dry
run can count (an export, one whose forward reads values) is counted at EVAL_BYTES_PER_INPUT per input value. A
segmentation val adds the masks it decodes for one image (`mask_bytes`). The whole must fit in half the memory the
process may still take (docs/safety.md): a val batch that does not is made smaller, with one line saying so; one
image that does not is refused (BadOption), naming an --img that fits.
"""

import dataclasses
import math

import torch
import torch.nn as nn

from data.image_cache import available_memory
from utils.budget import (
    EVAL_BYTES_PER_INPUT,
    EVAL_MEMORY_FRACTION,
    EVAL_PEAK_FACTOR,
    EXPORT_TRACE_FACTOR,
    MASK_DECODE_BYTES,
)
from utils.dist import get_local_world_size
from utils.dry_run import DryRunError, dry_run
from utils.errors import BadOption
from utils.log import LOGGER

INPUT_BYTES = 1 + 4  # an input value as the loader's uint8 and the model's float32


@dataclasses.dataclass(frozen=True)
class ImageCost:
    """What one image of `shape` (c, h, w) costs to evaluate, in bytes, and how that was counted (for the log)."""

    shape: tuple
    bytes: int
    how: str


def device_memory(device):
    """Bytes a batch may still take on `device`: CUDA's free memory, or the memory this process may still take
    shared among this machine's ranks (they evaluate at once); None where it is not known."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    free = available_memory()
    return None if free is None else free // max(get_local_world_size(), 1)


def _module(model):
    """The torch module a dry run can count: the model itself, or the one an InferenceBackend holds (None for an
    export: its runtime plans its own memory)."""
    inner = getattr(model, "model", None) if hasattr(model, "format") else model
    return inner if isinstance(inner, nn.Module) else None


def _state(module):
    """Each submodule's attributes, and its own parameter, buffer and child tables, as they are: a layer may keep
    what its forward made (a YOLOv5-style head's grid, cached per input shape), which a dry run makes on the meta
    device and a real pass at that shape would then read."""
    return [(m, dict(m.__dict__), {k: dict(m.__dict__[k]) for k in ("_parameters", "_buffers", "_modules")})
            for m in module.modules()]


def _restore(saved):
    for m, attrs, tables in saved:
        m.__dict__.clear()
        m.__dict__.update(attrs)
        for k, table in tables.items():
            m.__dict__[k].clear()
            m.__dict__[k].update(table)


def image_cost(model, imgsz):
    """The ImageCost of one `imgsz` (side, or (h, w)) image through `model` (a torch module or an InferenceBackend)."""
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    module = _module(model)
    ch = (getattr(module, "yaml", None) or {}).get("ch", 3)  # a model YAML's input channels
    values = ch * h * w
    fallback = f"{EVAL_BYTES_PER_INPUT} bytes per input value"
    if module is None:
        return ImageCost((ch, h, w), values * (EVAL_BYTES_PER_INPUT + INPUT_BYTES), f"{fallback}, an export")
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    saved = _state(module)
    try:
        probe, _ = dry_run(module.eval(), (1, ch, h, w), dtype=dtype)
    except (DryRunError, RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
        why = " ".join(str(e).split())[:120]
        LOGGER.info(f"the memory of evaluating a {h}x{w} image is estimated at {fallback}: a dry run of the model "
                    f"could not count it ({type(e).__name__}: {why})")
        return ImageCost((ch, h, w), values * (EVAL_BYTES_PER_INPUT + INPUT_BYTES), f"{fallback}, no dry run")
    finally:
        _restore(saved)
    return ImageCost((ch, h, w), EVAL_PEAK_FACTOR * probe.peak + values * INPUT_BYTES, "dry run")


def _gib(n):
    return f"{n / 2**30:.2f} GiB"


def mask_bytes(model, imgsz, masks):
    """What decoding `masks` instance masks of one image at the input size holds (MASK_DECODE_BYTES a pixel each:
    one image is decoded at a time, whatever the batch), for a model whose head predicts masks; else 0."""
    layout = getattr(model, "output_layout", None)
    if not masks or layout is None or not layout.nm:
        return 0
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    return MASK_DECODE_BYTES * masks * h * w


def _fitting_side(side, cost, budget, stride=32):
    """The largest square side, a multiple of `stride`, at which what costs `cost` at `side` would cost about
    `budget` (costs grow with the pixels)."""
    return int(side * math.sqrt(max(budget, 0) / cost) // stride * stride)


def settle_batch(model, imgsz, batch, device, what, masks=0, free_memory=None, export=False):
    """The batch size to evaluate `batch` images of `imgsz` with (and to decode up to `masks` instance masks of each,
    where the model predicts masks: a val's --max-det): `batch`, or fewer (one log line says why) where they would
    not fit in the budget, EVAL_MEMORY_FRACTION of the memory `free_memory(device)` (device_memory) gives; BadOption
    (one line naming the figures and an --img that fits) where even one image does not. `what` names the weights.
    An `export` traces its batch (EXPORT_TRACE_FACTOR evaluations) and writes it into the file: it is refused, not
    made smaller, where it does not fit."""
    free = (free_memory or device_memory)(device)
    if free is None:
        return batch
    cost = image_cost(model, imgsz)
    if export:
        cost = dataclasses.replace(cost, bytes=cost.bytes * EXPORT_TRACE_FACTOR, how=f"{cost.how}, traced")
    decode = mask_bytes(model, imgsz, masks)
    budget = int(free * EVAL_MEMORY_FRACTION)
    fits = max(budget - decode, 0) // cost.bytes
    if fits >= batch:
        return batch
    size = "x".join(map(str, cost.shape[1:]))
    figure = (f"evaluating one {size} image takes about {_gib(cost.bytes)} ({cost.how})"
              f"{f' and decoding its {masks} masks {_gib(decode)}' if decode else ''}, and the budget is "
              f"{_gib(max(budget, 0))} (half the {_gib(max(free, 0))} free on {torch.device(device).type})")
    if fits == 0 or export:
        side = _fitting_side(max(cost.shape[1:]), cost.bytes + decode, budget)
        hint = f"pass --img {side} or less" if side >= 32 else "free memory, or use a smaller model"
        if fits:
            hint = f"pass --batch-size {fits} or less"
        raise BadOption(f"{what}: {figure}: {hint}{' or a smaller --max-det' if decode else ''} (docs/safety.md)")
    LOGGER.info(f"--batch-size {batch} -> {fits}: {figure}")
    return int(fits)
