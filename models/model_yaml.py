"""Model YAML: finding a YAML by name, loading it, checking its values, and building its layers (`parse_model`) by
the rules each block declares (models/common.py: `channel_rule`, `repeat_arg`, `scale_args`, `proto_arg`).

YAML schema (official): `nc`, optional `anchors`, either `depth_multiple`/`width_multiple` (one file per size, v5/v7)
or `scales: {n: [depth, width, max_channels], ...}` (v8, one file for all sizes), `backbone` and `head` lists of
`[from, number, module, args]`, and optionally `hyp` naming the default hyperparameter file.
"""

import ast
import dataclasses
import math
import re
from copy import deepcopy
from pathlib import Path

import torch.nn as nn
import yaml

from models.common import model_activation
from models.registry import ACTIVATIONS, is_user_block, known_names, resolve
from utils.budget import MAX_CLASSES
from utils.cli import did_you_mean
from utils.errors import BadModelYaml
from utils.files import ConfigError, parse_yaml, yaml_text

MODELS_DIR = Path(__file__).resolve().parent

_ACTIVATION_RE = re.compile(r"^nn\.(\w+)\(([^()]*)\)$")


def make_divisible(x, divisor=8):
    return int(math.ceil(x / divisor) * divisor)


def _find_yaml(cfg):
    """Path of a model YAML and the scale its name implies: `yolov8n-seg.yaml` -> (models/yolov8-seg.yaml, 'n')."""
    path = Path(cfg)
    unified = re.sub(r"(\d+)([nslmx])(.*)$", r"\1\3", path.stem) + path.suffix
    match = re.search(r"yolov?\d+([nslmx])", path.stem)
    for candidate in (path, MODELS_DIR / path.name):
        if candidate.is_file():
            return candidate, None
    for candidate in (path.with_name(unified), MODELS_DIR / unified):
        if match and candidate.is_file():
            if not re.search(r"^scales:", candidate.read_text(), re.M):  # one size only: the name's would be ignored
                raise BadModelYaml(f"model YAML '{cfg}' not found; {candidate.name} has one size, not scales")
            return candidate, match.group(1)
    raise BadModelYaml(f"model YAML '{cfg}' not found (also looked in {MODELS_DIR})"
                       f"{did_you_mean(path.name, _model_names())}")


def _model_names():
    """The model names --cfg takes: every YAML under models/, and for those with `scales`, each scale's name."""
    names = []
    for f in sorted(MODELS_DIR.glob("*.yaml")):
        names.append(f.name)
        if re.search(r"^scales:", f.read_text(), re.M):
            names += [re.sub(r"^(yolov?\d+)", rf"\g<1>{s}", f.name) for s in "nslmx"]
    return names


def yaml_model_load(cfg):
    """Model dict from a YAML name under models/, a path, or a dict (deep-copied, never mutated)."""
    if isinstance(cfg, dict):
        return deepcopy(cfg)
    path, scale = _find_yaml(cfg)
    try:
        d = parse_yaml(yaml_text(path), path)
    except ConfigError as e:
        raise BadModelYaml(str(e)) from None
    missing = [k for k in ("backbone", "head") if not isinstance(d, dict) or not isinstance(d.get(k), list)]
    if missing:
        raise BadModelYaml(f"{path}: needs {' and '.join(missing)} lists of [from, number, module, args]")
    if "scales" in d:
        d["scale"] = scale or d.get("scale") or next(iter(d["scales"]))
    d["yaml_file"] = str(path)
    return d


def _yaml_line(path, section, index):
    """1-based line of entry `index` of list `section` in a YAML file, for error messages (None if unknown)."""
    try:
        root = yaml.compose(Path(path).read_text())
        node = next(v for k, v in root.value if k.value == section)
        return node.value[index].start_mark.line + 1
    except (OSError, StopIteration, IndexError, AttributeError, yaml.YAMLError):
        return None


def _where(d, section, index):
    path = d.get("yaml_file", "<dict>")
    line = _yaml_line(path, section, index) if path != "<dict>" else None
    return f"{path}{f':{line}' if line else ''} ({section}[{index}])"


def _resolve_module(name, d, section, index):
    m = resolve(name, anchor_based="anchors" in d)
    if m is None:
        hint = "; a block of your own comes with --modules FILE.py" if not name.startswith("nn.") else ""
        raise BadModelYaml(f"{_where(d, section, index)}: unknown module '{name}'{hint}; known: {known_names()}")
    return m


