"""A model from a weights argument: a file of ours or an official one, downloaded first where it is a bare official
name, read by the safe loader and built as our model class."""

from pathlib import Path

from models.checkpoints.official import from_official
from models.checkpoints.ours import MODEL_CLASSES, model_from_ckpt
from models.checkpoints.releases import resolve_weights
from models.checkpoints.safe import load_checkpoint
from models.yolo import yaml_model_load
from utils.errors import BadCheckpoint, UserError


def _model_entry(ckpt, path):
    """The model a checkpoint holds: its `ema` if present, else `model`. Whatever in it does not build a model (a
    missing key, a wrong type, a YAML the parser refuses, weights of other shapes) is a BadCheckpoint."""
    entry = None
    if isinstance(ckpt, dict):
        entry = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if entry is None:
        raise BadCheckpoint(f"{path}: not a model checkpoint (expected a dict with a 'model' or 'ema' entry)")
    if isinstance(entry, dict) and (entry.get("class") not in MODEL_CLASSES
                                    or not isinstance(entry.get("state_dict"), dict)):
        raise BadCheckpoint(f"{path}: its model entry is not one this project wrote")
    try:
        return model_from_ckpt(entry) if isinstance(entry, dict) else from_official(entry, path)
    except BadCheckpoint:
        raise
    except (UserError, KeyError, AttributeError, TypeError, ValueError, IndexError, RuntimeError) as e:
        raise BadCheckpoint(f"{path}: its model is malformed ({type(e).__name__}: {_one_line(e)})") from e


def _one_line(e):
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


def attempt_load(weights, device="cpu", fuse=True):
    """Load our checkpoint (its `ema` if present, else `model`) or an official YOLOv5/v7/v8 `.pt` file.

    Returns the model in eval mode, float32, on `device`, fused if asked. A missing bare official name (e.g.
    'yolov8n.pt') is downloaded first; any other missing path raises FileNotFoundError.
    """
    path = resolve_weights(weights)
    model = _model_entry(load_checkpoint(path), path).float()
    if fuse:
        model.fuse()
    return model.eval().to(device)


def model_yaml(cfg):
    """The model dict `cfg` names: a model YAML (name under models/, path or dict), or a checkpoint (.pt, ours or
    official, by name or path) whose own model it is."""
    if isinstance(cfg, (str, Path)) and str(cfg).endswith(".pt"):
        return attempt_load(cfg, device="cpu", fuse=False).yaml
    return yaml_model_load(cfg)


