"""What a killed worker costs on this machine (figures, not assertions): a 2-process torchrun run on CPU trained
once without a kill and once with a SIGKILL of one rank mid-epoch under --max-restarts 1.

    python -m benchmarks.restart                        # static rendezvous, rank 1 killed before batch 2 of epoch 1
    python -m benchmarks.restart --rdzv c10d --kill-rank 0 --epochs 3 --save-interval 2it

Prints the wall time of both runs (their difference is the time one kill costs), the restart time (from the
SIGKILL to the restarted group's first training batch, set-up included) and where the restart resumed.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from data.synthetic import generate_dataset
from utils.files import ROOT

DRIVER = ROOT / "tests" / "elastic_driver.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, run_args, name, kill):
    port = free_port()
    rdzv = ["--master_port", str(port)] if args.rdzv == "static" else [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1", *rdzv,
           str(DRIVER), *run_args, "--name", name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kill:
        env.update(KILL_RANK=str(args.kill_rank), KILL_AT=args.kill_at)
    t0 = time.time()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode:
        sys.exit(f"{name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return time.time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rdzv", choices=["static", "c10d"], default="static")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--kill-at", default="1:2", help="epoch:batch before which the rank dies")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-interval", default="1it")
    p.add_argument("--cfg", default="yolov5n.yaml")
    p.add_argument("--imgsz", type=int, default=64)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="restart-bench-"))
    generate_dataset(root / "data", task="detect", n_train=16, n_val=4, seed=0, min_side=64, max_side=96)
    (root / "data.yaml").write_text(f"path: {root / 'data'}\ntrain: images/train\nval: images/val\n"
                                    "names: {0: circle, 1: rectangle, 2: triangle}\n")
    run_args = ["--data", str(root / "data.yaml"), "--imgsz", str(args.imgsz), "--batch-size", "4", "--epochs",
                str(args.epochs), "--workers", "0", "--device", "cpu", "--cfg", args.cfg, "--noval",
                "--save-interval", args.save_interval, "--project", str(root / "runs")]
    plain = launch(args, run_args, "plain", kill=False)
    killed = launch(args, run_args, "killed", kill=True)
    run = root / "runs" / "killed"
    died = float((run / "killed_at.txt").read_text())
    restart = [line.split() for line in (run / f"starts_rank{args.kill_rank}.txt").read_text().splitlines()][-1]
    print(f"uninterrupted run {plain:.1f} s; with one kill {killed:.1f} s: the kill cost {killed - plain:.1f} s")
    print(f"restart: {float(restart[3]) - died:.1f} s from the SIGKILL to training again, "
          f"resumed at epoch {restart[1]} batch {restart[2]} (killed before {args.kill_at})")


if __name__ == "__main__":
    main()