def _last_row(d):
    """(section, index, row) of the last layer a model dict lists, None when it lists none."""
    rows = [(k, j, r) for k in ("backbone", "head") if isinstance(d.get(k), list) for j, r in enumerate(d[k])]
    return rows[-1] if rows else None


def head_class(d):
    """The class of the last layer a model dict lists (its head), None when that row is malformed (parse_model says
    how); a module name nothing registers is a BadModelYaml."""
    last = _last_row(d)
    if last is None or not isinstance(last[2], list) or len(last[2]) != 4 or not isinstance(last[2][2], str):
        return None
    section, j, row = last
    return _resolve_module(row[2], d, section, j)


def head_task(d):
    """The task ('detect', 'segment', 'pose', 'classify') of the head a model dict ends in, None when its last row
    is no head (or is malformed: parse_model says how)."""
    return getattr(head_class(d), "task", None)


def check_head(d, tasks):
    """A model class builds only the heads it serves: a classifier's head in a box model has no strides to find,
    a box head in a classifier no class logits."""
    task = head_task(d)
    if task not in tasks:
        last = _last_row(d)
        row = last[2] if last else None
        name = row[2] if isinstance(row, list) and len(row) == 4 else repr(row)
        head = name if task else f"{name}, not a head"
        raise BadModelYaml(f"{d.get('yaml_file', '<dict>')}: ends in {head}"
                           f"{f' (a {task} model)' if task else ''}; this model class takes {'/'.join(tasks)} heads")


def _parse_activation(text):
    """`nn.LeakyReLU(0.1)` -> nn.LeakyReLU(0.1) for registered activations with literal arguments, else None."""
    match = _ACTIVATION_RE.match(text.strip())
    if not match or match.group(1) not in ACTIVATIONS:
        return None
    try:
        args = [ast.literal_eval(a.strip()) for a in match.group(2).split(",") if a.strip()]
    except (ValueError, SyntaxError):
        return None
    return ACTIVATIONS[match.group(1)](*args)


def _resolve_arg(a, d, section, index):
    """YAML argument -> value: 'nc'/'anchors'/'kpt_shape' from the dict, 'None' -> None, activation calls -> modules."""
    if not isinstance(a, str):
        return a
    if a in ("nc", "anchors", "kpt_shape"):
        return d[a]
    if a == "None":
        return None
    if a.startswith("nn."):
        act = _parse_activation(a)
        if act is None:
            raise BadModelYaml(f"{_where(d, section, index)}: unsupported argument '{a}'; known: {sorted(ACTIVATIONS)}")
        return act
    return a  # plain strings such as 'nearest'


