"""utils/autobatch: AutoBatch's arithmetic with a fake memory reader (a line of memory per image, an out-of-memory
batch), and `batch=-1` training on a CPU with the fixed batch and one line saying so."""

import pytest

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


@pytest.mark.slow
def test_batch_minus_one_trains_on_a_cpu_at_the_fixed_batch(shapes_detect, tmp_path, yolo_log):
    from yolo import YOLO

    model = YOLO("yolov8n.yaml")
    model.train(data=str(shapes_detect), epochs=1, imgsz=64, batch=-1, workers=0, device="cpu", noplots=True,
                project=str(tmp_path), name="auto")
    assert f"on a CPU training uses batch {CPU_BATCH}" in " ".join(yolo_log)
    assert model.trainer.opt.batch_size == CPU_BATCH and model.trainer.batch_size == CPU_BATCH
