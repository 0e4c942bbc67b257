"""A val or predict batch costs what its memory allows (issue 61, round 2; engine/eval_memory.py, docs/safety.md):
a checkpoint whose run record gives image size 4096 made `val.py --weights X` take about 7 GB. One image's cost is
counted by a dry run at the image size; the batch is made smaller where it does not fit, and one image that does not
is refused in one line naming an --img that does.
"""

import math

import pytest
import torch
import torch.nn as nn

from engine import eval_memory
from engine.eval_memory import image_cost, settle_batch
from models.yolo import DetectionModel, SegmentationModel
from tests.capped import refused_once, run_capped
from utils.budget import EVAL_BYTES_PER_INPUT, EVAL_MEMORY_FRACTION, EVAL_PEAK_FACTOR, EXPORT_TRACE_FACTOR
from utils.dry_run import dry_run
from utils.errors import BadOption

GiB = 1 << 30


def two_convs():
    """conv 3->8, SiLU, conv 8->4 at 'same' padding: at H x W, float32, the live bytes peak while SiLU runs (its
    input and output: 2 x 8 x 4 bytes a pixel), then 8 x 4 + 4 x 4 while the last conv runs: 64 bytes a pixel."""
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 4, 3, padding=1)).eval()


def free(n):
    return lambda device: n


@pytest.mark.parametrize("side", [32, 96])
def test_the_peak_is_what_is_live_at_once_not_every_output(side):
    probe, _ = dry_run(two_convs(), (1, 3, side, side))
    assert probe.peak == 64 * side * side
    assert probe.bytes == (8 + 8 + 4) * 4 * side * side  # every output, for comparison


def test_an_image_costs_its_peak_twice_and_itself_as_uint8_and_float32():
    cost = image_cost(two_convs(), 32)
    assert (cost.bytes, cost.shape, cost.how) == (EVAL_PEAK_FACTOR * 64 * 32 * 32 + 5 * 3 * 32 * 32, (3, 32, 32),
                                                  "dry run")
    assert image_cost(two_convs(), (32, 64)).bytes == 2 * cost.bytes  # costs grow with the pixels


def test_a_batch_that_fits_is_kept():
    cost = image_cost(two_convs(), 64).bytes
    budget = 32 * cost
    assert settle_batch(two_convs(), 64, 32, "cpu", "w", free_memory=free(2 * budget)) == 32
    assert settle_batch(two_convs(), 64, 32, "cpu", "w", free_memory=free(2 * budget - 2)) == 31


def test_a_batch_that_does_not_fit_is_made_smaller_in_one_line(yolo_log):
    """A huge batch of small images: as many as fit in half the free memory."""
    cost = image_cost(two_convs(), 64).bytes
    n = 4 * GiB
    assert settle_batch(two_convs(), 64, 10 ** 9, "cpu", "--weights w", free_memory=free(n)) == int(
        n * EVAL_MEMORY_FRACTION) // cost
    said = [m for m in yolo_log if "--batch-size" in m]
    assert len(said) == 1 and said[0].startswith(f"--batch-size {10 ** 9} -> {int(n * EVAL_MEMORY_FRACTION) // cost}:")
    assert "evaluating one 64x64 image takes about" in said[0]
    assert "the budget is 2.00 GiB (half the 4.00 GiB free on cpu)" in said[0]


def test_one_image_over_the_budget_is_refused_naming_an_img_that_fits():
    model = two_convs()
    side = 4096
    cost = image_cost(model, side).bytes  # 2 x 64 + 15 bytes a pixel: 2.23 GiB
    n = 3 * GiB
    with pytest.raises(BadOption) as e:
        settle_batch(model, side, 1, "cpu", "--weights w.pt", free_memory=free(n))
    fits = int(side * math.sqrt(n * EVAL_MEMORY_FRACTION / cost)) // 32 * 32
    assert str(e.value) == (f"--weights w.pt: evaluating one 4096x4096 image takes about {cost / GiB:.2f} GiB "
                            "(dry run), and the budget is 1.50 GiB (half the 3.00 GiB free on cpu): pass --img "
                            f"{fits} or less (docs/safety.md)")
    assert settle_batch(model, fits, 1, "cpu", "w", free_memory=free(n)) == 1  # and that size is taken


