"""utils/autobatch: AutoBatch's arithmetic with a fake memory reader (a line of memory per image, an out-of-memory
batch) and a fake clock (the trials' time budget), the CUDA trial steps run on a CPU model with torch.cuda's memory
functions faked, and `batch=-1` training on a CPU with the fixed batch and one line saying so."""

import pytest
import torch

import utils.autobatch as autobatch
from models.yolo import DetectionModel
from utils.autobatch import CPU_BATCH, FRACTION, MAX_BATCH, auto_batch, fit_batch

GIB = 2**30


class FakeGPU:
    """A device whose step of b images takes `fixed` + b x `per_image` bytes, and runs out of memory above `limit`."""

    def __init__(self, free, fixed, per_image, limit=None):
        self.free, self.fixed, self.per_image, self.limit, self.peak, self.steps = free, fixed, per_image, limit, 0, []

    def step(self, b):
        self.steps.append(b)
        if self.limit is not None and b > self.limit:
            raise MemoryError(f"out of memory at {b}")
        self.peak = self.fixed + b * self.per_image

    def read_peak(self):
        value, self.peak = self.peak, 0
        return value


def run(gpu):
    return auto_batch(gpu.step, lambda: gpu.free, gpu.read_peak, lambda e: isinstance(e, MemoryError))


def test_the_batch_fills_the_fraction_of_free_memory_on_the_trials_line():
    gpu = FakeGPU(free=10 * GIB, fixed=1 * GIB, per_image=0.1 * GIB)
    # 0.6 x 10 GiB = 6 GiB = 1 GiB + b x 0.1 GiB  ->  b = 50
    assert FRACTION == 0.6 and run(gpu) == 50 and gpu.steps == [1, 2, 4, 8, 16]


def test_an_out_of_memory_trial_ends_the_trials_and_caps_the_batch():
    gpu = FakeGPU(free=10 * GIB, fixed=1 * GIB, per_image=0.1 * GIB, limit=6)  # 8 images already fail
    assert run(gpu) == 7 and gpu.steps == [1, 2, 4, 8]
    assert run(FakeGPU(free=GIB, fixed=0, per_image=GIB, limit=0)) == 1  # not even one image: the least there is


def test_other_errors_pass_and_the_fit_is_bounded():
    def broken(b):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        auto_batch(broken, lambda: GIB, lambda: 0, lambda e: isinstance(e, MemoryError))
    assert fit_batch({1: 10, 2: 10}, 100 * GIB) == MAX_BATCH  # memory that does not grow with the batch
    assert fit_batch({1: 5 * GIB, 2: 6 * GIB}, 4 * GIB) == 1  # already beyond the fraction


class FakeClock:
    """Seconds that pass only when a trial step runs: `per_image` seconds per image."""

    def __init__(self, gpu, per_image):
        self.gpu, self.per_image, self.now = gpu, per_image, 0.0
        step = gpu.step

        def timed(b):
            step(b)
            self.now += b * per_image

        gpu.step = timed

    def __call__(self):
        return self.now


def test_the_trials_stop_once_their_time_is_spent_and_the_log_gives_each(yolo_log):
    gpu = FakeGPU(free=10 * GIB, fixed=1 * GIB, per_image=0.1 * GIB)
    clock = FakeClock(gpu, per_image=1.0)  # 1, 2, 4 then 8 s: 15 s by the fourth, over the budget of 10
    batch = auto_batch(gpu.step, lambda: gpu.free, gpu.read_peak, lambda e: isinstance(e, MemoryError), clock=clock,
                       budget=10)
    assert batch == 50 and gpu.steps == [1, 2, 4, 8]  # the four on the same line give the same batch
    assert yolo_log[-1] == ("AutoBatch: batch 50, for 60% of 10.00 GiB free (trial steps, images: peak memory, time: "
                            "1: 1.10 GiB, 1000 ms/image, 2: 1.20 GiB, 1000 ms/image, 4: 1.40 GiB, 1000 ms/image, "
                            "8: 1.80 GiB, 1000 ms/image)")
    slow = FakeGPU(free=10 * GIB, fixed=1 * GIB, per_image=0.1 * GIB)
    clock = FakeClock(slow, per_image=100.0)  # the first trial alone is over the budget: a second one still runs
    auto_batch(slow.step, lambda: slow.free, slow.read_peak, lambda e: isinstance(e, MemoryError), clock=clock,
               budget=10)
    assert slow.steps == [1, 2]


def test_the_cuda_trial_steps_on_a_cpu_model_with_fake_memory(monkeypatch):
    """cuda_auto_batch's own steps (forward, backward, gradients let go) on a CPU model; torch.cuda's readers faked:
    each trial's peak is 1 GiB + 0.25 GiB per image the model saw, 8 GiB free, and 16 images run out of memory."""
    model = DetectionModel("yolov8n.yaml", nc=3)
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))

    def forward_limit(m, args):
        if args[0].shape[0] >= 16:
            raise torch.OutOfMemoryError("CUDA out of memory (faked)")

    model.register_forward_pre_hook(forward_limit)
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (8 * GIB, 16 * GIB))
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: GIB + 0.25 * GIB * (seen[-1] if seen else 0))
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: None)
    batch = autobatch.cuda_auto_batch(model, 64, torch.device("cpu"))
    # 0.6 x 8 GiB = 4.8 GiB = 1 GiB + b x 0.25 GiB -> 15.2, and 16 ran out of memory: 15
    assert batch == 15 and seen == [1, 2, 4, 8, 16]
    assert all(p.grad is None for p in model.parameters()) and model.training


@pytest.mark.slow
def test_batch_minus_one_trains_on_a_cpu_at_the_fixed_batch(shapes_detect, tmp_path, yolo_log):
    from yolo import YOLO

    model = YOLO("yolov8n.yaml")
    model.train(data=str(shapes_detect), epochs=1, imgsz=64, batch=-1, workers=0, device="cpu", noplots=True,
                project=str(tmp_path), name="auto")
    assert f"on a CPU training uses batch {CPU_BATCH}" in " ".join(yolo_log)
    assert model.trainer.opt.batch_size == CPU_BATCH and model.trainer.batch_size == CPU_BATCH
