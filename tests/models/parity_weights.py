"""Seeded weights for a parity fixture, from a state_dict's keys and shapes alone (torch only: the fixture builder runs
it inside the official package's environment, the parity test inside ours).

Both sides fill the same keys in the same order with the same draws, so a fixture needs only the official outputs
and a fingerprint of the weights, not the weights themselves. The draws follow the shared fixtures' recipe
(/work/shared/reference/parity/README.md): convolution weights N(0, 1.4 / sqrt(fan_in)), biases N(0, 0.1), BatchNorm
weight in [0.5, 1.5), bias N(0, 0.1), running mean N(0, 0.2) and variance in [0.5, 1.5), all rounded to fp16 so they
load exactly; the DFL projection keeps its fixed values.
"""

import torch


def _draw(key, shape, g):
    if key.endswith("running_var") or (key.endswith(".weight") and len(shape) == 1):  # BatchNorm scale and variance
        return torch.rand(shape, generator=g) + 0.5
    if len(shape) == 4:
        fan_in = shape[1] * shape[2] * shape[3]
        return torch.randn(shape, generator=g) * (1.4 / fan_in**0.5)
    scale = 0.2 if key.endswith("running_mean") else 0.1
    return torch.randn(shape, generator=g) * scale


def seeded_state(state, seed=0):
    """A new state_dict with the keys of `state`: floating tensors drawn as the module docstring says (fp16-exact,
    float32), others (BatchNorm counters) and the DFL projection copied."""
    out = {}
    for i, (k, v) in enumerate(state.items()):
        if not v.is_floating_point() or ".dfl." in k:
            out[k] = v.clone()
            continue
        g = torch.Generator().manual_seed(seed * 100003 + i)
        out[k] = _draw(k, tuple(v.shape), g).half().float()
    return out


def fingerprint(state):
    """Per-key float64 sums: equal on both sides exactly when the draws were."""
    return {k: float(v.double().sum()) for k, v in state.items()}


@torch.no_grad()
def perturb_saved_model(net, seed=0):
    """A model an official package is about to save, made so that loading and fusing it must be exact: BatchNorm
    away from its defaults (weight and variance in [0.5, 1.5), bias N(0, 0.1), mean N(0, 0.2)), every weight and
    buffer rounded to fp16. Returns the generator, to draw the test input from next."""
    g = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    for t in [*net.parameters(), *(b for b in net.buffers() if b.is_floating_point())]:
        t.copy_(t.half().float())
    return g
