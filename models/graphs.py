"""An exported ONNX graph judged before onnxruntime loads it: what it holds, and what running it would cost.

export.py writes a plain graph of the operators in ONNX_OPS (found in its exports of every family and task at every
opset it offers, the zoo's attention blocks at opset 17; tests/models/test_graphs.py and test_zoo_export.py fail
when a new one appears), with its weights inside the file.
`check_onnx` refuses anything else: other operators (loops, conditionals, custom domains: `Loop` runs as long as its
graph says), subgraphs, local functions, external or sparse data, weights larger than the bytes that hold them.

`onnx_dry_run` then runs the graph as the budget's dry run does for TorchScript (utils/dry_run.py): each node is
computed with torch on the meta device, from the input's shape, so every value's shape is known before onnxruntime
sees the file (it folds constants while loading: a 497-byte `ConstantOfShape` of 2 GiB would be allocated then), and
the activations and work are counted against the budget. Shapes that come from the input's values (data, not size)
end the run. The nodes follow the ONNX operator definitions, as far as shapes go.
"""

import math

import torch
import torch.nn.functional as F

from utils.budget import MAX_GRAPH_NODES
from utils.dry_run import DryRunError, Unrunnable, broadcast, dry_run
from utils.errors import BadFile

# the operators export.py writes for every family and task of models/ (opsets 9-20; 7 and 8 cannot express the
# upsampling), and the opset range
ONNX_OPS = frozenset({
    "Add", "Cast", "Ceil", "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Div", "Expand",
    "Flatten", "Gather", "Gemm", "GlobalAveragePool", "Identity", "LeakyRelu", "MatMul", "MaxPool", "Mul", "NonZero",
    "Pad", "Pow", "Range", "Reshape", "Resize", "Shape", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "Sub",
    "Transpose", "Unsqueeze", "Upsample",
    "Clip", "HardSwish", "ReduceMax", "ReduceMean", "ReduceSum", "Relu",  # the attention series
    "Erf", "Exp", "LayerNormalization", "ReduceL2",  # Swin V2
    "Cos", "Sin",  # the oriented-box head (its boxes turned by their angles)
    "AveragePool",  # not in the official families, but the commonest pooling of users' blocks (docs/blocks.md)
})
ONNX_OPSETS = range(7, 21)


class UnsafeOnnx(BadFile):
    """An ONNX file holding what export.py never writes, or costing more than the budget: refused before
    onnxruntime loads it."""


def _dtype(code):
    """torch dtype of an ONNX TensorProto data type."""
    import onnx

    return {onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.FLOAT16: torch.float16,
            onnx.TensorProto.DOUBLE: torch.float64, onnx.TensorProto.INT64: torch.int64,
            onnx.TensorProto.INT32: torch.int32, onnx.TensorProto.INT8: torch.int8, onnx.TensorProto.UINT8: torch.uint8,
            onnx.TensorProto.BOOL: torch.bool}[code]


def _check_tensor(t, label):
    """UnsafeOnnx for a tensor whose data lies elsewhere or is shorter than its dims declare."""
    if t.data_location == t.EXTERNAL or t.external_data:
        raise UnsafeOnnx(f"refusing {label}: its tensor {t.name!r} lives in another file (external data), which "
                         "export.py never writes")
    n = math.prod(t.dims)
    if t.raw_data:
        need, held = n * torch.empty((), dtype=_dtype(t.data_type)).element_size(), len(t.raw_data)
    else:
        need = n
        held = max(len(t.float_data), len(t.int64_data), len(t.int32_data), len(t.double_data), len(t.string_data))
    if need > held:
        unit = "bytes" if t.raw_data else "values"
        raise UnsafeOnnx(f"refusing {label}: its tensor {t.name!r} declares {need} {unit} but holds {held}")


def _tensor(t):
    """A TensorProto (checked by check_onnx) as a torch tensor."""
    import onnx.numpy_helper

    return torch.from_numpy(onnx.numpy_helper.to_array(t).copy())


