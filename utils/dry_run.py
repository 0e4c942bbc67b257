"""Costs measured before they are paid: a forward pass as a dry run, and a wall-clock guard for what it cannot see.

A model, a TorchScript or an ONNX graph runs first as a dry run on torch's meta device (`dry_run`): every operator
computes its output's shape and nothing else, so the activations and the work a forward pass would cost are known
without a byte allocated for them, and are refused beyond the budget (utils/budget.py). What the dry run cannot see
(time spent outside the operators it counts) runs under `wall_clock_guard`.
"""

import contextlib
import functools
import itertools
import math
import os
import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from utils.budget import (
    ACTIVATION_BYTES_PER_INPUT,
    CONSTANT_BYTES,
    INFERENCE_SECONDS,
    WORK_PER_INPUT,
    WORK_PER_SECOND,
)
from utils.errors import report_user_error


class DryRunError(Exception):
    """A dry run that did not finish: its message says why, for the caller's one-line refusal."""


class OverBudget(DryRunError):
    """A cost over the budget."""


class DataDependent(DryRunError):
    """An operator whose output's shape depends on the values of the input, not on its shape."""


class Unrunnable(DryRunError):
    """An operator that refuses the shapes it is given (layers that do not fit together)."""


# ------------------------------------------------------------------------------------------------ dry runs
_REAL_NUMEL = 4096  # small tensors computed from real ones only (shapes, scalars) stay real: `int()` reads them


def _prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _work(func, args, out):
    """Operations an operator costs, from shapes: multiply-adds of convolutions and matrix products, the window per
    output of pooling, one per element read and written for the rest."""
    name = func.__name__.split(".")[0]
    n_out = sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
    ins = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)]
    if name in ("convolution", "_convolution") and len(ins) >= 2:
        transposed = bool(args[6])  # weight (out, in / groups, k, k), or (in, out / groups, k, k) transposed
        return 2 * (ins[0].numel() if transposed else n_out) * _prod(ins[1].shape[1:])
    if name in ("mm", "bmm", "addmm", "matmul", "baddbmm") and len(ins) >= 2:
        return 2 * n_out * ins[-1].shape[-2]
    if name == "linear" and len(ins) >= 2:
        return 2 * n_out * ins[1].shape[-1]
    if "pool" in name and len(args) > 1 and isinstance(args[1], (list, tuple)):
        return n_out * _prod(args[1])
    return n_out + sum(t.numel() for t in ins)


_aten = torch.ops.aten
_ARANGE = {_aten.arange.default, _aten.arange.start, _aten.arange.start_step}
# operators whose output is no larger than their inputs: on a few small real values (a shape, an index list) they are
# computed for real at once, meta versions skipped; nonzero has none (its shape depends on the values)
_BOUNDED = {_aten.nonzero.default, _aten.remainder.Scalar, _aten.remainder.Tensor, _aten.lift_fresh.default,
            _aten.index_select.default, _aten.view.default, _aten._unsafe_view.default, _aten.unsqueeze.default,
            _aten.squeeze.dim, _aten.squeeze.dims, _aten.cat.default, _aten.stack.default, _aten._to_copy.default,
            _aten.clone.default, _aten.select.int, _aten.slice.Tensor, _aten.floor_divide.default,
            _aten.div.Tensor_mode, _aten.ceil.default, _aten.floor.default, _aten.t.default, _aten.permute.default,
            _aten.transpose.int, _aten.copy.default, _aten.alias.default, _aten.detach.default,
            _aten.expand.default,  # a view: no bytes of its own
            _aten.equal.default}  # TorchScript compares its constants so
# operators whose meta versions torch writes in Python, behind a wrapper that imports torch._dynamo on first use (1-4 s
# of a 2-core CPU): their outputs' shapes are made here instead, as the operators define them
_ELEMENTWISE = {_aten.add.Tensor, _aten.sub.Tensor, _aten.mul.Tensor, _aten.div.Tensor, _aten.pow.Tensor_Scalar,
                _aten.add.Scalar, _aten.sub.Scalar, _aten.mul.Scalar, _aten.div.Scalar, _aten.rsub.Scalar,
                _aten.pow.Tensor_Tensor, _aten.exp.default, _aten.tanh.default, _aten.hardsigmoid.default,
                _aten.silu.default, _aten.sigmoid.default, _aten.relu.default, _aten.leaky_relu.default,
                _aten.hardswish.default, _aten.mish.default, _aten.softmax.int, _aten._softmax.default,
                _aten.cos.default, _aten.sin.default}  # an oriented head's angles


