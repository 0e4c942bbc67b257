"""`YOLO.predict` on images in memory (numpy HWC RGB arrays, PIL images) or a list of them or of image paths: the
hub wrapper (models/hub.py) one image at a time, with the predict scripts' options that apply to a single picture;
paths, folders, videos and streams go to the task's predictor instead (yolo/model.py)."""

from pathlib import Path

# the options an image in memory takes: Ultralytics' names, with the predict scripts' where they differ
OPTIONS = ("conf", "iou", "imgsz", "classes", "max_det", "augment", "device", "half", "save", "save_txt",
           "save_conf", "save_crop", "show", "line_width", "project", "name", "exist_ok")
ALIASES = {"conf_thres": "conf", "iou_thres": "iou", "img": "imgsz", "line_thickness": "line_width",
           "view_img": "show"}
WORDS = {int: "whole number", float: "number"}


def _checked(options):
    from utils.cli import did_you_mean
    from utils.errors import BadOption

    options = {ALIASES.get(k, k): v for k, v in options.items()}
    for key in options:
        if key not in OPTIONS:
            raise BadOption(f"predict on images in memory: no option {key}{did_you_mean(key, OPTIONS)} (known: "
                            f"{', '.join(OPTIONS)}; paths, folders and videos take the predict script's)")
    return options


def _number(options, key, kind, default):
    """options[key] as `kind` (int or float), else `default`; BadOption naming it for a value of another kind (one
    image size, as the predict scripts' --imgsz, not a list)."""
    from utils.errors import BadOption

    value = options.get(key)
    if value is None:
        return default
    try:
        if isinstance(value, (bool, list, tuple, dict)):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise BadOption(f"predict on images in memory: {key}={value!r}: give one {WORDS[kind]}") from None


def hub_predict(yolo, source, options):
    """The Results of each image of `source`, one at a time, drawn, written and shown as `options` ask."""
    import torch

    from engine.tasks import TASKS
    from evaluation.results import window_problem
    from models.backend import InferenceBackend
    from models.hub import HubModel
    from utils.dist import api_device
    from utils.errors import BadOption
    from utils.files import increment_path
    from utils.log import LOGGER

    o = _checked(options)
    device = api_device(o.get("device") or None)  # '0', 'cpu' as a path's predict takes --device
    half = bool(o.get("half")) and device.type == "cuda"
    backend = InferenceBackend(yolo._weights(), device=device, half=half)
    if o.get("augment") and backend.model is None:
        raise BadOption(f"augment=True needs .pt weights, not {yolo.model} (an export takes one input size)")
    size = _number(o, "imgsz", int, None) or backend.run.get("imgsz") or 640
    # a .pt model back in torch's default layout (the backend's channels_last changes float rounding): the boxes
    # torch.hub's model gives, to the bit
    model = backend.model.to(memory_format=torch.contiguous_format) if backend.model is not None else backend
    hub = HubModel(model, TASKS[yolo.task].fields)
    hub.conf, hub.iou, hub.classes = _number(o, "conf", float, hub.conf), _number(o, "iou", float, None), \
        o.get("classes")
    hub.max_det = _number(o, "max_det", int, hub.max_det)
    saving = o.get("save") or o.get("save_txt") or o.get("save_crop")
    save_dir = increment_path(Path(o.get("project") or f"runs/{yolo.task}") / (o.get("name") or "predict"),
                              exist_ok=bool(o.get("exist_ok")), mkdir=True) if saving else None
    show = o.get("show") and window_problem("show") is None  # without a display: one line, not one per image
    for i, im in enumerate(source if isinstance(source, (list, tuple)) else [source]):
        r = hub.one(im, i, size, augment=bool(o.get("augment")))
        stem = Path(r.path).stem
        if o.get("save"):
            r.save(save_dir / f"{stem}.jpg", line_width=o.get("line_width"))
        if o.get("save_txt"):
            r.save_txt(save_dir / "labels" / f"{stem}.txt", save_conf=bool(o.get("save_conf")))
        if o.get("save_crop"):
            r.save_crop(save_dir / "crops", file_name=f"{stem}.jpg")
        if show:
            r.show()
        LOGGER.info(f"{r.path}: {r.verbose()}, {r.speed['inference']:.1f}ms")
        yield r
    if save_dir is not None:
        LOGGER.info(f"Results saved to {save_dir}")
