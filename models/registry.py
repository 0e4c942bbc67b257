"""What a model YAML row may name: the built-in blocks and heads, a few torch layers, the activations an argument or
the model-wide `activation:` key may call, and the blocks of a user's own files (`--modules FILE.py`).

A user's file is imported only by that explicit action (`use_modules`), never because a model YAML or a checkpoint
names it: a checkpoint records which of the user's blocks its model needs (`needs_user_blocks`: names and the file's
sha256, first in the file), and `check_user_blocks` refuses it before anything is unpickled when they are missing.
"""

import dataclasses
import hashlib
import importlib.abc
import importlib.util
import io
import json
import pickletools
import sys
import traceback
from pathlib import Path

import torch.nn as nn

from models import heads
from models.attention import C2PSA, C3TR, CBAM, ECA, SE, CoordAtt, SimAM
from models.common import (
    C2,
    C3,
    MP,
    SP,
    SPP,
    SPPCSPC,
    SPPF,
    Bottleneck,
    C2f,
    C3Ghost,
    C3k2,
    Concat,
    Conv,
    DownC,
    DWConv,
    GhostBottleneck,
    GhostConv,
    ReOrg,
    RepConv,
    Shortcut,
)
from models.heads import AnchorFreeDetect, AnchorFreeSegment, Detect, Segment
from models.swin import C3STR
from utils.errors import BadCheckpoint, BadOption
from utils.log import LOGGER
from utils.tasks import TASKS

BLOCKS = (Conv, DWConv, GhostConv, Bottleneck, GhostBottleneck, C3, C3Ghost, C3TR, C3STR, C2, C2f, C3k2, C2PSA, SPP,
          SPPF, SPPCSPC, RepConv, MP, SP, Concat, ReOrg, DownC, Shortcut, SE, CBAM, ECA, CoordAtt, SimAM)
# every head models/heads.py defines: a class of that module declaring the task it serves (`task`), so a new head is
# nameable without a line here; only classes of that module, never a subclass made elsewhere
HEADS = tuple(c for c in vars(heads).values()
              if isinstance(c, type) and c.__module__ == heads.__name__ and getattr(c, "task", None) in TASKS)
# Official v5 and v8 YAMLs both say Detect/Segment: the YAML's `anchors` key decides which head that is.
AMBIGUOUS_HEADS = {"Detect": (Detect, AnchorFreeDetect), "Segment": (Segment, AnchorFreeSegment)}
# torch layers official YAMLs name (yolov3-tiny: a zero pad and a size-keeping max-pool); their channels pass through
TORCH_LAYERS = {f"nn.{c.__name__}": c for c in (nn.Upsample, nn.MaxPool2d, nn.ZeroPad2d, nn.Identity)}
REGISTRY = {**{c.__name__: c for c in (*BLOCKS, *HEADS) if c.__name__ not in AMBIGUOUS_HEADS}, **TORCH_LAYERS}
ACTIVATIONS = {c.__name__: c for c in (nn.LeakyReLU, nn.ReLU, nn.SiLU, nn.Hardswish, nn.Mish, nn.Sigmoid,
                                       nn.Identity)}


@dataclasses.dataclass(frozen=True)
class UserBlock:
    cls: type
    file: str  # the file's name, for messages
    sha256: str


USER_BLOCKS = {}  # name -> UserBlock, filled by use_modules


def builtin(name):
    return name in REGISTRY or name in AMBIGUOUS_HEADS


def use_modules(paths):
    """Import each Python file (the user's explicit `--modules`) and make every nn.Module subclass it defines a YAML
    row name, declared as the built-in blocks are (`channel_rule`, `repeat_arg`). The bytes hashed are the bytes run.
    A file given twice, or again in the same process, is imported once. Returns the names it added."""
    added = []
    for path in [paths] if isinstance(paths, (str, Path)) else list(paths or ()):
        added += _use_file(Path(path))
    return added


def _use_file(path):
    if path.suffix != ".py" or not path.is_file():
        raise BadOption(f"--modules {path}: {'file not found' if not path.exists() else 'not a Python file (.py)'}")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    name = f"yolo_user_modules.{path.stem.replace('.', '_')}_{sha[:16]}"
    module = sys.modules.get(name) or _import(path, data, name)
    classes = [v for v in vars(module).values()
               if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == name]
    if not classes:
        raise BadOption(f"--modules {path}: it defines no torch.nn.Module subclass")
    for cls in classes:
        known = USER_BLOCKS.get(cls.__name__)
        if builtin(cls.__name__):
            raise BadOption(f"--modules {path}: {cls.__name__} is the name of a built-in block; rename it")
        if known is not None and known.cls is not cls:
            raise BadOption(f"--modules {path}: {cls.__name__} is also defined by {known.file}; one name, one block")
        USER_BLOCKS[cls.__name__] = UserBlock(cls, path.name, sha)
    LOGGER.info(f"--modules {path}: {', '.join(c.__name__ for c in classes)} (sha256 {sha[:12]})")
    return [c.__name__ for c in classes]


