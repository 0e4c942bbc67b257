"""Per-image matching in the box validators reads each image's predictions into the host once: the labels and the
IoU thresholds are on the CPU already (on a GPU each further read waits for the device)."""

from types import SimpleNamespace

import torch

from data.targets import Targets
from engine.options import PoseValOptions
from engine.tasks import TASKS
from engine.validator import ValOptions
from utils.ops import OutputLayout

DetectionValidator = TASKS["detect"].validator
PoseValidator = TASKS["pose"].validator


class OnDevice(torch.Tensor):
    """Stands for a tensor on a GPU: each read into the host (a copy to the CPU, a Python value, a boolean mask's
    indices) is recorded; a copy to the CPU gives an ordinary tensor, whatever follows from it is the host's."""

    reads = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        out = super().__torch_function__(func, types, args, kwargs or {})
        bool_index = name == "__getitem__" and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool
                                                   for a in (args[1] if isinstance(args[1], tuple) else (args[1],)))
        if name in ("cpu", "item", "tolist", "numpy", "__bool__", "__float__", "__int__", "nonzero") or bool_index:
            cls.reads.append(name)
            if name == "cpu":
                return out.as_subclass(torch.Tensor)
        return out


def _batch(n_images, kpts=None):
    """Two labels per image (cls, xywh normalised) on the CPU, letterboxed 64 x 64 from 128 x 96 originals."""
    g = torch.Generator().manual_seed(0)
    rows = [[i, c, 0.25 + 0.5 * c, 0.5, 0.3, 0.4] for i in range(n_images) for c in (0, 1)]
    keypoints = torch.rand(len(rows), kpts, 3, generator=g) if kpts else None
    return {"img": torch.zeros(n_images, 3, 64, 64), "targets": Targets.from_rows(torch.tensor(rows), (64, 64),
                                                                                    keypoints=keypoints),
            "shapes": [((96, 128), ((0.5, 0.5), (0.0, 8.0)))] * n_images,
            "paths": [f"/x/{i}.jpg" for i in range(n_images)]}


def _preds(n_images, extra=0):
    """Each image's NMS rows (xyxy input pixels, conf, cls, keypoint columns): boxes near its labels, and one off."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n_images):
        b = torch.tensor([[6.0, 19, 26, 45, 0.9, 0], [38, 19, 58, 45, 0.8, 1], [0, 0, 10, 10, 0.3, 2]])
        b[:, :4] += torch.rand(3, 4, generator=g)
        out.append(torch.cat((b, torch.rand(3, extra, generator=g) * 64), 1))
    return out


def _validate(validator, layout, batch, preds, device_preds):
    validator.init_metrics(SimpleNamespace(output_layout=layout))
    OnDevice.reads.clear()
    boxes = [p.as_subclass(OnDevice) if device_preds else p for p in preds]
    record = validator.update_metrics([{"boxes": b} for b in boxes], batch)
    return record, list(OnDevice.reads)


def test_each_image_s_predictions_come_to_the_host_once(tmp_path):
    n = 3
    for validator, layout, kpts in (
        (DetectionValidator(ValOptions(imgsz=64), tmp_path, {0: "a", 1: "b", 2: "c"}), OutputLayout(3), None),
        (PoseValidator(PoseValOptions(imgsz=64, kpt_shape=(4, 3)), tmp_path, {0: "a", 1: "b", 2: "c"}),
         OutputLayout(3, kpt_shape=(4, 3)), 4),
    ):
        batch, preds = _batch(n, kpts), _preds(n, 3 * kpts if kpts else 0)
        ref, _ = _validate(validator, layout, batch, preds, device_preds=False)
        record, reads = _validate(validator, layout, batch, preds, device_preds=True)
        assert reads == ["cpu"] * n
        assert record.keys() == ref.keys() and any(t.any() for t in ref["tp"])  # some matches, the same ones
        for k in ref:
            assert all(torch.equal(a, b) for a, b in zip(record[k], ref[k])), k
        assert all(type(t) is torch.Tensor and t.device.type == "cpu" for v in record.values() for t in v
                   if isinstance(t, torch.Tensor))


def test_labels_stay_on_the_cpu_and_the_loss_takes_its_own_copy(tmp_path):
    """preprocess moves the images (and masks) to the device, not the labels; the validation loss gets device
    copies of what it reads. The meta device stands for a GPU: whatever reached it would say so."""
    seen = {}

    def criterion(preds, batch):
        t = batch["targets"]
        seen.update({"targets": t.device.type, "keypoints": t.keypoints.device.type})
        return torch.zeros(()), torch.zeros(3)

    validator = PoseValidator(PoseValOptions(imgsz=64, kpt_shape=(4, 3)), tmp_path, {0: "a"}, criterion=criterion)
    validator.loss_inputs = lambda preds: preds
    batch = validator.preprocess(_batch(2, kpts=4), torch.device("meta"), half=False)
    assert batch["img"].device.type == "meta"
    assert batch["targets"].device.type == batch["targets"].keypoints.device.type == "cpu"
    validator._loss(None, batch)
    assert seen == {"targets": "meta", "keypoints": "meta"}