def test_an_export_is_counted_traced_and_refused_rather_than_made_smaller():
    """An export writes its batch into the file: where it does not fit it is refused, naming the batch that would;
    its trace counts EXPORT_TRACE_FACTOR evaluations."""
    cost = image_cost(two_convs(), 64).bytes * EXPORT_TRACE_FACTOR
    n = int(2 * 10 * cost / EVAL_MEMORY_FRACTION) // 2  # ten traced images fit
    assert settle_batch(two_convs(), 64, 10, "cpu", "w", free_memory=free(n), export=True) == 10
    with pytest.raises(BadOption, match=r"^--weights w: evaluating one 64x64 image takes about .* \(dry run, "
                                        r"traced\), .*: pass --batch-size 10 or less \(docs/safety.md\)$"):
        settle_batch(two_convs(), 64, 16, "cpu", "--weights w", free_memory=free(n), export=True)
    assert settle_batch(two_convs(), 64, 100, "cpu", "w", free_memory=free(n)) == 10 * EXPORT_TRACE_FACTOR  # val


def test_no_memory_left_names_no_size():
    with pytest.raises(BadOption, match=r": free memory, or use a smaller model \(docs/safety.md\)$"):
        settle_batch(two_convs(), 64, 1, "cpu", "w", free_memory=free(1000))


def test_a_segmentation_val_counts_the_masks_it_decodes_for_one_image():
    """YOLOv8x-seg's val at 1280 px, batch 1, a random model (300 masks an image at conf 0.001): 8.4 GB peak against
    1.8 GB for YOLOv8x. The masks are decoded one image at a time: their bytes are counted once, not per image."""
    seg, det = SegmentationModel("yolov8n-seg.yaml", nc=3).eval(), DetectionModel("yolov8n.yaml", nc=3).eval()
    masks = 16 * 300 * 640 * 640
    assert eval_memory.mask_bytes(seg, 640, 300) == masks and eval_memory.mask_bytes(det, 640, 300) == 0
    cost = image_cost(seg, 640).bytes
    n = 2 * (masks + 5 * cost)
    assert settle_batch(seg, 640, 32, "cpu", "w", masks=300, free_memory=free(n)) == 5
    assert settle_batch(det, 640, 32, "cpu", "w", masks=300, free_memory=free(n)) == 32
    with pytest.raises(BadOption, match=r"and decoding its 300 masks 1.83 GiB, .*: pass --img \d+ or less or a "
                                        r"smaller --max-det \(docs/safety.md\)$"):
        settle_batch(seg, 640, 1, "cpu", "w", masks=300, free_memory=free(masks))


def test_unknown_memory_leaves_the_batch_as_it_is():
    assert settle_batch(two_convs(), 4096, 64, "cpu", "w", free_memory=free(None)) == 64


class ReadsValues(nn.Module):
    """A forward pass whose shapes depend on its input's values: no dry run can count it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(x)[:, : int(x.sum().item()) % 4 + 1]


class RefusesMeta(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        raise NotImplementedError("this block runs on real devices only")


@pytest.mark.parametrize("model", [ReadsValues(), RefusesMeta()])
def test_a_dry_run_that_fails_counts_the_fixed_rate_per_input_value(model, yolo_log):
    model.train()
    cost = image_cost(model, 64)
    assert (cost.bytes, cost.how) == (3 * 64 * 64 * (EVAL_BYTES_PER_INPUT + 5),
                                      f"{EVAL_BYTES_PER_INPUT} bytes per input value, no dry run")
    assert any("a dry run of the model could not count it" in m for m in yolo_log)
    assert model.training and all(p.device.type == "cpu" for p in model.parameters())  # left as it was


def test_an_export_counts_the_fixed_rate_per_input_value():
    class Export:  # an InferenceBackend of an ONNX file: a format, no torch module
        format, model = "onnx", None

    assert image_cost(Export(), 64).how == f"{EVAL_BYTES_PER_INPUT} bytes per input value, an export"


class CachesGrid(nn.Module):
    """A layer that keeps a grid per input shape, as YOLOv5's own Detect head does (and a user's block may): made in
    a dry run, it would be a meta tensor that a real pass at that shape then reads; and a buffer registered in the
    forward pass."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.grid, self.shape = torch.zeros(0), None

    def forward(self, x):
        if self.shape != x.shape:
            self.shape = x.shape
            self.grid = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype).expand(x.shape[-2], -1)
            self.register_buffer("seen", torch.ones(1, device=x.device))
        return self.conv(x) + self.grid