def read_onnx(data, label):
    """The ModelProto of the bytes `data`, judged by check_onnx (BadFile when they are no ONNX model)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RecursionError) as e:
        raise BadFile(f"{label}: not a loadable ONNX file ({type(e).__name__}: {str(e)[:160]})") from None
    check_onnx(model, label)
    return model


def check_onnx(model, label):
    """Refuse (UnsafeOnnx) an ONNX model holding what export.py never writes; nothing in it runs."""
    opsets = {o.domain: o.version for o in model.opset_import}
    if set(opsets) - {"", "ai.onnx"} or not all(v in ONNX_OPSETS for v in opsets.values()):
        raise UnsafeOnnx(f"refusing {label}: it imports operator sets {opsets}, beyond the standard opsets "
                         f"{ONNX_OPSETS.start}-{ONNX_OPSETS.stop - 1} export.py writes")
    if len(model.graph.node) > MAX_GRAPH_NODES:
        raise UnsafeOnnx(f"refusing {label}: it holds {len(model.graph.node)} operators, more than the "
                         f"{MAX_GRAPH_NODES} of any export")
    if model.functions or model.graph.sparse_initializer:
        raise UnsafeOnnx(f"refusing {label}: it holds local functions or sparse tensors, which export.py never writes")
    for t in [*model.graph.initializer, *(a.t for n in model.graph.node for a in n.attribute if a.HasField("t"))]:
        try:
            _check_tensor(t, label)
        except KeyError:
            raise UnsafeOnnx(f"refusing {label}: its tensor {t.name!r} has a data type no export has") from None
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ONNX_OPS:
            raise UnsafeOnnx(f"refusing {label}: its node {node.name!r} is a {node.domain or 'ai.onnx'} "
                             f"{node.op_type}, which export.py never writes")
        if any(a.g.node or a.graphs for a in node.attribute):
            raise UnsafeOnnx(f"refusing {label}: its node {node.name!r} holds a subgraph, which export.py never writes")


def _attr(node, name, default=None):
    import onnx.helper

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _ints(t):
    """A small real tensor (a shape, axes, sizes) as Python ints; reading it is what a dry run refuses for values
    that come from the input's data."""
    return [int(v) for v in t.reshape(-1).tolist()]


def _binary(f):
    return lambda node, x, y: f(x, y)


def _div(node, x, y):
    if not x.is_floating_point() and not y.is_floating_point():
        return torch.div(x, y, rounding_mode="trunc")
    return x / y


def _conv(node, x, w, b=None):
    if x.dim() == 3:  # ECA's 1-D convolution across channels
        pads = _attr(node, "pads", [0, 0])
        return F.conv1d(F.pad(x, pads), w, b, _attr(node, "strides", [1]), 0, _attr(node, "dilations", [1]),
                        _attr(node, "group", 1))
    pads = _attr(node, "pads", [0] * 4)
    if pads[:2] != pads[2:]:
        x = F.pad(x, (pads[1], pads[3], pads[0], pads[2]))
        pads = [0, 0, 0, 0]
    return F.conv2d(x, w, b, _attr(node, "strides", [1, 1]), pads[:2], _attr(node, "dilations", [1, 1]),
                    _attr(node, "group", 1))


def _conv_transpose(node, x, w, b=None):
    pads = _attr(node, "pads", [0] * 4)
    if pads[:2] != pads[2:] or _attr(node, "output_shape") is not None:
        raise Unrunnable(f"ConvTranspose {node.name!r} with uneven padding or an output shape")
    return F.conv_transpose2d(x, w, b, _attr(node, "strides", [1, 1]), pads[:2], _attr(node, "output_padding", [0, 0]),
                              _attr(node, "group", 1), _attr(node, "dilations", [1, 1]))