class _HashedSource(importlib.abc.SourceLoader):
    """Imports the bytes that were hashed, not the file read again: the sha256 the log and checkpoints name is that
    of the code that ran, even if the file changes meanwhile. No bytecode is cached (no `path_stats`)."""

    def __init__(self, path, data):
        self.path, self.data = path, data

    def get_filename(self, fullname):
        return str(self.path)

    def get_data(self, path):
        return self.data


def _import(path, data, name):
    spec = importlib.util.spec_from_file_location(name, path, loader=_HashedSource(path, data))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it, as import does: dataclasses and pickling look it up there
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: where in their file, not our traceback
        del sys.modules[name]
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        line = getattr(e, "lineno", None) if isinstance(e, SyntaxError) else (frames[-1].lineno if frames else None)
        where = f"{path}:{line}" if line else str(path)
        raise BadOption(f"--modules {where}: importing it raised {type(e).__name__}: {e}") from None
    return module


def resolve(name, anchor_based):
    """The class a row's module name means (an ambiguous head by whether the YAML has anchors), or None."""
    if name in AMBIGUOUS_HEADS:
        return AMBIGUOUS_HEADS[name][0 if anchor_based else 1]
    if name in REGISTRY:
        return REGISTRY[name]
    block = USER_BLOCKS.get(name)
    return block.cls if block else None


def is_user_block(name):
    return name in USER_BLOCKS and not builtin(name)


def known_names():
    return sorted([*REGISTRY, *AMBIGUOUS_HEADS, *USER_BLOCKS])


# ------------------------------------------------------------------------------------------------ checkpoints
NEEDS_KEY = "user_blocks"  # the first key of a checkpoint whose model has blocks of the user's own


def _row_names(d):
    rows = [r for k in ("backbone", "head") for r in (d.get(k) or []) if isinstance(r, list) and len(r) == 4]
    return {r[2] for r in rows if isinstance(r[2], str)}


def needs_user_blocks(yamls):
    """{block name: {'file', 'sha256'}} of the user blocks the model dicts `yamls` name, for a checkpoint."""
    names = set().union(*(_row_names(d) for d in yamls if isinstance(d, dict)))
    return {n: {"file": USER_BLOCKS[n].file, "sha256": USER_BLOCKS[n].sha256} for n in sorted(names)
            if is_user_block(n)}


def with_needs(ckpt):
    """`ckpt` with NEEDS_KEY first (a JSON string, so that `check_user_blocks` reads it in the pickle's first
    opcodes) when its models name user blocks; without it otherwise."""
    ckpt = {k: v for k, v in ckpt.items() if k != NEEDS_KEY}
    models = [ckpt.get(k) for k in ("model", "ema")]
    needs = needs_user_blocks([m.get("yaml") for m in models if isinstance(m, dict)])
    return {NEEDS_KEY: json.dumps(needs), **ckpt} if needs else ckpt


def recorded_needs(pickle_bytes):
    """The NEEDS_KEY record at the start of a checkpoint's pickle, read statically (nothing is built), or {}."""
    seen = []
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(pickle_bytes)):
            if op.name in ("PROTO", "FRAME", "BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"):
                continue
            seen.append(arg if op.name.endswith("UNICODE") else op.name)
            if len(seen) == 4:
                break
    except ValueError:
        return {}  # damaged: torch's reader and the checks say how
    if seen[:3] != ["EMPTY_DICT", "MARK", NEEDS_KEY] or len(seen) < 4 or not isinstance(seen[3], str):
        return {}
    try:
        needs = json.loads(seen[3])
    except ValueError:
        return {}
    # a class name each, as use_modules registers them: anything else is no block of anybody's (and no second line
    # in an error message); the model's YAML still fails to build a name nobody registered
    return {k: v for k, v in needs.items() if k.isidentifier()} if isinstance(needs, dict) else {}


def _short(text, n=200):
    """What a file says, on one line of at most about n characters."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def check_user_blocks(pickle_bytes, path):
    """BadCheckpoint naming the user blocks a checkpoint needs that no --modules file gave; a warning for each given
    by a file other than the one it was saved with (its sha256 differs)."""
    needs = recorded_needs(pickle_bytes)
    missing = sorted(n for n in needs if n not in USER_BLOCKS)
    if missing:
        files = sorted({str(rec["file"]) for n in missing if isinstance(rec := needs[n], dict) and rec.get("file")})
        raise BadCheckpoint(f"{path}: its model needs blocks of your own ({_short(', '.join(missing))}, from "
                            f"{_short(', '.join(files))}): give that file with --modules FILE.py (modules=[...] in "
                            "Python)")
    for n, rec in needs.items():
        if isinstance(rec, dict) and rec.get("sha256") != USER_BLOCKS[n].sha256:
            LOGGER.warning(f"{path}: block {n} comes from {USER_BLOCKS[n].file}, whose sha256 differs from the "
                           f"file the checkpoint was saved with ({str(rec.get('sha256'))[:12]}): its outputs may "
                           "differ from those of the model saved")
