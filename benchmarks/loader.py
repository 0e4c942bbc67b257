"""Training-mode sample throughput on one core, ours and Ultralytics', timed the same way: one process per side and
run (torch and OpenCV at one thread), every image of the train split once in a fixed order after a warm-up pass
(the files are in the page cache), YOLOv8's default augmentation on both sides (mosaic 1.0, translate 0.1, scale
0.5, fliplr 0.5, HSV 0.015/0.7/0.4), alternating the sides, medians and their ratio. Each side is asked the way its
own training loader asks: Ultralytics `dataset[i]` (its mosaic draws partners from a buffer of recent images), ours
a group of consecutive samples at once (`dataset.__getitems__`, data/loader.GroupedLoader). Ours runs twice:
as when training on a CPU ('ours'), and as when training on a GPU ('ours-gpu'), where the samples carry their
colour tables and the GPU applies them (YOLODataset device_hsv; that step is not timed here).

    python ../shared/peers/make_shapes.py --out /tmp/shapes --seed 0
    python -m benchmarks.loader --data /tmp/shapes/shapes-det.yaml --img 640 --repeats 3

Without the peers' venv (../shared/peers/setup.sh) only ours runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = ["ours", "ours-gpu", "ultralytics"]
HYP = dict(hsv_h=0.015, hsv_s=0.7, hsv_v=0.4, degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0,
           flipud=0.0, fliplr=0.5, mosaic=1.0, mixup=0.0, copy_paste=0.0)


def ours(data, img, device_hsv=False):
    from data.dataset_yaml import check_det_dataset
    from data.detect_dataset import YOLODataset
    from utils.files import find_file, yaml_load
    from utils.heap import keep_freed_memory

    keep_freed_memory()  # as every script of ours does first (run_cli), data loader workers included

    d = check_det_dataset(data)
    hyp = {**yaml_load(find_file("hyp.v8.yaml", "data/hyps")), **HYP}
    return YOLODataset(d["train"], imgsz=img, batch_size=16, augment=True, hyp=hyp, nc=d["nc"], device_hsv=device_hsv)


def ultralytics(data, img):
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    d = check_det_dataset(data)
    cfg = get_cfg(overrides={"imgsz": img, **HYP})
    return build_yolo_dataset(cfg, d["train"], 16, d, mode="train", stride=32)


def time_one_side(side, data, img):
    """Images per second of `dataset[i]` over the whole split, in this process (one core)."""
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(0)
    ds = ultralytics(data, img) if side == "ultralytics" else ours(data, img, device_hsv=side == "ours-gpu")
    n = len(ds)
    if side != "ultralytics":  # as our training loader asks: a group of GROUP_IMAGES samples at once
        from data.loader import GROUP_IMAGES

        fetches = [(ds.__getitems__, list(range(j, min(j + GROUP_IMAGES, n)))) for j in range(0, n, GROUP_IMAGES)]
    else:
        fetches = [(ds.__getitem__, i) for i in range(n)]
    for fetch, arg in fetches:  # warm-up: file cache, lazy imports, first allocations
        fetch(arg)
    t0 = time.perf_counter()
    for fetch, arg in fetches:
        fetch(arg)
    return n / (time.perf_counter() - t0)


def run_side(side, opt):
    python = sys.executable if side != "ultralytics" else str(Path(opt.peers_venv) / "bin" / "python")
    # as this process was started (`python -m benchmarks.loader` from the root), so the root is on the path
    cmd = ["taskset", "-c", "0", python, "-m", __spec__.name, "--side", side, "--data", opt.data, "--img", str(opt.img)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"error: the {side} run failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["img_per_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--img", type=int, default=640)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--side", choices=SIDES, help="time one side in this process (internal)")
    p.add_argument("--peers-venv", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "peers-venv"))
    opt = p.parse_args()
    if opt.side:
        print(json.dumps({"img_per_s": time_one_side(opt.side, opt.data, opt.img)}))
        return
    peers = (Path(opt.peers_venv) / "bin" / "python").exists()
    sides = SIDES if peers else SIDES[:2]
    runs = {s: [] for s in sides}
    for _ in range(opt.repeats):
        for s in sides:
            runs[s].append(run_side(s, opt))
    med = {s: statistics.median(v) for s, v in runs.items()}
    for s in sides:
        print(f"{s:<12} {med[s]:7.1f} img/s (median of {' '.join(f'{v:.1f}' for v in runs[s])})")
    if peers:
        for s in SIDES[:2]:
            print(f"{s} / ultralytics: {med[s] / med['ultralytics']:.2f}x")


if __name__ == "__main__":
    main()
