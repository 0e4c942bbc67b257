"""benchmarks/bench.py: the train rate is the images of the steps it timed over the time they took."""

from types import SimpleNamespace

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks import bench
from data.targets import Targets


def test_train_rate_cycles_the_batches_and_divides_by_the_steps_timed(monkeypatch):
    """A set with fewer batches than --steps (256 images, --batch 64 --steps 10) is cycled: every step is timed and
    counted. The clock reads the optimizer steps taken, so each step "lasts" one second and the rate must be one
    batch per second exactly."""
    g = torch.Generator().manual_seed(0)
    batches = [{"img": torch.randint(0, 256, (2, 3, 64, 64), dtype=torch.uint8, generator=g),
                "targets": Targets.from_rows(torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.3], [1, 0, 0.3, 0.6, 0.2, 0.2]]),
                                             (64, 64))}
               for _ in range(2)]
    monkeypatch.setattr(bench, "detection_batches", lambda cfg, imgsz, batch, n, workers, data: (batches, 100.0))
    steps = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: steps.append(1))
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: float(len(steps))))
    try:
        ips, loader_ips = bench.bench_train("yolov8n.yaml", 64, 2, 5, "off", False, 0, torch.device("cpu"))
    finally:
        handle.remove()
    assert len(steps) == 1 + 5  # one warm-up step, then the 5 timed ones, over the 2 batches in turn
    assert (ips, loader_ips) == (2.0, 100.0)