def _pad(node, x, pads=None, value=None, axes=None):
    """Pad (opset 2-10: `pads` attribute; 11+: inputs): [begin of each axis..., end of each axis...]."""
    pads = _ints(pads) if pads is not None else list(_attr(node, "pads"))
    axes = _ints(axes) if axes is not None else list(range(x.dim()))
    flat = []
    for a in reversed(axes):  # torch pads the last axis first, (begin, end) each
        flat += [pads[axes.index(a)], pads[len(axes) + axes.index(a)]]
    mode = _attr(node, "mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    fill = value.item() if value is not None and value.numel() else _attr(node, "value", 0.0)
    return F.pad(x, flat, mode=mode, value=fill) if mode == "constant" else F.pad(x, flat, mode=mode)


def _pool_pads(node, x, fill):
    """(x, pads for torch): ONNX pads each side on its own; torch pads both sides alike, so uneven pads go first."""
    pads = _attr(node, "pads", [0] * 4)
    if pads[:2] != pads[2:]:
        return F.pad(x, (pads[1], pads[3], pads[0], pads[2]), value=fill), [0, 0]
    return x, pads[:2]


def _maxpool(node, x):
    x, pads = _pool_pads(node, x, float("-inf"))
    return F.max_pool2d(x, _attr(node, "kernel_shape"), _attr(node, "strides", [1, 1]), pads,
                        _attr(node, "dilations", [1, 1]), bool(_attr(node, "ceil_mode", 0)))


def _avgpool(node, x):
    x, pads = _pool_pads(node, x, 0.0)
    return F.avg_pool2d(x, _attr(node, "kernel_shape"), _attr(node, "strides", [1, 1]), pads,
                        bool(_attr(node, "ceil_mode", 0)), bool(_attr(node, "count_include_pad", 0)))


def _reshape(node, x, shape):
    shape = _ints(shape)
    if not _attr(node, "allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _resize(node, x, *rest):
    """Resize (opset 10: X, scales; 11+: X, roi, scales, sizes) and Upsample (7: scales attribute; 9: X, scales):
    the output size, sizes given or floor(size x scale), then nearest neighbours (the size is what matters)."""
    sizes = _ints(rest[2]) if len(rest) > 2 and rest[2] is not None and rest[2].numel() else None
    if sizes is None:
        scales = rest[-1].reshape(-1).tolist() if rest and rest[-1] is not None and rest[-1].numel() else \
            _attr(node, "scales")
        sizes = [math.floor(s * f) for s, f in zip(x.shape, scales)]
    if sizes[:2] != list(x.shape[:2]):
        raise Unrunnable(f"{node.op_type} resizing batch or channels ({list(x.shape)} to {sizes})")
    return F.interpolate(x, size=sizes[2:], mode="nearest")


def _slice(node, x, starts=None, ends=None, axes=None, steps=None):
    if starts is None:  # opset < 10: attributes
        starts, ends, axes = _attr(node, "starts"), _attr(node, "ends"), _attr(node, "axes")
    else:
        starts, ends = _ints(starts), _ints(ends)
        axes = _ints(axes) if axes is not None else None
        steps = _ints(steps) if steps is not None else None
    axes = axes if axes is not None else list(range(len(starts)))
    for k, (a, s, e) in enumerate(zip(axes, starts, ends)):
        step = steps[k] if steps else 1
        if step == 0:
            raise Unrunnable("Slice with a step of 0")
        kept = range(*slice(s, e, step).indices(x.shape[a]))  # Python's clamping is ONNX's, negative steps too
        x = x.narrow(a, kept.start, len(kept)) if step == 1 else x.index_select(a, torch.tensor(list(kept)))
    return x


def _split(node, x, split=None):
    axis = _attr(node, "axis", 0)
    sizes = _ints(split) if split is not None else _attr(node, "split")
    if sizes is None:
        n = _attr(node, "num_outputs", len(node.output))
        sizes = [x.shape[axis] // n] * n
    return list(torch.split(x, list(sizes), axis))


def _axes(node, axes):
    return _ints(axes) if axes is not None else list(_attr(node, "axes"))


def _squeeze(node, x, axes=None):
    for a in sorted((a % x.dim() for a in _axes(node, axes)), reverse=True):
        x = x.squeeze(a)
    return x


def _unsqueeze(node, x, axes=None):
    axes = _axes(node, axes)
    for a in sorted(a % (x.dim() + len(axes)) for a in axes):
        x = x.unsqueeze(a)
    return x


def _gather(node, x, idx):
    axis = _attr(node, "axis", 0) % x.dim()
    flat = idx.reshape(-1) % x.shape[axis] if idx.device.type != "meta" else idx.reshape(-1)
    return x.index_select(axis, flat.long()).reshape((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]))


def _gemm(node, a, b, c=None):
    a = a.t() if _attr(node, "transA", 0) else a
    b = b.t() if _attr(node, "transB", 0) else b
    y = a @ b * _attr(node, "alpha", 1.0)
    return y if c is None else y + c * _attr(node, "beta", 1.0)


def _shape(node, x):
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    return torch.tensor(list(x.shape)[start:end], dtype=torch.int64)


def _constant(node, label):
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = _attr(node, name)
        if v is not None:
            return _tensor(v) if name == "value" else torch.tensor(v)
    raise Unrunnable(f"Constant {node.name!r} without a value export.py writes")


def _constant_of_shape(node, shape):
    import onnx.numpy_helper

    value = _attr(node, "value")
    fill = torch.from_numpy(onnx.numpy_helper.to_array(value).copy()).reshape(-1) if value is not None else None
    return torch.full(_ints(shape), 0.0 if fill is None else fill[0].item(),
                      dtype=torch.float32 if fill is None else fill.dtype)


def _reduce(f):
    """ReduceMean/Max/Sum: axes as an attribute (opsets before 18; ReduceSum before 13) or an input."""
    def run(node, x, axes=None):
        axes = _ints(axes) if axes is not None else list(_attr(node, "axes", []))
        if not axes and _attr(node, "noop_with_empty_axes", 0):
            return x
        return f(x, [a % x.dim() for a in axes] or list(range(x.dim())), bool(_attr(node, "keepdims", 1)))
    return run


def _clip(node, x, lo=None, hi=None):
    """Clip: bounds as inputs (opset 11+) or attributes."""
    lo = lo if lo is not None else _attr(node, "min")
    hi = hi if hi is not None else _attr(node, "max")
    return torch.clamp(x, lo, hi)


def _layer_norm(node, x, scale, bias=None):
    axis = _attr(node, "axis", -1) % x.dim()
    return F.layer_norm(x, x.shape[axis:], scale, bias, _attr(node, "epsilon", 1e-5))


def _expand(node, x, shape):
    return x.expand(broadcast(x.shape, _ints(shape)))


_NODES = {
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _div,
    "Pow": _binary(torch.pow), "Cast": lambda node, x: x.to(_dtype(_attr(node, "to"))),
    "Ceil": lambda node, x: torch.ceil(x), "Sigmoid": lambda node, x: torch.sigmoid(x), "Identity": lambda node, x: x,
    "Cos": lambda node, x: torch.cos(x), "Sin": lambda node, x: torch.sin(x),
    "LeakyRelu": lambda node, x: F.leaky_relu(x, _attr(node, "alpha", 0.01)),
    "Softmax": lambda node, x: torch.softmax(x, _attr(node, "axis", -1)),
    "Concat": lambda node, *xs: torch.cat(xs, _attr(node, "axis")),
    "ConstantOfShape": _constant_of_shape,
    "Conv": _conv, "ConvTranspose": _conv_transpose, "MaxPool": _maxpool, "AveragePool": _avgpool,
    "Expand": _expand, "Gather": _gather,
    "Gemm": _gemm, "MatMul": _binary(torch.matmul), "Pad": _pad,
    "Flatten": lambda node, x: x.reshape(math.prod(x.shape[:_attr(node, "axis", 1)]), -1),
    "GlobalAveragePool": lambda node, x: F.adaptive_avg_pool2d(x, 1),
    "NonZero": lambda node, x: torch.nonzero(x).t(),
    "Range": lambda node, start, limit, delta: torch.arange(start.item(), limit.item(), delta.item()),
    "Reshape": _reshape, "Resize": _resize, "Upsample": _resize, "Shape": _shape, "Slice": _slice, "Split": _split,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Transpose": lambda node, x: x.permute(_attr(node, "perm")),
    # the attention series (models/attention.py)
    "Relu": lambda node, x: torch.relu(x), "HardSwish": lambda node, x: F.hardswish(x), "Clip": _clip,
    "ReduceMean": _reduce(torch.mean), "ReduceMax": _reduce(torch.amax), "ReduceSum": _reduce(torch.sum),
    # Swin V2 (models/swin.py): cosine attention's norms, its position bias, layer norms, GELU
    "ReduceL2": _reduce(lambda x, dims, keep: torch.linalg.vector_norm(x, 2, dims, keep)),
    "Exp": lambda node, x: torch.exp(x), "Erf": lambda node, x: torch.erf(x), "LayerNormalization": _layer_norm,
}


def _run(model, x, label):
    """Compute the graph's outputs from the input `x` (under a DryRun: meta tensors), node by node."""
    values = {t.name: _tensor(t) for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in values]
    values[inputs[0]] = x
    for node in model.graph.node:
        args = [values[n] if n else None for n in node.input]
        if node.op_type == "Constant":
            out = _constant(node, label)
        else:
            while args and args[-1] is None:
                args.pop()
            out = _NODES[node.op_type](node, *args)
        outs = out if isinstance(out, list) else [out]
        values.update(zip(node.output, outs))
    return tuple(values[o.name] for o in model.graph.output)


def onnx_dry_run(model, shape, label, held=0):
    """The graph's outputs (meta tensors) for an input of `shape`, and the DryRun that counted their cost (`held`: the
    file's size, which its constants may cost 4x); UnsafeOnnx when a node cannot run from the input's shape alone or
    the cost is over the budget."""
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise UnsafeOnnx(f"refusing {label}: it takes {len(inputs)} inputs; export.py writes one, the images")
    try:
        probe, out = dry_run(lambda x: _run(model, x, label), shape, held=held)
    except (DryRunError, KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:  # no graph export.py writes
        why = str(e) if isinstance(e, DryRunError) else f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"
        raise UnsafeOnnx(f"refusing {label}: run on a {'x'.join(map(str, shape))} input, {why}") from None
    return probe, out
