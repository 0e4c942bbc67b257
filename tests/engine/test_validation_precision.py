"""Validation inside training runs the model under the training's autocast dtype (bf16 on CPU here); the final
validation of best.pt and the val scripts run it in fp32. The heads decode, and losses, NMS and metrics take, fp32."""

import pytest
import torch

import engine.trainer
import train
from engine.validator import BaseValidator
from tests.test_val_sharding import CASES, NAMES, _dataset, _model, _perturb
from utils.files import find_file, yaml_load


def _validate(case, model, data_path, save_dir, amp_dtype):
    _, _, validator_cls, _, hyp = CASES[case]
    criterion = model.init_criterion(yaml_load(find_file(hyp, "data/hyps")), imgsz=64)
    options = validator_cls.options(imgsz=64, batch=4, workers=0, plots=False)  # the task's own class
    data = validator_cls.get_data(str(data_path), options)
    validator = validator_cls(options, save_dir, data["names"], criterion=criterion)
    validator.build_dataloader(data["val"], int(max(model.stride)))
    seen = []  # (first conv's output dtype, head's decoded output dtype) per batch
    hooks = [model.model[0].conv.register_forward_hook(lambda m, i, o: seen.append(o.dtype)),
             model.model[-1].register_forward_hook(lambda m, i, o: seen.append(o[0].dtype))]
    try:
        stats = validator(model, amp_dtype=amp_dtype)
    finally:
        for h in hooks:
            h.remove()
    return stats, set(seen)


@pytest.mark.parametrize("case", ["v8", "v5", "v8seg", "cls"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])  # fp16: what CUDA training validates in
def test_half_precision_validation_runs_in_it_and_agrees_with_fp32(tmp_path, dtype, case):
    task = CASES[case][3]
    data = _dataset(tmp_path / "data", task)
    model = _perturb(_model(case), task)
    full, dtypes = _validate(case, model, data, tmp_path / "fp32", None)
    assert dtypes == {torch.float32}
    half, dtypes = _validate(case, model, data, tmp_path / "half", dtype)
    assert dtypes == {dtype, torch.float32}  # the convs in half precision, the head's decoded outputs in fp32
    assert len(NAMES) == model.nc
    # the losses see every raw output: bf16's 8 significand bits move them by about 0.1 %. (An untrained model's mAP
    # is a few lucky matches, too few to compare; docs/recipes.md compares mAP of trained models.)
    losses = [k for k in full if k.startswith("val/")]
    assert losses
    for k in losses:
        assert abs(half[k] - full[k]) <= 0.01 * full[k], (k, full[k], half[k])
    assert next(model.parameters()).dtype == torch.float32  # autocast casts per op, the model keeps its weights


def test_training_validates_each_epoch_in_its_amp_dtype_and_best_pt_in_fp32(shapes_detect, tmp_path, monkeypatch,
                                                                             yolo_log):
    """bf16 and fp32 runs validate best.pt in fp32 (fp16 runs in fp16: tests/engine/test_amp_scaler.py). On CUDA
    each epoch's training, each validation and the final one log the allocator's peaks, each from a reset."""
    calls = []
    call = BaseValidator.__call__

    def spy(self, model, final=False, amp_dtype=None, half=None):
        calls.append((final, amp_dtype, half))
        return call(self, model, final=final, amp_dtype=amp_dtype, half=half)

    peaks = []  # a CUDA allocator's peaks since each reset, as torch_utils.peak_memory gives them

    def peak_memory(device, reset=False):
        assert reset
        peaks.append(len(peaks) + 1)
        return peaks[-1], 2 * peaks[-1]

    monkeypatch.setattr(BaseValidator, "__call__", spy)
    monkeypatch.setattr(engine.trainer, "peak_memory", peak_memory)
    args = ["--data", str(shapes_detect), "--cfg", "yolov8n.yaml", "--imgsz", "64", "--batch-size", "8",
            "--epochs", "2", "--workers", "0", "--device", "cpu", "--noplots", "--project", str(tmp_path)]
    train.main(train.parse_opt([*args, "--amp", "bf16", "--name", "bf16"]))
    assert calls == [(False, torch.bfloat16, None), (False, torch.bfloat16, None), (True, None, False)]
    lines = [m for m in yolo_log if m.startswith("GPU memory peak")]
    assert lines == [f"GPU memory peak in {what}: {i:.2f} GiB allocated, {2 * i:.2f} GiB reserved" for i, what in
                     enumerate(["training epoch 1", "validation 1", "training epoch 2", "validation 2",
                                "the final validation"], 1)]
    calls.clear()
    train.main(train.parse_opt([*args, "--amp", "off", "--name", "fp32"]))
    assert calls == [(False, None, None), (False, None, None), (True, None, False)]