def _layer_args(m, f, n, args, ch, scaling):
    """Final constructor args, repeat count and output channels of one layer, by the block's declared
    `channel_rule`, `repeat_arg`, `scale_args` and `proto_arg` (models/common.py) under the official scaling rules."""
    rule = getattr(m, "channel_rule", None)
    width, max_channels = scaling.width, scaling.max_channels
    if rule in ("width", "fixed"):
        c2 = make_divisible(min(args[0], max_channels) * width, 8) if rule == "width" else args[0]
        args = [ch[f], c2, *args[1:]]
        if getattr(m, "repeat_arg", False):
            args.insert(2, n)
            n = 1
        for scales, (k, value) in getattr(m, "scale_args", {}).items():
            if scaling.scale and scaling.scale in scales:  # the argument's slot, added where the row leaves it out
                args[k:k + 1] = [value]
    elif rule == "concat":
        c2 = sum(ch[x] for x in f)
    elif rule == "add":
        c2 = ch[f[0]]
    elif rule == "space_to_depth":
        c2 = 4 * ch[f]
    elif rule == "levels":
        c2 = None  # the head is the last layer
        args = [*args, [ch[x] for x in f]]
        if m.anchor_based and isinstance(args[1], int):  # an anchor count: placeholders for autoanchor, per level
            args[1] = [list(range(args[1] * 2))] * (len(f) // getattr(m, "inputs_per_level", 1))
        k = getattr(m, "proto_arg", None)
        if k is not None and len(args) > k + 1:
            args[k] = make_divisible(min(args[k], max_channels) * width, 8)
    elif rule is None:
        c2 = ch[f]
    else:
        known = "'width', 'fixed', 'concat', 'add', 'space_to_depth', 'levels'"
        raise NotImplementedError(f"{m.__name__}.channel_rule = {rule!r}: parse_model knows {known}")
    return args, n, c2


@dataclasses.dataclass(frozen=True)
class Scaling:
    """How a model dict scales its rows: depth, width, max_channels, the scale's name (None without `scales`), and
    whether its anchor-free head has YOLO11's depthwise class branches (a block of it declares `dw_head`)."""

    depth: float
    width: float
    max_channels: float
    scale: str = None
    dw_head: bool = False


def _scaling(d):
    """Scaling from `scales` + `scale` (v8) or `depth/width_multiple` (v5/v7)."""
    scale = None
    if "scales" in d:
        scale = d.get("scale") or next(iter(d["scales"]))
        values, names = d["scales"][scale], (f"scales.{scale}",) * 3
    else:
        values, names = (d.get("depth_multiple", 1.0), d.get("width_multiple", 1.0), float("inf")), (
            "depth_multiple", "width_multiple", "max_channels")
    if not isinstance(values, (list, tuple)) or len(values) != 3:
        raise BadModelYaml(f"{d.get('yaml_file', '<dict>')}: {names[0]} must be [depth, width, max_channels]")
    for i, (name, v) in enumerate(zip(names, values)):
        # max_channels may be infinite (no cap); an infinite depth or width would be rounded to an integer
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or (i < 2 and not math.isfinite(v)):
            raise BadModelYaml(f"{d.get('yaml_file', '<dict>')}: {name} must be a finite number > 0, got {v!r:.40}")
    rows = [r for k in ("backbone", "head") for r in d[k] if isinstance(r, list) and len(r) == 4]
    dw_head = any(getattr(resolve(r[2], "anchors" in d), "dw_head", False) for r in rows if isinstance(r[2], str))
    return Scaling(*values, scale=scale if isinstance(scale, str) else None, dw_head=dw_head)


# Bounds on what a YAML may ask for (official models: under 110 rows, blocks repeated at most 12 times, 3 anchors per
# level, 3 input channels, 17 keypoints); a model YAML can come from a checkpoint file, and every row, repeat, anchor
# and class builds Python objects before any weight is checked
MAX_ROWS, MAX_REPEATS, MAX_ANCHORS, MAX_INPUT_CHANNELS, MAX_KEYPOINTS = 1024, 256, 64, 64, 1024


def _count(v, hi):
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi


def _anchors_ok(a):
    """An anchor count per level, or a list of levels each listing w, h pairs of finite positive numbers."""
    if a is None or _count(a, MAX_ANCHORS):
        return True
    return isinstance(a, list) and 0 < len(a) <= 16 and all(
        isinstance(level, list) and 0 < len(level) <= 2 * MAX_ANCHORS and len(level) % 2 == 0 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in level)
        for level in a)


def check_values(d):
    """Refuse (BadModelYaml) a model-wide value no model has, before anything is built from it: a class count,
    input channels, anchors or keypoints beyond the bounds above (`anchors: 20000000` would make lists of 40 M
    numbers), multiples that are not finite numbers."""
    where = d.get("yaml_file", "<dict>")
    checks = {"nc": _count(d.get("nc"), MAX_CLASSES), "ch": _count(d.get("ch", 3), MAX_INPUT_CHANNELS),
              "anchors": _anchors_ok(d.get("anchors")),
              "kpt_shape": "kpt_shape" not in d or (isinstance(d["kpt_shape"], list) and len(d["kpt_shape"]) == 2
                                                    and _count(d["kpt_shape"][0], MAX_KEYPOINTS)
                                                    and d["kpt_shape"][1] in (2, 3)),
              # a file of data/hyps by name: a YAML (one in a checkpoint) names no other file to read
              "hyp": d.get("hyp") is None or (isinstance(d["hyp"], str) and re.fullmatch(r"[\w.-]+\.yaml", d["hyp"])
                                               is not None)}
    bad = next((k for k, ok in checks.items() if not ok), None)
    if bad:
        raise BadModelYaml(f"{where}: '{bad}' is {d.get(bad)!r:.80}, beyond what a model takes (nc 1..{MAX_CLASSES}, "
                           f"ch 1..{MAX_INPUT_CHANNELS}, up to {MAX_ANCHORS} finite positive anchors per level, "
                           f"kpt_shape [1..{MAX_KEYPOINTS}, 2 or 3], hyp the name of a file in data/hyps)")
    _scaling(d)