def test_a_dry_run_leaves_no_meta_state_in_the_model():
    model = CachesGrid().train()
    assert image_cost(model, 64).how == "dry run"
    assert model.training and model.shape is None and "seen" not in dict(model.named_buffers())
    x = torch.rand(1, 3, 64, 64)
    assert torch.equal(model(x), model.conv(x) + torch.arange(64.0).expand(64, -1))


@pytest.mark.parametrize("cls, cfg", [(DetectionModel, "yolov8n.yaml"), (SegmentationModel, "yolov8n-seg.yaml"),
                                      (DetectionModel, "yolov8n-p2.yaml")])
def test_a_model_counted_runs_as_before(cls, cfg):
    """The dry run leaves nothing of itself in the model (a head's anchors made on the meta device): its outputs
    after are what they were before, and the peak grows with the pixels."""
    torch.manual_seed(0)
    model = cls(cfg, nc=3).fuse().eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)[0]
    small, large = image_cost(model, 320), image_cost(model, 640)
    with torch.no_grad():
        after = model(x)[0]
    assert torch.equal(before, after)
    assert 3.9 < large.bytes / small.bytes < 4.1  # the pixels: 4x


def test_a_model_of_one_input_channel_is_counted_at_one_channel():
    cost = image_cost(DetectionModel("yolov8n.yaml", ch=1, nc=3).eval(), 64)
    assert cost.shape == (1, 64, 64) and cost.how == "dry run"


def test_the_memory_read_is_split_among_the_ranks_of_one_machine(monkeypatch):
    monkeypatch.setattr(eval_memory, "available_memory", lambda: 8 * GiB)
    monkeypatch.setattr(eval_memory, "get_local_world_size", lambda: 4)
    assert eval_memory.device_memory("cpu") == 2 * GiB


def test_a_checkpoint_giving_4096_px_is_refused_before_the_data_is_read(tmp_path):
    """YOLOv8n at 4096 px: about 1.7 GiB an image as counted (1.4 measured), twice that traced for an export (3.3 GB
    measured). Under a 3 GiB memory cap (torch's libraries and threads hold about 1.6 of it) each script refuses it in
    one line, far under the cap, before the dataset (which does not exist) or the source is read, or a file written."""
    from models.checkpoints import model_to_ckpt, save_checkpoint

    model = DetectionModel("yolov8n.yaml", nc=3)
    model.names = {0: "a", 1: "b", 2: "c"}
    weights = tmp_path / "v8n.pt"
    save_checkpoint({"model": model_to_ckpt(model), "ema": None,
                     "opt": {"train_imgsz": 4096, "data_path": str(tmp_path / "gone.yaml")}}, weights)
    out = ["--project", str(tmp_path / "r")]
    for script, args in (("val.py", out), ("detect.py", ["--source", str(tmp_path / "none.jpg"), *out]),
                         ("export.py", ["--include", "onnx"])):
        r = run_capped([script, "--weights", str(weights), "--device", "cpu", *args], limit=3 * GiB)
        assert refused_once(r, f"--weights {weights}: evaluating one 4096x4096 image takes about"), r.stderr[-2000:]
        traced = ", traced" if script == "export.py" else ""
        assert f"(dry run{traced}), and the budget is" in r.errors[0] and "pass --img" in r.errors[0]
        assert r.peak < GiB
