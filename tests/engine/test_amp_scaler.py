"""The fp16 GradScaler path of the trainer, on CPU (torch runs fp16 autocast and GradScaler there too): CI has no
GPU, and this is the path CUDA training takes by default."""

import torch
import torch.nn as nn

from engine.trainer import BaseTrainer


class _Criterion:
    loss_names = ("mse",)

    def __call__(self, preds, batch):
        loss = ((preds - batch["y"]) ** 2).sum()
        return loss, loss.detach().reshape(1)


def _trainer(init_scale=2.0**10):
    """A trainer with only what forward_backward/optimizer_step use: a linear model, SGD, fp16 autocast."""
    torch.manual_seed(0)
    t = BaseTrainer.__new__(BaseTrainer)
    t.device, t.amp, t.amp_dtype, t.world_size, t.ema = torch.device("cpu"), True, torch.float16, 1, None
    t.model = t.train_model = nn.Linear(4, 1)
    t.criterion = _Criterion()
    t.optimizer = torch.optim.SGD(t.model.parameters(), lr=0.01)
    t.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1000)
    return t


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_overflowing_step_is_skipped_and_scale_lowered_then_next_step_taken():
    t = _trainer()
    before = _params(t.model)
    x = torch.ones(2, 4)
    # a target beyond fp16 range makes the scaled gradients inf: the step must be skipped, not applied as NaN
    t.forward_backward({"img": x, "y": torch.full((2, 1), 1e30)})
    t.optimizer_step()
    assert all(torch.equal(a, b) for a, b in zip(before, _params(t.model)))
    assert t.scaler.get_scale() == 2.0**9
    assert all(p.grad is None or not p.grad.any() for p in t.model.parameters())  # zeroed for the next step

    t.forward_backward({"img": x, "y": torch.zeros(2, 1)})
    t.optimizer_step()
    after = _params(t.model)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert t.scaler.get_scale() == 2.0**9


def test_scaled_step_equals_fp32_step():
    """With finite gradients, the scaler's unscale makes the fp16 step the plain step (up to fp16 rounding)."""
    batch = {"img": torch.rand(3, 4), "y": torch.rand(3, 1)}
    ref = _trainer()
    ref.amp, ref.scaler = False, torch.amp.GradScaler("cpu", enabled=False)
    ref.forward_backward(batch)
    ref.optimizer_step()
    t = _trainer()
    t.forward_backward(batch)
    t.optimizer_step()
    for a, b in zip(_params(ref.model), _params(t.model)):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)
