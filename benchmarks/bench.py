"""Speed figures on this machine (not assertions): training images/s, dataloader images/s with mosaic, and
inference ms/image for the fused model at batch 1. These time the model step on prefetched batches; whole-run
figures (start-up, data, validation, saving) come from timing the scripts themselves.

    python -m benchmarks.bench                                  # yolov5n, yolov8n, yolov7-tiny, seg, cls at 320/640
    python -m benchmarks.bench --models yolov8n.yaml --imgsz 640 --amp bf16 --channels-last
    python -m benchmarks.bench --device 0 --amp fp16 --imgsz 640 --train-imgsz 640 --batch 64   # one GPU
"""

import argparse
import time

import torch

from data.dataset_yaml import check_det_dataset
from data.detect_dataset import YOLODataset
from data.loader import build_dataloader
from models.yolo import ClassificationModel, DetectionModel, SegmentationModel
from utils import ops
from utils.dist import select_device
from utils.files import ROOT, find_file, yaml_load
from utils.torch_utils import peak_memory, to_float32


def model_for(cfg, nc=3):
    cls = ClassificationModel if "-cls" in cfg else SegmentationModel if "-seg" in cfg else DetectionModel
    return cls(cfg, nc=nc)


def data_for(cfg):
    return ROOT / "data" / ("shapes-seg.yaml" if "-seg" in cfg else "shapes.yaml")


def detection_batches(cfg, imgsz, batch, n, workers, data=None):
    """n collated training batches (fewer if the set has fewer) of `data` (default: the synthetic shapes set for the
    model's task) with mosaic, and the loader's images/s."""

    data = check_det_dataset(data or data_for(cfg))
    hyp = yaml_load(find_file("hyp.scratch-low.yaml", "data/hyps"))
    task = "segment" if "-seg" in cfg else "detect"
    ds = YOLODataset(data["train"], imgsz=imgsz, batch_size=batch, augment=True, hyp=hyp, task=task, nc=data["nc"])
    loader = build_dataloader(ds, batch, workers, shuffle=True)
    batches, t0 = [], time.perf_counter()
    for b in loader:
        batches.append(b)
        if len(batches) == n:
            break
    return batches, len(batches) * batch / (time.perf_counter() - t0)


def classification_batches(imgsz, batch, n):
    g = torch.Generator().manual_seed(0)
    return [{"img": torch.rand(batch, 3, imgsz, imgsz, generator=g), "cls": torch.randint(0, 3, (batch,), generator=g)}
            for _ in range(n)]


def bench_train(cfg, imgsz, batch, steps, amp, channels_last, workers, device, profile_steps=0, data=None):
    model = model_for(cfg).train().to(device)
    hyp = yaml_load(find_file(model.default_hyp or "hyp.scratch-low.yaml", "data/hyps"))
    criterion = model.init_criterion(hyp, imgsz=imgsz)
    if "-cls" in cfg:
        batches, loader_ips = classification_batches(imgsz, batch, steps + 1), float("nan")
    else:
        batches, loader_ips = detection_batches(cfg, imgsz, batch, steps + 1, workers, data)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")

    def step(b):
        img = b["img"].to(device).float() / (255 if b["img"].dtype == torch.uint8 else 1)
        b = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}
        b["img"] = img.contiguous(memory_format=memory_format)
        with autocast(device, amp):
            preds = model(b["img"])
        loss, _ = criterion(to_float32(preds), b)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    ips = steps * batch / timed_steps(batches, steps, step, device)
    if profile_steps:
        print(f"{cfg}: torch.profiler over {profile_steps} steps after the timed ones")
        print(profiled_steps(batches, profile_steps, step, device))
    return ips, loader_ips


def timed_steps(batches, steps, step, device):
    """Seconds that `steps` calls of `step` take after one untimed call (which warms up the allocators), the
    batches taken in turn and cycled: a small set has fewer batches than --steps (256 images make 4 of 64)."""
    step(batches[0])
    sync(device)
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        step(batches[i % len(batches)])
    sync(device)
    return time.perf_counter() - t0


def profiled_steps(batches, steps, step, device, rows=25):
    """torch.profiler's table of `steps` training steps: the operators that take the time, on the GPU where there is
    one (kernels are what a slow step is made of there), else on the CPU."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(steps):
            step(batches[i % len(batches)])
        sync(device)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows)


def autocast(device, amp):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp, torch.float32)
    return torch.autocast(device.type, dtype=dtype, enabled=amp != "off")


def sync(device):
    """Wait for queued GPU work, so that wall-clock times cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def bench_infer(cfg, imgsz, runs, amp, channels_last, device, fuse=True):
    model = model_for(cfg).eval()
    if fuse:  # Conv+BN folding; for YOLOv7 also RepConv re-parameterisation and implicit-layer folding
        model.fuse()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format)
    x = torch.rand(1, 3, imgsz, imgsz, device=device).contiguous(memory_format=memory_format)
    times = []
    for i in range(runs + 2):
        t0 = time.perf_counter()
        with autocast(device, amp):
            y = model(x)
        if "-cls" not in cfg:
            layout = model.output_layout
            ops.non_max_suppression(layout.split(y)[0].float(), 0.25, 0.45, layout=layout)
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+",
                   default=["yolov5n.yaml", "yolov8n.yaml", "yolov7-tiny.yaml", "yolov8n-seg.yaml", "yolov8n-cls.yaml"])
    p.add_argument("--imgsz", nargs="+", type=int, default=[320, 640], help="inference sizes")
    p.add_argument("--train-imgsz", type=int, default=320)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off", help="fp16 needs CUDA")
    p.add_argument("--device", default="cpu", help="cpu, or a CUDA index such as 0")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--no-fuse", action="store_true", help="time inference in the training structure")
    p.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per input shape")
    p.add_argument("--profile-steps", type=int, default=0, help="then print torch.profiler's table of N train steps")
    p.add_argument("--data", help="dataset YAML of the training batches (default: the shapes set of the model's task)")
    opt = p.parse_args()
    torch.set_num_threads(opt.threads)
    torch.backends.cudnn.benchmark = opt.cudnn_benchmark
    device = select_device(opt.device)
    print(f"torch {torch.__version__}, {device}, {opt.threads} threads, amp={opt.amp}, "
          f"channels_last={opt.channels_last}, fused={not opt.no_fuse}, cudnn.benchmark={opt.cudnn_benchmark}")
    header = "".join(f"{f'infer {s} ms':>14}" for s in opt.imgsz)
    print(f"{'model':<20}{'train img/s':>12}{'loader img/s':>14}{header}{'GPU GiB alloc':>14}{'reserved':>10}")
    for cfg in opt.models:
        if not (ROOT / "models" / cfg.replace("yolov8n", "yolov8")).exists():
            print(f"{cfg:<20} (no such model YAML yet)")
            continue
        train_imgsz = 96 if "-cls" in cfg else opt.train_imgsz
        peak_memory(device, reset=True)
        ips, loader = bench_train(cfg, train_imgsz, opt.batch, opt.steps, opt.amp, opt.channels_last, opt.workers,
                                  device, opt.profile_steps, opt.data)
        inf = [bench_infer(cfg, 96 if "-cls" in cfg else s, opt.runs, opt.amp, opt.channels_last, device,
                           not opt.no_fuse) for s in opt.imgsz]
        alloc, reserved = peak_memory(device) or (0.0, 0.0)
        print(f"{cfg:<20}{ips:>12.1f}{loader:>14.1f}" + "".join(f"{t:>14.1f}" for t in inf)
              + f"{alloc:>14.2f}{reserved:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
