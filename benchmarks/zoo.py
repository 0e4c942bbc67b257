"""The model zoo's figures (not assertions), as docs/zoo.md and docs/blocks.md show them.

    python -m benchmarks.zoo                       # every model name: parameters and GFLOPs at 640 (nc=80)
    python -m benchmarks.zoo --speed yolov5n.yaml yolov5n-se.yaml yolov5n-cbam.yaml --imgsz 320 --rounds 7

Parameters are those of the model as trained (unfused), GFLOPs as `BaseModel.info` counts them (2 per multiply-add
of every convolution and linear layer, at 640 x 640; the attention products of C3TR, C2PSA and C3STR are not
counted). `--speed` times the fused model at batch 1 in eval mode on this CPU, round-robin over the models (each
round times every model once, after one untimed pass), so that a machine busy with other work slows them alike;
the table gives each model's median over the rounds and its ratio to the first model's.
"""

import argparse
import statistics
import time

import torch

from models.yolo import (
    MODELS_DIR,
    BaseModel,
    ClassificationModel,
    DetectionModel,
    PoseModel,
    SegmentationModel,
    eval_idle_layers,
    parse_model,
    yaml_model_load,
)

ONE_SIZE = ("yolov5n6", "yolov5s6", "yolov5m6", "yolov5l6", "yolov5x6")  # listed as files of their own


def model_class(name):
    return (ClassificationModel if "-cls" in name else SegmentationModel if "-seg" in name else
            PoseModel if "-pose" in name else DetectionModel)


def zoo_names():
    """Every name --cfg takes, grouped: (file, [names]); a file with `scales` gives one name per scale."""
    groups = []
    for f in sorted(MODELS_DIR.glob("*.yaml")):
        d = yaml_model_load(f.name)
        if "scales" in d:
            stem = f.stem.replace("yolov5", "yolov5{s}", 1) if f.stem.startswith("yolov5") else (
                f.stem.replace("yolov8", "yolov8{s}", 1).replace("yolo11", "yolo11{s}", 1))
            groups.append((f.name, [stem.format(s=s) + ".yaml" for s in d["scales"]]))
        else:
            groups.append((f.name, [f.name]))
    return groups


def figures(name):
    """(parameters, GFLOPs at 640) of a model name at the YAML's nc, from its layers built on the meta device (shapes
    only: no memory, no time), run at 128 px (the largest stride) and counted as `BaseModel.info` counts them."""
    d = yaml_model_load(name)
    model = BaseModel()
    with torch.device("meta"):
        model.model, model.save = parse_model(d, d.get("ch", 3))
    model.eval_idle = eval_idle_layers(model.model)
    model.yaml, model.stride = d, torch.tensor([128.0])
    head = model.model[-1]
    if "stride" in head._buffers:  # the decode reads its strides as numbers, which meta tensors are not
        head.stride = torch.ones(head.stride.shape)
    return sum(p.numel() for p in model.parameters()), model._gflops(640)


@torch.no_grad()
def speeds(names, imgsz, rounds):
    models = {n: model_class(n)(n, nc=3).eval().fuse() for n in names}
    x = torch.rand(1, 3, imgsz, imgsz)
    for m in models.values():
        m(x)
    times = {n: [] for n in names}
    for _ in range(rounds):
        for n, m in models.items():
            t0 = time.perf_counter()
            m(x)
            times[n].append(time.perf_counter() - t0)
    return {n: 1e3 * statistics.median(t) for n, t in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--speed", nargs="+", metavar="CFG", help="time these models instead (the first is the base)")
    p.add_argument("--imgsz", type=int, default=320, help="--speed: input size")
    p.add_argument("--rounds", type=int, default=7, help="--speed: timed rounds")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    opt = p.parse_args()
    torch.set_num_threads(opt.threads)
    if opt.speed:
        ms = speeds(opt.speed, opt.imgsz, opt.rounds)
        base = ms[opt.speed[0]]
        print(f"| model | ms/image at {opt.imgsz} (CPU, {opt.threads} threads) | x {opt.speed[0]} |\n|---|---|---|")
        for n, t in ms.items():
            print(f"| {n} | {t:.1f} | {t / base:.2f} |")
        return
    print("| file | name | parameters | GFLOPs (640) |\n|---|---|---|---|")
    for file, names in zoo_names():
        for name in names:
            n, g = figures(name)
            print(f"| {file} | {name} | {n:,} | {g:.1f} |", flush=True)


if __name__ == "__main__":
    main()
