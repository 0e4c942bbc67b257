"""The fp16 GradScaler path of the trainer, on CPU (torch runs fp16 autocast and GradScaler there too): CI has no
GPU, and this is the path CUDA training takes by default."""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import train
import utils.torch_utils
from engine.parts import Optimisation, RunContext
from engine.tasks import TASKS
from engine.trainer import run
from tests.probes import probing
from utils.torch_utils import ModelEMA

DetectionTrainer, DetectionValidator = TASKS["detect"].trainer, TASKS["detect"].validator


class _Criterion:
    loss_names = ("mse",)

    def __call__(self, preds, batch):
        loss = ((preds - batch["y"]) ** 2).sum()
        return loss, loss.detach().reshape(1)


def _trainer(init_scale=2.0**10):
    """The optimisation of a linear model (SGD, an fp16 scaler) and a one-process run context with fp16 autocast:
    what forward_backward and step use."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optim = Optimisation(model, model, _Criterion(), optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                         scaler=torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000),
                         ema=ModelEMA(model))
    return optim, RunContext(Path("run"), torch.device("cpu"), -1, -1, 1, True, torch.float16, "runs")


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_overflowing_step_is_skipped_and_scale_lowered_then_next_step_taken():
    t, run = _trainer()
    before = _params(t.model)
    x = torch.ones(2, 4)
    # a target beyond fp16 range makes the scaled gradients inf: the step must be skipped, not applied as NaN
    t.forward_backward({"img": x, "y": torch.full((2, 1), 1e30)}, run)
    t.step()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(t.model)))
    assert t.scaler.get_scale() == 2.0**9
    assert all(p.grad is None or not p.grad.any() for p in t.model.parameters())  # zeroed for the next step

    t.forward_backward({"img": x, "y": torch.zeros(2, 1)}, run)
    t.step()
    after = _params(t.model)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert t.scaler.get_scale() == 2.0**9


def test_scaled_step_equals_fp32_step():
    """With finite gradients, the scaler's unscale makes the fp16 step the plain step (up to fp16 rounding)."""
    batch = {"img": torch.rand(3, 4), "y": torch.rand(3, 1)}
    ref, run = _trainer()
    ref.scaler = torch.amp.GradScaler("cpu", enabled=False)
    ref.forward_backward(batch, dataclasses.replace(run, amp=False))
    ref.step()
    t, run = _trainer()
    t.forward_backward(batch, run)
    t.step()
    for a, b in zip(_params(ref.model), _params(t.model)):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)


class _Stop(BaseException):  # a listener's Exception is only a warning (engine/callbacks.py); this ends the run
    pass


def _as_precision(monkeypatch, where):
    """Train this process as a run `where` does, on the CPU: "cuda-fp16" as CUDA's default (fp16 autocast, an
    enabled GradScaler, which torch's CPU one stands in for, and a fused optimizer), "cpu-bf16" and "cpu-fp32"."""
    import engine.parts
    import engine.trainer

    dtype = {"cuda-fp16": torch.float16, "cpu-bf16": torch.bfloat16, "cpu-fp32": None}[where]
    monkeypatch.setattr(engine.parts, "amp_settings", lambda device, amp: (dtype is not None, dtype or torch.float32))
    build = utils.torch_utils.build_optimizer
    monkeypatch.setattr(engine.trainer, "build_optimizer",
                        lambda *a, fused, **k: build(*a, fused=where == "cuda-fp16", **k))


@pytest.mark.slow
def test_a_run_continues_across_devices_and_precisions_and_validates_in_its_own(shapes_detect, tmp_path, monkeypatch,
                                                                                 yolo_log):
    """One 4-epoch run, each epoch trained as another device would: CPU fp32 -> CUDA fp16 (a CPU run resumed on a GPU
    crashed on the empty GradScaler state) -> CPU bf16 -> CUDA fp16. Each part takes its own precision, scaler and
    optimizer implementation; the last validates best.pt in fp16, as `val.py --half`, which it names next."""
    args = ["--data", str(shapes_detect), "--cfg", "yolov8n.yaml", "--imgsz", "64", "--batch-size", "8", "--epochs",
            "4", "--workers", "0", "--device", "cpu", "--noplots", "--amp", "off", "--project", str(tmp_path)]
    last = tmp_path / "exp" / "weights" / "last.pt"
    seen = []

    def stop_after(epoch):
        def probe(trainer):
            seen.append((trainer.run.amp_dtype if trainer.run.amp else None, trainer.optim.scaler.is_enabled(),
                         trainer.optim.optimizer.param_groups[0]["fused"]))
            if trainer.state.epoch == epoch:
                raise _Stop
        return probing(DetectionTrainer, {"on_fit_epoch_end": [probe]})

    validated = []  # the dtype of the weights each validation runs
    init_metrics = DetectionValidator.init_metrics

    def recording(self, model):
        validated.append(next(model.parameters()).dtype)
        return init_metrics(self, model)

    monkeypatch.setattr(DetectionValidator, "init_metrics", recording)
    for epoch, where in enumerate(("cpu-fp32", "cuda-fp16", "cpu-bf16", "cuda-fp16")):
        _as_precision(monkeypatch, where)
        opt = train.parse_opt(args if epoch == 0 else ["--resume", str(last), "--device", "cpu", "--workers", "0"])
        if epoch < 3:
            with pytest.raises(_Stop):
                run(stop_after(epoch), opt)
        else:
            run(stop_after(None), opt)
    assert seen == [(None, False, None), (torch.float16, True, True), (torch.bfloat16, False, None),
                    (torch.float16, True, True)]
    assert sum("starts at its initial scale" in m for m in yolo_log) == 2  # after fp32 and after bf16
    # each epoch's validation autocasts the fp32 EMA; best.pt is validated in fp16, as val.py --half would
    assert validated == [torch.float32] * 4 + [torch.float16]
    assert any("val.py --weights" in m and "--half" in m for m in yolo_log)
