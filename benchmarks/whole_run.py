"""Whole-process timings, as a user sees them: each job is a command started from scratch and timed to its exit
(start-up, dataset scan, training, validation, saving), run alternately with a peer's command on the same data
(A B A B ...), reported as medians and the time ratio. The machine is shared and noisy: trust ratios of medians,
not single times.

    python ../shared/peers/make_shapes.py --out /tmp/shapes --seed 0        # the benchmark data (256 / 64 images)
    bash ../shared/peers/setup.sh && source /tmp/peers-venv/peer-env.sh      # the peers, in a venv of their own
    python -m benchmarks.whole_run --data /tmp/shapes/shapes-det.yaml --jobs train-v8 train-v5 predict val --repeats 3
    python -m benchmarks.whole_run --data /tmp/shapes/shapes-det.yaml --jobs train-v8 train-v5 --img 640 --repeats 3
    python -m benchmarks.whole_run --data /tmp/shapes/shapes-det.yaml --jobs train-v8 --ours-args --amp bf16

The peers train with 2 dataloader workers, their best on a 2-core CPU (docs/performance.md); `--peer-workers`
changes it. Each row gives the median wall time and the median peak resident memory (GNU time's maximum RSS) of each
side.

Without the peers' venv only our commands run.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.peer_commands import ultralytics_train
from utils.files import ROOT

# Ultralytics at 2 torch threads is its best configuration on a 2-core CPU (its default is cpu_count - 1 = 1).
ULTRALYTICS_BEST_THREADS = 2


def jobs(opt, out):
    """name -> (our command, peer command or None, our run folder to clear before each run or None)."""
    py, peers = sys.executable, Path(opt.peers_venv) / "bin"
    data, ep, img = opt.data, str(opt.epochs), str(opt.img)
    # the training jobs draw no charts on either side unless --plots (then all draw theirs, as by default)
    noplots = [] if opt.plots else ["--noplots"]
    ours_train = [py, str(ROOT / "train.py"), "--data", data, "--img", img, "--epochs", ep, "--batch-size", "16",
                  "--device", "cpu", "--project", str(out / "ours"), "--exist-ok", *noplots, *opt.ours_args]
    images = str(Path(data).parent / "images" / "val")
    return {
        "train-v8": (ours_train + ["--cfg", "yolov8n.yaml", "--name", "v8"],
                     ultralytics_train(peers / "python", ULTRALYTICS_BEST_THREADS, {
                         "model": "yolov8n.yaml", "data": data, "pretrained": False, "epochs": ep, "imgsz": img,
                         "batch": 16, "device": "cpu", "workers": opt.peer_workers, "plots": opt.plots,
                         "close_mosaic": 0, "project": out / "ultralytics", "exist_ok": True}),
                     out / "ours" / "v8"),
        "train-v5": (ours_train + ["--cfg", "yolov5n.yaml", "--name", "v5"],
                     [str(peers / "yolov5"), "train", "--data", data, "--cfg", "yolov5n.yaml", "--weights", "",
                      "--img", img, "--batch", "16", "--epochs", ep, "--workers", str(opt.peer_workers),
                      "--device", "cpu", *noplots, "--project", str(out / "yolov5"), "--exist-ok"],
                     out / "ours" / "v5"),
        "predict": ([py, str(ROOT / "detect.py"), "--weights", str(out / "ours" / "v8" / "weights" / "best.pt"),
                     "--source", images, "--img", img, "--device", "cpu", "--project", str(out / "ours"),
                     "--name", "predict", "--exist-ok"],
                    [str(peers / "yolo"), "detect", "predict",
                     f"model={out / 'ultralytics' / 'train' / 'weights' / 'best.pt'}", f"source={images}",
                     f"imgsz={img}", "device=cpu", f"project={out / 'ultralytics'}", "exist_ok=True"],
                    None),
        # both at their defaults (charts drawn), batches of 32
        "val": ([py, str(ROOT / "val.py"), "--weights", str(out / "ours" / "v8" / "weights" / "best.pt"), "--data",
                 data, "--img", img, "--batch-size", "32", "--device", "cpu", "--project", str(out / "ours"),
                 "--name", "val", "--exist-ok"],
                [str(peers / "yolo"), "detect", "val", f"model={out / 'ultralytics' / 'train' / 'weights' / 'best.pt'}",
                 f"data={data}", f"imgsz={img}", "batch=32", "device=cpu", f"project={out / 'ultralytics'}",
                 "name=val", "exist_ok=True"],
                None),
    }


def timed(cmd, log):
    """(wall seconds, peak resident memory in MB) of one command. The peak is GNU time's: the largest resident set of
    the process or of any child it waited for (dataloader workers count on their own, not summed)."""
    rss_file = Path(f"{log}.rss")
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "a") as f:
        rc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(rss_file), *cmd], stdout=f,
                            stderr=subprocess.STDOUT, env=env).returncode
    if rc:
        raise SystemExit(f"error: {cmd[:3]}... exited {rc}; see {log}")
    return time.perf_counter() - t0, int(rss_file.read_text().split()[-1]) / 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="dataset YAML (make_shapes.py's shapes-det.yaml)")
    p.add_argument("--jobs", nargs="+", default=["train-v8", "train-v5", "predict", "val"],
                   help="predict and val use the weights of the train-v8 jobs, so run those first")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--img", type=int, default=320)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--plots", action="store_true", help="the training runs of both sides draw their charts")
    p.add_argument("--peer-workers", type=int, default=2, help="the peers' training dataloader workers")
    p.add_argument("--peers-venv", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "peers-venv"))
    p.add_argument("--ours-args", nargs=argparse.REMAINDER, default=[], help="extra options for our commands")
    p.add_argument("--out", default="runs/whole_run")
    opt = p.parse_args()
    out = Path(opt.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    have_peers = (Path(opt.peers_venv) / "bin" / "python").exists()
    table = jobs(opt, out)
    print(f"{'job':<10}{'ours s (median)':>17}{'peer s (median)':>17}{'ratio':>8}{'ours MB':>9}{'peer MB':>9}   runs")
    for name in opt.jobs:
        ours_cmd, peer_cmd, run_dir = table[name]
        ours, peer = [], []
        for _ in range(opt.repeats):
            if run_dir:  # train.py refuses to mix two runs in one folder, even with --exist-ok
                shutil.rmtree(run_dir, ignore_errors=True)
            ours.append(timed(ours_cmd, out / f"{name}-ours.log"))
            if have_peers and peer_cmd:
                peer.append(timed(peer_cmd, out / f"{name}-peer.log"))
        mo, ro = (statistics.median(v) for v in zip(*ours))
        mp, rp = (statistics.median(v) for v in zip(*peer)) if peer else (float("nan"), float("nan"))
        runs = " ".join(f"{a:.1f}" for a, _ in ours) + (" | " + " ".join(f"{b:.1f}" for b, _ in peer) if peer else "")
        print(f"{name:<10}{mo:>17.1f}{mp:>17.1f}{mo / mp:>8.2f}{ro:>9.0f}{rp:>9.0f}   {runs}", flush=True)


if __name__ == "__main__":
    main()
