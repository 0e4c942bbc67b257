"""The peers' batch-1 inference step, timed as `bench.py` times ours (fused model, forward + NMS at conf 0.25 /
IoU 0.45, 2 warm-up runs, median of --runs, --threads torch threads), so the two can be put side by side on one
machine. Run it with the peers' interpreter (`bash ../shared/peers/setup.sh`):

    source /tmp/peers-venv/peer-env.sh
    /tmp/peers-venv/bin/python -m benchmarks.peer_forward --imgsz 320 640
    python -m benchmarks.bench --models yolov8n.yaml --imgsz 320 640 --amp bf16 --channels-last

Prints the Ultralytics YOLOv8n figures in its own default path (fp32, default memory layout), as its predict runs.
"""

import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--imgsz", nargs="+", type=int, default=[320, 640])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    opt = p.parse_args()
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.nms import non_max_suppression

    torch.set_num_threads(opt.threads)
    model = DetectionModel("yolov8n.yaml", nc=3, verbose=False).fuse(verbose=False).eval()
    for imgsz in opt.imgsz:
        x = torch.rand(1, 3, imgsz, imgsz)
        times = []
        with torch.inference_mode():
            for i in range(opt.runs + 2):
                t0 = time.perf_counter()
                non_max_suppression(model(x), 0.25, 0.45)
                if i >= 2:
                    times.append(time.perf_counter() - t0)
        times.sort()
        print(f"ultralytics yolov8n {imgsz} px: {1e3 * times[len(times) // 2]:.1f} ms")


if __name__ == "__main__":
    main()
