"""Milliseconds per EMA update after an optimizer step, ours and, when the interpreter imports it, Ultralytics'
(the same model built by each tool from the same YAML). Figures, not assertions.

    python -m benchmarks.ema                                   # yolov8n, 200 updates, 1 thread, CPU
    /tmp/peers-venv/bin/python -m benchmarks.ema --tool ultralytics
    python -m benchmarks.ema --device 0                        # on a GPU (each update synchronised)
"""

import argparse
import statistics
import time

import torch


def ours(cfg, device):
    from models.yolo import DetectionModel
    from utils.torch_utils import ModelEMA

    model = DetectionModel(cfg, nc=80).to(device)
    return model, ModelEMA(model)


def ultralytics(cfg, device):
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA

    model = DetectionModel(cfg, nc=80, verbose=False).to(device)
    return model, ModelEMA(model)


def time_updates(model, ema, n, device):
    """(wall, CPU) ms per ema.update(model), medians, each update after the weights changed in place (as an optimizer
    step changes them). The process's CPU time is the steadier figure on a shared machine."""
    params = [p for p in model.parameters() if p.requires_grad]
    wall, cpu = [], []
    for _ in range(n):
        with torch.no_grad():
            torch._foreach_add_(params, 1e-4)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0, c0 = time.perf_counter(), time.process_time()
        ema.update(model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    skip = n // 10  # the first updates build what later ones reuse
    return 1e3 * statistics.median(wall[skip:]), 1e3 * statistics.median(cpu[skip:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cfg", default="yolov8n.yaml")
    p.add_argument("--tool", choices=["ours", "ultralytics"], default="ours")
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the CPU time is the work's)")
    p.add_argument("--device", default="cpu")
    opt = p.parse_args()
    torch.set_num_threads(opt.threads)
    device = torch.device("cpu" if opt.device == "cpu" else f"cuda:{opt.device}")
    model, ema = (ours if opt.tool == "ours" else ultralytics)(opt.cfg, device)
    model.train()
    wall, cpu = time_updates(model, ema, opt.updates, device)
    print(f"{opt.tool} {opt.cfg} {device}, {opt.threads} thread(s): {wall:.2f} ms wall, {cpu:.2f} ms CPU per EMA "
          f"update (medians of {opt.updates})")


if __name__ == "__main__":
    main()
