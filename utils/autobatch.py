"""`--batch-size -1` (`batch=-1`, Ultralytics' and yolov5's AutoBatch): the largest batch whose training step fits a
fraction of the GPU's free memory, found by trial steps; on a CPU, where memory is not the limit that matters, a fixed
batch (CPU_BATCH) with one line saying so.

The trials run a forward and backward pass of the model on random images of growing batches (1, 2, 4, 8, 16), read
the peak memory each took, fit a line through them (memory = fixed + per-image x batch) and solve it for `fraction`
of the memory that was free before the first trial. A trial that runs out of memory ends the trials, and the batch
stays below it. Each trial is timed: the log gives its milliseconds per image, and once the trials have taken
TRIAL_SECONDS (a large model at a large size on a small GPU) the ones done decide, two at least. The memory readers
and the clock are arguments, so the arithmetic is tested on a CPU with a fake reader and a fake clock.
"""

import time

import numpy as np

from utils.log import LOGGER

FRACTION = 0.60  # of the free memory, as Ultralytics' AutoBatch (yolov5's takes 0.8): room for the EMA and the loader
CPU_BATCH = 16  # the scripts' --batch-size default
TRIALS = (1, 2, 4, 8, 16)
MAX_BATCH = 1024
TRIAL_SECONDS = 30.0  # the trials' time, beyond which no larger one starts (two trials fit a line)


def fit_batch(trials, free, fraction=FRACTION, failed=None):
    """The batch whose line through `trials` {batch: peak bytes} reaches `fraction` x `free` bytes, at least 1,
    below `failed` (the smallest batch that ran out of memory, or None), at most MAX_BATCH."""
    if len(trials) < 2:
        return max(1, min(trials or [1]))
    b, mem = np.array(sorted(trials), float), np.array([trials[k] for k in sorted(trials)], float)
    slope, fixed = np.polyfit(b, mem, 1)
    # the images that fit, whole (the 1e-6: the fit's rounding must not cost an image that exactly fits)
    batch = int(np.floor((fraction * free - fixed) / slope + 1e-6)) if slope > 0 else MAX_BATCH
    if failed is not None:
        batch = min(batch, failed - 1)
    return int(np.clip(batch, 1, MAX_BATCH))


def auto_batch(step, free_memory, peak_memory, is_oom, fraction=FRACTION, trials=TRIALS, clock=time.perf_counter,
               budget=TRIAL_SECONDS):
    """The batch for `fraction` of the free memory: `step(b)` runs a trial of batch b, `peak_memory()` the bytes it
    took at most (and resets the count, after waiting for the device), `free_memory()` the free bytes,
    `is_oom(error)` whether an error is an out-of-memory one; `clock()` seconds, `budget` the trials' time."""
    free, used, seconds, failed = free_memory(), {}, {}, None
    peak_memory()  # from zero
    for b in trials:
        if len(used) >= 2 and sum(seconds.values()) > budget:
            break
        t0 = clock()
        try:
            step(b)
        except Exception as e:
            if not is_oom(e):
                raise
            failed = b
            break
        used[b] = peak_memory()
        seconds[b] = clock() - t0
    batch = fit_batch(used, free, fraction, failed)
    trial = ", ".join(f"{b}: {used[b] / 2**30:.2f} GiB, {1e3 * seconds[b] / b:.0f} ms/image" for b in used)
    LOGGER.info(f"AutoBatch: batch {batch}, for {fraction:.0%} of {free / 2**30:.2f} GiB free (trial steps, images: "
                f"peak memory, time: {trial}{f'; {failed} images ran out of memory' if failed else ''})")
    return batch


def cuda_auto_batch(model, imgsz, device, fraction=FRACTION, autocast_dtype=None):
    """auto_batch for `model` training at `imgsz` on the CUDA `device`: trial steps of a forward pass and a backward
    pass of the outputs' sum (what the loss adds beside the activations is small), under autocast to
    `autocast_dtype` where training runs so (fp32 activations would take about twice the memory: a smaller batch)."""
    import torch

    def step(b):
        x = torch.rand(b, 3, imgsz, imgsz, device=device)
        with torch.autocast("cuda", dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None):
            out = model(x)
        sum(o.float().sum() for o in _tensors(out)).backward()
        model.zero_grad(set_to_none=True)

    def peak():
        torch.cuda.synchronize(device)
        value = torch.cuda.max_memory_reserved(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return value

    model.train()
    try:
        return auto_batch(step, lambda: torch.cuda.mem_get_info(device)[0], peak,
                          lambda e: isinstance(e, torch.OutOfMemoryError), fraction)
    finally:  # what a trial that ran out of memory left cached goes back before training allocates
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def cpu_batch():
    LOGGER.info(f"batch=-1 (AutoBatch) fits a batch to a GPU's free memory; on a CPU training uses batch {CPU_BATCH}")
    return CPU_BATCH


def _tensors(out):
    """The tensors in a model's output (a tensor, or nested lists and tuples of them)."""
    if hasattr(out, "sum") and hasattr(out, "float"):
        return [out]
    return [t for o in out for t in _tensors(o)]
