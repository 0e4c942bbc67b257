"""What DDP costs on this machine (figures, not assertions), in two parts:

1. step: 2 gloo processes x 1 thread, the same model and batch on each, milliseconds per training step
   (forward + backward) without the gradient all-reduce (inside DDP's no_sync), with it, and with it when the
   gradients are views into DDP's buckets (gradient_as_bucket_view). The difference is the all-reduce time that
   the backward pass does not hide; a bare all_reduce of all gradients is timed too. Then the step with and without
   the trainer's stop / --save-interval collective (engine/checkpointer.Checkpointer.due) after each step,
   alternated.
2. run:  the same whole training command as 1 process x 2 threads and as torchrun with 2 processes x 1 thread,
   alternated, img/s of the train loop from --profile (medians).

    python -m benchmarks.ddp_overhead --data /tmp/shapes/shapes-det.yaml          # both parts
    python -m benchmarks.ddp_overhead --parts step --cfg yolov5n.yaml
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from models.yolo import DetectionModel
from utils import dist as du
from utils.files import ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step_ms(model, x, steps, sync, agree=False):
    """Median ms of forward + backward; gradients are all-reduced when `sync` (DDP's normal step); `agree`: then the
    collective in which the trainer's ranks share a stop request and rank 0's --save-interval clock."""
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        if sync:
            sum(y.float().square().mean() for y in model(x)).backward()
        else:
            with model.no_sync():
                sum(y.float().square().mean() for y in model(x)).backward()
        if agree:
            du.any_ranks(False, False)
        dist.barrier()  # both ranks finished: the slower one sets the pace, as in training
        if i >= 2:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=False)
    return 1e3 * statistics.median(times)


def _step_worker(rank, port, opt, queue):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    x = torch.rand(opt.batch, 3, opt.imgsz, opt.imgsz)
    out = {}
    for view in (False, True):
        model = DDP(DetectionModel(opt.cfg, nc=3).train(), gradient_as_bucket_view=view)
        key = "bucket_view" if view else "copy"
        out[f"sync_{key}"] = _step_ms(model, x, opt.steps, sync=True)
        if not view:
            out["no_sync"] = _step_ms(model, x, opt.steps, sync=False)
            flat = torch.cat([p.detach().flatten() for p in model.parameters()])
            t0 = time.perf_counter()
            for _ in range(opt.steps):
                dist.all_reduce(flat)
            out["bare_all_reduce"] = 1e3 * (time.perf_counter() - t0) / opt.steps
            out["params_M"] = flat.numel() / 1e6
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(100):
                du.any_ranks(False, False)
            out["agree_alone"] = 1e3 * (time.perf_counter() - t0) / 100
            for agree in [False, True] * opt.repeats:  # alternated: a shared machine drifts
                out.setdefault(f"agree_{agree}", []).append(_step_ms(model, x, opt.steps, sync=True, agree=agree))
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def part_step(opt):
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_step_worker, args=(free_port(), opt, queue), nprocs=2)
    r = queue.get()
    print(f"\nstep: {opt.cfg}, {opt.batch} images of {opt.imgsz} px per rank, 2 gloo processes x 1 thread, "
          f"{r['params_M']:.2f} M gradients, median of {opt.steps} steps")
    print(f"  forward+backward, no all-reduce (no_sync)      {r['no_sync']:8.1f} ms")
    print(f"  forward+backward + all-reduce (DDP default)    {r['sync_copy']:8.1f} ms  "
          f"(+{r['sync_copy'] - r['no_sync']:.1f} ms not hidden by backward)")
    print(f"  the same, gradient_as_bucket_view=True         {r['sync_bucket_view']:8.1f} ms")
    print(f"  bare all_reduce of every gradient at once      {r['bare_all_reduce']:8.1f} ms")
    without, with_ = (" / ".join(f"{v:.1f}" for v in r[f"agree_{a}"]) for a in (False, True))
    print(f"  DDP step, no stop/save collective              {without} ms")
    print(f"  DDP step + the stop/save collective each step  {with_} ms  ({opt.repeats} alternated runs each)")
    print(f"  the stop/save collective alone                 {r['agree_alone']:8.2f} ms")


def _run(cmd, env, log):
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc:
        raise SystemExit(f"error: {' '.join(cmd[:4])} ... exited {rc}; see {log}")


def part_run(opt):
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    train = [str(ROOT / "train.py"), "--data", opt.data, "--cfg", opt.cfg, "--img", str(opt.imgsz), "--epochs",
             str(opt.epochs), "--batch-size", "16", "--device", "cpu", "--noplots", "--profile", "--exist-ok",
             "--project", str(out)]
    jobs = {
        "1 process x 2 threads": ([sys.executable, *train], {"OMP_NUM_THREADS": "2"}, "single"),
        "2 processes x 1 thread": ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                    "--master_port", str(free_port()), *train], {"OMP_NUM_THREADS": "1"}, "ddp"),
    }
    figures = {k: [] for k in jobs}
    for i in range(opt.repeats):
        for label, (cmd, env, kind) in jobs.items():
            name = f"{kind}{i}"  # a run folder holds one run: each repeat writes its own
            _run([*cmd, "--name", name], {**os.environ, **env}, out / f"{name}.log")
            s = json.loads((out / name / "profile.json").read_text())
            figures[label].append((s["train_img_per_s"], s["sections"]["forward_backward"]["s"], s["wall_s"]))
    print(f"\nrun: train.py {opt.cfg}, {opt.imgsz} px, batch 16 in all, {opt.epochs} epochs, medians of {opt.repeats}")
    print(f"  {'':<24}{'train img/s':>12}{'fwd+bwd s':>11}{'wall s':>9}")
    for label, rows in figures.items():
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"  {label:<24}{med[0]:>12.1f}{med[1]:>11.1f}{med[2]:>9.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", choices=["step", "run"], default=["step", "run"])
    p.add_argument("--cfg", default="yolov8n.yaml")
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=8, help="images per rank in the step part")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--data", default="/tmp/shapes/shapes-det.yaml", help="dataset YAML for the run part")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default="runs/ddp_overhead")
    opt = p.parse_args()
    if "step" in opt.parts:
        part_step(opt)
    if "run" in opt.parts:
        part_run(opt)


if __name__ == "__main__":
    main()