def _build_layer(row, d, section, j, ch, scaling):
    """One YAML row -> (module, output channels); a row that cannot be built is a BadModelYaml naming its line."""
    if not isinstance(row, list) or len(row) != 4:
        raise BadModelYaml(f"{_where(d, section, j)}: expected [from, number, module, args], got {row!r}")
    f, n, name, args = row
    if isinstance(n, bool) or not isinstance(n, int) or not isinstance(args, list):
        raise BadModelYaml(f"{_where(d, section, j)}: expected [from, number, module, args] with an integer number and "
                           f"a list of args, got {row!r:.120}")
    m = _resolve_module(name, d, section, j)
    args = [_resolve_arg(a, d, section, j) for a in args]
    kwargs = {"act": a for a in args if isinstance(a, nn.Module)}
    args = [a for a in args if not isinstance(a, nn.Module)]
    if scaling.dw_head and getattr(m, "channel_rule", None) == "levels" and not m.anchor_based:
        kwargs["dw"] = True
    n = max(round(n * scaling.depth), 1) if n > 1 else n
    if not 1 <= n <= MAX_REPEATS:
        raise BadModelYaml(f"{_where(d, section, j)}: repeats {name} {n} times, expected 1..{MAX_REPEATS}")
    try:
        args, n, c2 = _layer_args(m, f, n, args, ch, scaling)
        m_ = nn.Sequential(*(m(*args, **kwargs) for _ in range(n))) if n > 1 else m(*args, **kwargs)
    except Exception as e:
        if is_user_block(name):  # the user's own code (--modules) refusing the row its own way: an assert, a rule
            raise BadModelYaml(f"{_where(d, section, j)}: your block {name} refused {row!r} "
                               f"({type(e).__name__}: {e})") from None
        # a built-in block declaring a rule parse_model lacks (NotImplementedError) is a bug, not the YAML's; the
        # YAML's: a wrong argument count or type, a bad 'from' index, torch refusing the shapes the row asks for
        if isinstance(e, NotImplementedError) or not isinstance(e, (TypeError, IndexError, KeyError, ValueError,
                                                                    RuntimeError)):
            raise
        raise BadModelYaml(f"{_where(d, section, j)}: cannot build {name} from {row!r} ({e})") from None
    m_.f, m_.type = f, m.__name__
    return m_, c2


def parse_model(d, ch):
    """Build nn.Sequential from a model dict; returns (model, sorted indices of layers whose outputs are reused).

    Arguments that are activation modules (`nn.LeakyReLU(0.1)` in YOLOv7 YAMLs) go to the `act` keyword, since
    YOLOv7's Conv has no dilation argument before `act` and the official YAMLs pass it positionally. A model-wide
    `activation: nn.LeakyReLU(0.1)` (yolov5s-LeakyReLU.yaml) is what every Conv told `act=True` uses.
    """
    rows = [("backbone", j, r) for j, r in enumerate(d["backbone"])] + [("head", j, r) for j, r in enumerate(d["head"])]
    if len(rows) > MAX_ROWS:
        raise BadModelYaml(f"{d.get('yaml_file', '<dict>')}: {len(rows)} layers, more than {MAX_ROWS}")
    scaling = _scaling(d)
    with model_activation(_model_activation(d)):
        model, save = _build_layers(rows, d, ch, scaling)
    _set_batchnorm(model, d)
    return model, save


def _model_activation(d):
    """The factory of the YAML's `activation:` (a registered activation with literal arguments), else SiLU's."""
    text = d.get("activation")
    if text is None:
        return nn.SiLU
    if not isinstance(text, str) or _parse_activation(text) is None:
        raise BadModelYaml(f"{d.get('yaml_file', '<dict>')}: activation {text!r:.60} is not one of "
                           f"nn.{{{', '.join(sorted(ACTIVATIONS))}}}(literal arguments)")
    return lambda: _parse_activation(text)


def _build_layers(rows, d, ch, scaling):
    ch = [ch] if isinstance(ch, int) else list(ch)
    layers, save = [], []
    for i, (section, j, row) in enumerate(rows):
        m_, c2 = _build_layer(row, d, section, j, ch, scaling)
        f = m_.f
        m_.i = i
        m_.np = sum(x.numel() for x in m_.parameters())
        save.extend(x % i for x in ([f] if isinstance(f, int) else f) if x != -1)
        layers.append(m_)
        if i == 0:
            ch = []
        ch.append(c2)
    return nn.Sequential(*layers), sorted(set(save))


def _set_batchnorm(model, d):
    """Optional `bn_eps` / `bn_momentum` YAML keys override the blocks' eps 0.001, momentum 0.03: the official
    YOLOv8 classifier never re-initialises BatchNorm and so runs with PyTorch's defaults (1e-5, 0.1)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eps = d.get("bn_eps", m.eps)
            m.momentum = d.get("bn_momentum", m.momentum)
