"""OpenVINO predict speed, ours against Ultralytics' on the same checkpoint: each side's predict command run on a folder
of images, the sides alternating round after round, reported as medians of the whole process (wall and CPU seconds)
and of the per-image inference each tool logs ("Speed: ... inference"). Each command is run from its own predict
CLI, as a user runs it; Ultralytics' from the peers' venv (bash ../shared/peers/setup.sh).

    python -m benchmarks.openvino_speed --source /tmp/img32 --rounds 3 \\
        --ours fp32=/tmp/a_openvino_model --ours "fp32 --amp off=/tmp/a_openvino_model,--amp,off" \\
        --peer fp32=/tmp/u_openvino_model --peer int8=/tmp/u_int8_openvino_model

A side is LABEL=WEIGHTS[,EXTRA,ARGS]: the extra arguments go to detect.py (ours) or `yolo predict` (Ultralytics).
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

PEER_ENV = {"YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "false", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
            "YOLO_CONFIG_DIR": "/tmp/peers-venv/peer-config"}
SPEED = re.compile(r"Speed: ([\d.]+) ?ms pre-?process, ([\d.]+) ?ms inference, ([\d.]+) ?ms post-?process")
IMAGE_LINE = re.compile(r"^image \d+/\d+ .*?([\d.]+) ?ms$", re.M)  # both tools log each image's inference last


def command(side, weights, extra, source, imgsz, peer_python, out):
    """argv and environment of one side's predict run."""
    if side == "peer":
        yolo = Path(peer_python).with_name("yolo")
        argv = [str(yolo), "predict", f"model={weights}", f"source={source}", f"imgsz={imgsz}", "save=False",
                f"project={out}", *extra]
        return argv, {**os.environ, **PEER_ENV}
    argv = [sys.executable, str(ROOT / "detect.py"), "--weights", weights, "--source", source, "--img", str(imgsz),
            "--nosave", "--project", str(out), *extra]
    return argv, dict(os.environ)


def run_once(argv, env):
    """(wall s, CPU s, {preprocess, inference, postprocess} ms per image) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
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
    p.add_argument("--peer-python", default="/tmp/peers-venv/bin/python")
    p.add_argument("--out", default="/tmp/openvino_speed_runs", help="where the runs' folders go")
    a = p.parse_args()
    sides = [("ours", *parse_side(s)) for s in a.ours] + [("peer", *parse_side(s)) for s in a.peer]
    print(f"load before: {os.getloadavg()}")
    times = {(side, label): [] for side, label, _, _ in sides}
    for r in range(a.rounds):
        for side, label, weights, extra in sides:  # each round runs every side once: they meet the same load
            times[side, label].append(run_once(*command(side, weights, extra, a.source, a.imgsz, a.peer_python,
                                                        a.out)))
            wall, cpu, speed = times[side, label][-1]
            print(f"round {r} {side:4s} {label:24s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                  f"inference {speed['inference']:6.1f} ms (median image {speed['median']:6.1f})  "
                  f"pre {speed['preprocess']:5.1f}  post {speed['postprocess']:5.1f}", flush=True)
    print(f"load after: {os.getloadavg()}")
    print(f"\nmedians of {a.rounds} rounds: side, label, wall s, CPU s, inference ms/image (mean, median image), "
          "pre, post")
    for (side, label), runs in times.items():
        med = [statistics.median(v) for v in zip(*[(w, c, s["inference"], s["median"], s["preprocess"],
                                                    s["postprocess"]) for w, c, s in runs])]
        print(f"{side:4s} {label:24s} " + "  ".join(f"{v:7.2f}" for v in med))


if __name__ == "__main__":
    main()
