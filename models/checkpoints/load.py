"""A model from a weights argument: a file of ours or an official one, downloaded first where it is a bare official
name, read by the safe loader and built as our model class."""

from pathlib import Path

from models.checkpoints.official import from_official
from models.checkpoints.ours import MODEL_CLASSES, model_from_ckpt
from models.checkpoints.releases import resolve_weights
from models.checkpoints.safe import load_checkpoint
from models.yolo import yaml_model_load
from utils.budget import MAX_IMGSZ
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
    return load_model(weights, device, fuse)[0]


def load_model(weights, device="cpu", fuse=True):
    """(model, run): attempt_load's model, and `training_run` of the same checkpoint, read once."""
    path = resolve_weights(weights)
    ckpt = load_checkpoint(path)
    model = _model_entry(ckpt, path).float()
    if fuse:
        model.fuse()
    return model.eval().to(device), training_run(ckpt, path)


def image_size(value):
    """An image size as the options hold it: an int (a [h, w] pair: its long side); None for anything else, a size
    under 1 pixel included."""
    sizes = value if isinstance(value, (list, tuple)) and value else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
        return None
    return max(sizes) if min(sizes) > 0 else None


def training_run(ckpt, source=None):
    """{'imgsz', 'data'} a checkpoint dict says of the run that trained it, where it says it: ours in `opt`
    (`train_imgsz`, and `data_path`, the dataset the run read, absolute), an official YOLOv5 one in `opt` (`imgsz`),
    an Ultralytics one in `train_args` (`imgsz`). The official ones name COCO, which a val script would download, so
    only ours give a dataset (engine/inherit.py). `source` names the file in a refusal (`run_record`)."""
    opt = ckpt.get("opt") if isinstance(ckpt.get("opt"), dict) else ckpt.get("train_args")
    if not isinstance(opt, dict):
        return {}
    return run_record(opt.get("train_imgsz") if image_size(opt.get("train_imgsz")) else opt.get("imgsz"),
                      opt.get("data_path"), source)


def run_record(imgsz, data, source=None):
    """{'imgsz', 'data'} of a run, each where known (`imgsz` as `image_size` reads it): what a checkpoint
    (`training_run`) or an export's metadata (models/backend.InferenceBackend.run) says of the run that made it.

    What a file says is input like a command line, and checked as one (docs/safety.md): an image size beyond the
    MAX_IMGSZ that --img takes, or a dataset that is not a path, is refused (BadCheckpoint naming `source`, the
    file). A size in another form than a command writes (text, a float) says no size, as before."""
    where = f"{source}: its" if source else "its"
    size = image_size(imgsz)
    if size is not None and size > MAX_IMGSZ:
        raise BadCheckpoint(f"{where} run record gives image size {size}, larger than the {MAX_IMGSZ} that --img "
                            "takes (docs/safety.md)")
    if data is not None and not isinstance(data, str):
        raise BadCheckpoint(f"{where} run record's dataset is {type(data).__name__} {data!r:.60}, not a path")
    found = {"imgsz": size, "data": data}
    return {k: v for k, v in found.items() if v}


def model_yaml(cfg):
    """The model dict `cfg` names: a model YAML (name under models/, path or dict), or a checkpoint (.pt, ours or
    official, by name or path) whose own model it is."""
    if isinstance(cfg, (str, Path)) and str(cfg).endswith(".pt"):
        return attempt_load(cfg, device="cpu", fuse=False).yaml
    return yaml_model_load(cfg)