def _pair(v):
    return list(v) * 2 if len(v) == 1 else list(v)


def _conv_shape(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """Output shape of a 1-D (ECA's) or 2-D convolution; Unrunnable where the weight does not fit the input."""
    if x.dim() not in (3, 4) or w.dim() != x.dim() or x.shape[1] != (w.shape[0] if transposed else w.shape[1] * groups):
        raise Unrunnable(f"its convolution cannot run (input {list(x.shape)}, weight {list(w.shape)}, groups {groups})")
    size = []
    for n, k, s, p, d, o in zip(x.shape[2:], w.shape[2:], _pair(stride), _pair(padding), _pair(dilation),
                                _pair(output_padding) if transposed else (0, 0)):
        size.append((n - 1) * s - 2 * p + d * (k - 1) + o + 1 if transposed else (n + 2 * p - d * (k - 1) - 1) // s + 1)
    if min(size) < 1:
        raise Unrunnable(f"its convolution cannot run (input {list(x.shape)} too small for weight {list(w.shape)})")
    return [x.shape[0], w.shape[1] * groups if transposed else w.shape[0], *size]


def _pool_shape(x, kernel, stride, padding, dilation, ceil_mode):
    size = []
    for n, k, s, p, d in zip(x.shape[-2:], _pair(kernel), _pair(stride or kernel), _pair(padding), _pair(dilation)):
        span = n + 2 * p - d * (k - 1) - 1
        out = (-(-span // s) if ceil_mode else span // s) + 1
        size.append(out - 1 if ceil_mode and (out - 1) * s >= n + p else out)
    if min(size) < 1:
        raise Unrunnable(f"its pooling cannot run (input {list(x.shape)}, window {list(kernel)})")
    return [*x.shape[:-2], *size]


def _joined(func, tensors, dim=0):
    """The meta output of cat or stack of `tensors` along `dim`."""
    shape = list(tensors[0].shape)
    if func is _aten.cat.default:
        dim %= len(shape)
        if any(t.dim() != len(shape) or [n for d, n in enumerate(t.shape) if d != dim] !=
               [n for d, n in enumerate(shape) if d != dim] for t in tensors):
            raise Unrunnable(f"its cat cannot run (shapes {[list(t.shape) for t in tensors]})")
        shape[dim] = sum(t.shape[dim] for t in tensors)
    else:
        if any(list(t.shape) != shape for t in tensors):
            raise Unrunnable(f"its stack cannot run (shapes {[list(t.shape) for t in tensors]})")
        shape.insert(dim % (len(shape) + 1), len(tensors))
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return torch.empty(shape, dtype=dtype, device="meta")


def _meta_shortcut(func, args):
    """The meta outputs of the operators above, or None for any other."""
    if func in (_aten.convolution.default, _aten._convolution.default):
        return torch.empty(_conv_shape(*args[:2], *args[3:9]), dtype=args[0].dtype, device="meta")
    if func in (_aten.max_pool2d_with_indices.default, _aten.max_pool2d.default):
        x, kernel, stride, padding, dilation, ceil_mode = (*args, *([], [0], [1], False)[len(args) - 2:])
        shape = _pool_shape(x, kernel, stride, padding, dilation, ceil_mode)
        out = torch.empty(shape, dtype=x.dtype, device="meta")
        return (out, torch.empty(shape, dtype=torch.int64, device="meta")) if "indices" in str(func) else out
    if func in (_aten.upsample_nearest2d.default, _aten.upsample_nearest2d.vec):
        x, size = args[0], args[1]
        if size is None:  # .vec with scale factors: floor(size x scale), as torch computes it
            size = [int(n * f) for n, f in zip(x.shape[2:], args[2])]
        return torch.empty([*x.shape[:2], *size], dtype=x.dtype, device="meta")
    if func is _aten.native_batch_norm.default:
        x, training = args[0], args[5]
        stats = x.shape[1] if training else 0
        out = [torch.empty(shape, dtype=x.dtype, device="meta") for shape in (x.shape, (stats,), (stats,))]
        return tuple(out)
    if func in (_aten.cat.default, _aten.stack.default):  # stack: a head's anchor grid (meshgrid)
        return _joined(func, *args)
    if func is _aten.mean.dim:  # global average pooling
        x, dims, keep = args[0], [d % args[0].dim() for d in args[1]], len(args) > 2 and args[2]
        shape = [1 if d in dims else n for d, n in enumerate(x.shape) if keep or d not in dims]
        return torch.empty(shape, dtype=x.dtype, device="meta")
    if func in (_aten.mm.default, _aten.addmm.default, _aten.bmm.default):
        a, b = args[-2:] if func is not _aten.addmm.default else args[1:3]
        batched = func is _aten.bmm.default
        if a.dim() != 2 + batched or b.dim() != 2 + batched or a.shape[-1] != b.shape[-2] or (
                batched and a.shape[0] != b.shape[0]):
            raise Unrunnable(f"its matrix product cannot run ({list(a.shape)} by {list(b.shape)})")
        return torch.empty((*a.shape[:-1], b.shape[-1]), dtype=a.dtype, device="meta")
    if func is _aten.constant_pad_nd.default:
        x, pad = args[0], args[1]
        shape = list(x.shape)
        for k in range(len(pad) // 2):
            shape[-1 - k] += pad[2 * k] + pad[2 * k + 1]
        return torch.empty(shape, dtype=x.dtype, device="meta")
    if func in _ELEMENTWISE:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        operands = [a for a in args[:2] if isinstance(a, (torch.Tensor, int, float, bool))]
        dtype = torch.result_type(*operands) if len(operands) == 2 else tensors[0].dtype
        if func in (_aten.softmax.int, _aten._softmax.default):
            dtype = tensors[0].dtype
        return torch.empty(broadcast(*(t.shape for t in tensors)), dtype=dtype, device="meta")
    return None


def broadcast(*shapes):
    """numpy's broadcasting of shapes (torch.broadcast_shapes imports sympy on first use)."""
    out = []
    for dims in itertools.zip_longest(*(reversed(s) for s in shapes), fillvalue=1):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise Unrunnable(f"shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return out[::-1]


def _arange(func, args, kwargs):
    """arange's output, for real where it is small (indices a graph reads back) and not asked for on the meta device
    (a head's anchors, made on its input's device), else on the meta device."""
    start, end, step = ((0, *args, 1) if len(args) == 1 else (*args, 1) if len(args) == 2 else args)[:3]
    n = max(math.ceil((end - start) / step), 0)
    if n <= _REAL_NUMEL and kwargs.get("device") != torch.device("meta"):  # torch's meta arange imports sympy
        return func(*args, **kwargs)
    ints = all(isinstance(v, int) for v in (start, end, step))
    dtype = kwargs.get("dtype") or (torch.int64 if ints else torch.get_default_dtype())
    return torch.empty((n,), dtype=dtype, device="meta")


def _to_meta(t):
    return t.to("meta") if isinstance(t, torch.Tensor) else t


class DryRun(TorchDispatchMode):
    """Inside it, operators compute shapes on the meta device: real inputs (weights) are seen as meta tensors, no
    operator allocates, and each output's bytes and each operator's work are added up. Small tensors computed from
    real ones alone, or from none (a shape made a tensor by TorchScript's NumToTensor, an ONNX `arange` made of
    `ConstantOfShape` and `NonZero`), are computed for real, so that code reading a size back as a number runs; a
    number read from the input's values cannot be known, and ends the run (DataDependent). Past `max_bytes` or
    `max_work` the run ends (OverBudget) before the next operator.

    torch writes many meta versions in Python, some of which import sympy or torch._dynamo on first use (seconds of
    a script's start-up): the operators of every official model have their shapes made here instead
    (`_meta_shortcut`), and tests/utils/test_dry_run.py checks that a dry run of each imports neither."""

    @classmethod
    def _should_skip_dynamo(cls):
        """Nothing is compiled inside a dry run: torch would otherwise wrap __torch_dispatch__ to keep torch.compile
        out, which imports torch._dynamo (1.4 s of a 2-core CPU) on the first operator."""
        return False

    def __init__(self, max_bytes, max_work, max_fixed):
        super().__init__()
        self.max_bytes, self.max_work, self.max_fixed = max_bytes, max_work, max_fixed
        self.bytes = self.work = self.largest = self.fixed = 0
        # bytes of the outputs still referenced, and their most at once: what an eval pass holds at its peak (a
        # tensor is freed when Python drops it, as on a real device; views and in-place results hold no new bytes)
        self.live = self.peak = 0
        self.error = None  # the DryRunError that ended the run (TorchScript's interpreter re-raises it as another)

    def _fail(self, error):
        self.error = error
        raise error

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        real = all(t.device.type != "meta" for t in tensors)
        leaves_meta = func is _aten._to_copy.default and kwargs.get("device") not in (None, torch.device("meta"))
        if func is _aten._local_scalar_dense.default or leaves_meta:  # a number read from a tensor's value
            if not real:
                self._fail(DataDependent("it takes a size or number from the values of the input, not its shape"))
            return func(*args, **kwargs)
        if real and tensors and all(t.numel() <= _REAL_NUMEL for t in tensors) and (func in _BOUNDED or
                                                                                 func in _ELEMENTWISE):
            out = func(*args, **kwargs)
            self._count(func, args, out, real)
            return out
        if func in _ARANGE:
            out = _arange(func, args, kwargs)
            self._count(func, args, out, real)
            return out
        meta_args, meta_kwargs = tree_map(_to_meta, args), tree_map(_to_meta, kwargs)
        if not tensors:  # a factory (full, zeros): made on the meta device too
            meta_kwargs["device"] = torch.device("meta")
        try:
            out = _meta_shortcut(func, meta_args)
            if out is None:
                out = func(*meta_args, **meta_kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:  # a meta kernel refusing what it was given
            self._fail(Unrunnable(f"its {func.__name__} cannot run ({' '.join(str(e).split())[:160]})"))
        except Unrunnable as e:
            self._fail(e)
        self._count(func, meta_args, out, real)
        small = all(t.numel() <= _REAL_NUMEL for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return func(*args, **kwargs) if real and small else out

    def hold(self, t, nbytes):
        """Count `nbytes` as live until `t` is garbage."""
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(t, self._free, nbytes)

    def _free(self, nbytes):
        self.live -= nbytes

    def _count(self, func, args, out, fixed):
        """Add an operator's output bytes and work; `fixed`: its inputs are weights and constants only (nothing
        that comes from the input), so its cost does not grow with the input and counts against `max_fixed`."""
        schema = getattr(func, "_schema", None)
        new = schema is None or all(r.alias_info is None for r in schema.returns)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                nbytes = t.numel() * t.element_size()
                if fixed:
                    self.fixed += nbytes
                else:
                    self.bytes += nbytes
                    if new:
                        self.hold(t, nbytes)
                self.largest = max(self.largest, nbytes)
        self.work += _work(func, args, out)
        if self.fixed > self.max_fixed:
            self._fail(OverBudget(f"it would make constants of more than {self.max_fixed} bytes"))
        if self.bytes > self.max_bytes:
            self._fail(OverBudget(f"it would cost activations of more than {self.max_bytes} bytes"))
        if self.work > self.max_work:
            self._fail(OverBudget(f"it would cost more than {self.max_work:.3g} operations"))


def input_budget(shape):
    """(bytes, work) a forward pass of an input of `shape` may cost: ACTIVATION_BYTES_PER_INPUT and WORK_PER_INPUT per
    input value (costs of convolutional networks grow with the pixels)."""
    n = _prod(shape)
    return ACTIVATION_BYTES_PER_INPUT * n, WORK_PER_INPUT * n


def dry_run(forward, shape, dtype=torch.float32, held=0):
    """Run `forward` on a meta tensor of `shape` under DryRun within input_budget(shape), and what does not grow with
    the input (constants, arithmetic on weights) within CONSTANT_BYTES plus 4x the `held` bytes of the file it came
    from; returns the DryRun (its `bytes`, `work`, `largest`) and the output (meta tensors). Raises a DryRunError."""
    max_bytes, max_work = input_budget(shape)
    probe = DryRun(max_bytes, max_work, CONSTANT_BYTES + 4 * held)
    x = torch.empty(shape, dtype=dtype, device="meta")
    try:
        with torch.no_grad(), probe:
            out = forward(x)
    except Exception:
        if probe.error is not None:  # raised inside an operator, perhaps re-raised by TorchScript as another type
            raise probe.error from None
        raise
    return probe, out


def inference_seconds(work):
    """The wall-clock limit of a forward pass whose dry run counted `work` operations."""
    return INFERENCE_SECONDS + work / WORK_PER_SECOND


@contextlib.contextmanager
def wall_clock_guard(seconds, what):
    """Run the block; if it has not ended after `seconds`, print one `error:` line naming `what` and end the process
    with status 2. Native code (a TorchScript operator) cannot be interrupted from Python, so the guard ends the
    process rather than the call; a graph that can be stopped (onnxruntime) is stopped by its own runner first."""
    done = threading.Event()

    def watch():
        if not done.wait(seconds):
            report_user_error(f"{what}: still running after {seconds:.0f} s, far beyond what its dry run counted; "
                              "stopped")
            os._exit(2)

    watcher = threading.Thread(target=watch, name="wall-clock guard", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
