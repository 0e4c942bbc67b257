"""OpenVINO predict speed, ours against a peer's on the same checkpoint: each side's predict command run on a folder of
images, the sides alternating round after round, reported as medians of the whole process (wall and CPU seconds)
and of the per-image inference each tool logs ("Speed: ... inference"). Each command is run from its own predict
CLI, as a user runs it, the peers from the peers' venv (bash ../shared/peers/setup.sh): Ultralytics' `yolo predict`
(--peer), or the yolov5 repo's detect.py (--peer-v5) for the v5 checkpoints Ultralytics 8 refuses. The yolov5
package of that venv (7.0.14) imports `openvino.runtime`, which OpenVINO 2026 no longer has: --v5-repo names a
checkout of github.com/ultralytics/yolov5, whose detect.py and export.py run OpenVINO's current API.

    python -m benchmarks.openvino_speed --source /tmp/img32 --rounds 3 \\
        --ours fp32=/tmp/a_openvino_model --ours "fp32 --amp off=/tmp/a_openvino_model,--amp,off" \\
        --peer fp32=/tmp/u_openvino_model --peer int8=/tmp/u_int8_openvino_model \\
        --peer-v5 int8=/tmp/v5/yolov5n_int8_openvino_model --v5-repo /tmp/yolov5

A side is LABEL=WEIGHTS[,EXTRA,ARGS]: the extra arguments go to detect.py (ours or yolov5's) or `yolo predict`.
Run it under `bash /tmp/inbench.sh` where that exists, and note the machine's load (printed before and after).
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from utils.files import ROOT

PEER_ENV = {"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "false", "YOLOv5_AUTOINSTALL": "false", "HF_HUB_OFFLINE": "1",
            "MPLBACKEND": "Agg", "YOLO_CONFIG_DIR": "/tmp/peers-venv/peer-config",
            "YOLOV5_CONFIG_DIR": "/tmp/peers-venv/peer-config"}
# yolov5 names its third figure NMS: the same span, from the raw output to the kept boxes
SPEED = re.compile(r"Speed: ([\d.]+) ?ms pre-?process, ([\d.]+) ?ms inference, ([\d.]+) ?ms (?:post-?process|NMS)")
IMAGE_LINE = re.compile(r"^image \d+/\d+ .*?([\d.]+) ?ms$", re.M)  # both tools log each image's inference last


def command(side, weights, extra, source, imgsz, a):
    """argv, environment and working folder of one side's predict run."""
    out, peer_python = a.out, a.peer_python
    if side == "peer-v5":
        argv = [peer_python, "detect.py", "--weights", weights, "--source", source, "--imgsz", str(imgsz),
                "--nosave", "--project", str(out), *extra]
        return argv, {**os.environ, **PEER_ENV}, a.v5_repo
    if side == "peer":
        yolo = Path(peer_python).with_name("yolo")
        argv = [str(yolo), "predict", f"model={weights}", f"source={source}", f"imgsz={imgsz}", "save=False",
                f"project={out}", *extra]
        return argv, {**os.environ, **PEER_ENV}, ROOT
    argv = [sys.executable, str(ROOT / "detect.py"), "--weights", weights, "--source", source, "--img", str(imgsz),
            "--nosave", "--project", str(out), *extra]
    return argv, dict(os.environ), ROOT


def run_once(argv, env, cwd):
    """(wall s, CPU s, {preprocess, inference, postprocess} ms per image) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = run.stdout + run.stderr
    m = SPEED.search(text)
    if run.returncode or not m:
        raise SystemExit(f"{' '.join(argv)} failed (exit {run.returncode}):\n{text[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    speed = dict(zip(("preprocess", "inference", "postprocess"), map(float, m.groups())))
    # the median image: the mean above holds what the first run (ours) and each new input shape (a dynamic IR)
    # cost, which Ultralytics' warm-up run, outside its figures, takes for a static one
    speed["median"] = statistics.median(map(float, IMAGE_LINE.findall(text)))
    return wall, cpu, speed


def parse_side(spec):
    label, _, rest = spec.partition("=")
    weights, *extra = rest.split(",")
    return label, weights, extra


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, help="a folder of images")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ours", action="append", default=[], help="LABEL=WEIGHTS[,EXTRA,ARGS] for detect.py")
    p.add_argument("--peer", action="append", default=[], help="LABEL=WEIGHTS[,EXTRA,ARGS] for yolo predict")
    p.add_argument("--peer-v5", action="append", default=[],
                   help="LABEL=WEIGHTS[,EXTRA,ARGS] for the yolov5 repo's detect.py (--v5-repo)")
    p.add_argument("--v5-repo", type=Path, help="a checkout of github.com/ultralytics/yolov5, for --peer-v5")
    p.add_argument("--peer-python", default="/tmp/peers-venv/bin/python")
    p.add_argument("--out", default="/tmp/openvino_speed_runs", help="where the runs' folders go")
    a = p.parse_args()
    if a.peer_v5 and not (a.v5_repo and (a.v5_repo / "detect.py").is_file()):
        p.error("--peer-v5 needs --v5-repo, a yolov5 checkout holding detect.py")
    sides = [("ours", *parse_side(s)) for s in a.ours] + [("peer", *parse_side(s)) for s in a.peer] + \
        [("peer-v5", *parse_side(s)) for s in a.peer_v5]
    print(f"load before: {os.getloadavg()}")
    times = {(side, label): [] for side, label, _, _ in sides}
    for r in range(a.rounds):
        for side, label, weights, extra in sides:  # each round runs every side once: they meet the same load
            times[side, label].append(run_once(*command(side, weights, extra, a.source, a.imgsz, a)))
            wall, cpu, speed = times[side, label][-1]
            print(f"round {r} {side:7s} {label:24s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                  f"inference {speed['inference']:6.1f} ms (median image {speed['median']:6.1f})  "
                  f"pre {speed['preprocess']:5.1f}  post {speed['postprocess']:5.1f}", flush=True)
    print(f"load after: {os.getloadavg()}")
    print(f"\nmedians of {a.rounds} rounds: side, label, wall s, CPU s, inference ms/image (mean, median image), "
          "pre, post")
    for (side, label), runs in times.items():
        med = [statistics.median(v) for v in zip(*[(w, c, s["inference"], s["median"], s["preprocess"],
                                                    s["postprocess"]) for w, c, s in runs])]
        print(f"{side:7s} {label:24s} " + "  ".join(f"{v:7.2f}" for v in med))


if __name__ == "__main__":
    main()
