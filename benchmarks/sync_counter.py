"""Host-device synchronisations, counted on a CPU the way ../shared/peers/sync_count.py counts them: every aten op
that on CUDA makes the host wait for the device (a value read into Python, an output whose size depends on the
values, a boolean-mask index or assignment), named by the line that called it; ops inside torch.optim are left out
(its step counters are host tensors on CUDA too). Two more kinds, which that counter cannot see on a CPU: values read
back with `Tensor.tolist` / `numpy` / `cpu` (a copy to the host), and tensors made on a device from host values
(`torch.tensor(values, device=...)`, `new_tensor`: on CUDA a copy that waits for the device, counted as "to_device").
`waits` of a count are what sync_count.py counts; the whole count adds the other two kinds (HOST_COPIES).
"""

import collections
import os
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

WAITS = frozenset({
    "_local_scalar_dense", "nonzero", "nonzero_static", "masked_select", "is_nonzero", "equal", "bincount", "_unique2",
    "unique_consecutive", "unique_dim", "repeat_interleave", "histc", "masked_scatter", "allclose", "_assert_async",
    "argwhere",
})
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
READS = ("tolist", "numpy", "cpu")  # Tensor methods that copy to the host, unseen by the dispatcher on a CPU
MAKES = ("tensor", "as_tensor")  # torch functions that copy host values to the `device` they are given
HOST_COPIES = frozenset({*READS, "to_device"})  # the kinds ../shared/peers/sync_count.py does not count


def waits(ops):
    """The part of a count (op -> n) that ../shared/peers/sync_count.py counts: the ops, without the host copies."""
    return sum(n for op, n in ops.items() if op not in HOST_COPIES)


def caller():
    """file:line of the first frame outside torch and this file; None inside torch.optim."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if f"{os.sep}torch{os.sep}optim{os.sep}" in name:
            return None
        if f"{os.sep}torch{os.sep}" not in name and "contextlib" not in name and name != __file__:
            return f"{os.path.relpath(name)}:{f.f_lineno}"
        f = f.f_back
    return "?"


class SyncCounter(TorchDispatchMode):
    """`with SyncCounter() as c:` ... `c.total`, `c.ops` (op -> count), `c.where` ("op at file:line" -> count);
    `c.intervals(optimizer steps)` splits the counts at every optimizer step taken inside the block."""

    def __init__(self):
        super().__init__()
        self.ops, self.where = collections.Counter(), collections.Counter()
        self.steps, self._saved, self._hook = [], [], None

    @property
    def total(self):
        return sum(self.ops.values())

    def record(self, name):
        where = caller()
        if where is not None:
            self.ops[name] += 1
            self.where[f"{name} at {where}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in INDEXING and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                    for a in args if isinstance(a, (list, tuple)) for t in a):
            name += "[bool]"
        if name in WAITS or name.endswith("[bool]"):
            self.record(name)
        return func(*args, **(kwargs or {}))

    def _patch(self, owner, name, counts):
        """Replace owner.name by a wrapper that records `name` (or "to_device") when `counts(args, kwargs)`."""
        original = getattr(owner, name)
        self._saved.append((owner, name, original))

        def wrapper(*args, **kwargs):
            if counts(args, kwargs):
                self.record(name if name in READS else "to_device")
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    def _step_taken(self, optimizer, args, kwargs):
        self.steps.append((self.ops.copy(), self.where.copy()))

    def __enter__(self):
        self._hook = register_optimizer_step_post_hook(self._step_taken)
        for name in READS:
            self._patch(torch.Tensor, name, lambda args, kwargs: True)
        for name in MAKES:
            self._patch(torch, name, lambda args, kwargs: kwargs.get("device") is not None)
        self._patch(torch.Tensor, "new_tensor", lambda args, kwargs: True)
        return super().__enter__()

    def __exit__(self, *exc):
        self._hook.remove()
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        return super().__exit__(*exc)

    def intervals(self):
        """[(ops, where)] between consecutive optimizer steps (what one training step waits for), in order."""
        out = []
        for (ops0, where0), (ops1, where1) in zip(self.steps, self.steps[1:]):
            out.append((ops1 - ops0, where1 - where0))
        return out
