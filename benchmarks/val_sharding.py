"""Sharded validation on this machine (figures, not assertions): the wall time of one validation pass in 1 process
and in 2 gloo processes, and how long rank 1 waits for rank 0, before (rank 0 validates alone, as the official
repos do) and after (every rank validates its share).

    python -m benchmarks.val_sharding                              # yolov5n, 64 synthetic images at 320
    python -m benchmarks.val_sharding --cfg yolov8n.yaml --n 96 --imgsz 256 --repeat 3

Each process uses one thread, so 2 processes use the 2 cores that 1 process leaves half idle; the 1-process figure
with 2 threads is printed too. On a GPU machine each rank has its own GPU, so the speed-up approaches the rank count.
"""

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
import yaml
from torch.utils.data import DataLoader

from data.synthetic import generate_dataset
from engine.tasks import TASKS
from engine.validator import ShardedBatchSampler, ValOptions
from models.yolo import DetectionModel
from utils import dist as du

DetectionValidator = TASKS["detect"].validator

NAMES = {0: "circle", 1: "rectangle", 2: "triangle"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data(root, n):
    generate_dataset(root, task="detect", n_train=1, n_val=n, seed=0, min_side=256, max_side=480)
    f = root / "data.yaml"
    f.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": NAMES}))
    return f


def make_validator(args, data, stride):
    options = ValOptions(imgsz=args.imgsz, batch=args.batch, workers=0, plots=False)
    validator = DetectionValidator(options, tempfile.mkdtemp(), NAMES)
    validator.build_dataloader(str(Path(data).parent / "images" / "val"), stride)
    return validator


def rank0_alone(validator):
    """The old layout: rank 0 takes every batch, the other ranks none (they wait for its results)."""
    ds = validator.dataloader.dataset
    sampler = ShardedBatchSampler(len(ds) if du.is_main_process() else 0, validator.args.batch)
    validator.dataloader = DataLoader(ds, batch_sampler=sampler, collate_fn=ds.collate_fn)


def timed_gather(waits):
    """Wrap the gather of the validator's records: the time spent in it is the time waiting for the other ranks."""
    gather = du.gather_objects

    def wrapper(obj, dst=0):
        t = time.perf_counter()
        out = gather(obj, dst)
        waits.append(time.perf_counter() - t)
        return out

    du.gather_objects = wrapper


def one_pass(validator, model):
    t = time.perf_counter()
    validator(model)
    return time.perf_counter() - t


def worker(rank, world_size, port, args, data, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    du.setup_ddp(torch.device("cpu"))
    torch.manual_seed(0)
    model = DetectionModel(args.cfg, nc=len(NAMES)).eval()
    waits = []
    timed_gather(waits)
    results = {}
    for mode in ("before", "after"):
        validator = make_validator(args, data, int(max(model.stride)))
        if mode == "before":
            rank0_alone(validator)
        one_pass(validator, model)  # warm-up
        waits.clear()
        walls = [one_pass(validator, model) for _ in range(args.repeat)]
        results[mode] = {"wall": statistics.median(walls), "wait": statistics.median(waits)}
    t = time.perf_counter()
    for _ in range(args.repeat):
        du.broadcast_state(model)
    results["broadcast"] = (time.perf_counter() - t) / args.repeat
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))
    du.cleanup_ddp()


def single(args, data, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = DetectionModel(args.cfg, nc=len(NAMES)).eval()
    validator = make_validator(args, data, int(max(model.stride)))
    one_pass(validator, model)
    return statistics.median(one_pass(validator, model) for _ in range(args.repeat))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cfg", default="yolov5n.yaml")
    p.add_argument("--n", type=int, default=64, help="validation images")
    p.add_argument("--imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=8, help="images per batch on each rank")
    p.add_argument("--repeat", type=int, default=3, help="passes per figure (median)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp) / "data", args.n)
        t1 = single(args, data, 1)
        t1x2 = single(args, data, 2)
        mp.spawn(worker, args=(2, free_port(), args, str(data), tmp), nprocs=2, join=True)
        r = [json.loads((Path(tmp) / f"rank{k}.json").read_text()) for k in range(2)]
    after = max(x["after"]["wall"] for x in r)
    print(f"{args.cfg}, {args.n} images at {args.imgsz}, batch {args.batch} per rank, median of {args.repeat}")
    print(f"1 process, 1 thread:    {t1:7.2f} s")
    print(f"1 process, 2 threads:   {t1x2:7.2f} s")
    print(f"2 processes, sharded:   {after:7.2f} s   speed-up {t1 / after:.2f}x over 1 thread, "
          f"{t1x2 / after:.2f}x over 2 threads")
    before, after1 = r[1]["before"], r[1]["after"]
    print(f"rank 1 waiting for rank 0: before (rank 0 validates alone) {before['wait']:.2f} s of "
          f"{r[0]['before']['wall']:.2f} s; after (sharded) {after1['wait']:.2f} s of {after1['wall']:.2f} s")
    print(f"EMA weights broadcast from rank 0 before each validation: {r[1]['broadcast'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
