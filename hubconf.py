"""torch.hub entry points for every model family and task this repository trains.

    import torch
    model = torch.hub.load('path/to/this/repo', 'yolov5s', source='local')           # official weights (download)
    model = torch.hub.load('path/to/this/repo', 'yolov8n_seg', source='local', pretrained=False, classes=3)
    model = torch.hub.load('path/to/this/repo', 'yolov8n_pose', source='local')      # 17 COCO person keypoints
    model = torch.hub.load('path/to/this/repo', 'custom', path='runs/train/exp/weights/best.pt', source='local')
    results = model('data/images/shapes1.jpg')    # also a numpy HWC RGB array, a PIL image, or a list of them
    print(results); results.tolist()              # boxes in the image's pixels with class names
"""

dependencies = ["torch", "numpy", "cv2", "yaml"]


def _wrap(model, autoshape, device):
    from engine.tasks import TASKS
    from models.backend import model_task
    from models.hub import HubModel
    from utils.dist import api_device

    device = api_device(device)  # '0', 'cpu', 'cuda:1' as the scripts' --device takes them
    return (HubModel(model, TASKS[model_task(model)].fields) if autoshape else model.eval()).to(device)


def custom(path, autoshape=True, device=None):
    """A checkpoint of ours (best.pt / last.pt), an official YOLOv5 / YOLOv7 / YOLOv8 `.pt` file, or a file or
    OpenVINO folder made with export.py (autoshape letterboxes images to the one size a static export takes)."""
    from pathlib import Path

    from models.checkpoints import attempt_load
    from utils.cli import WEIGHTS_FORMATS

    # an export (a file or an OpenVINO folder) by the table the backend reads formats from
    if Path(path).is_dir() or WEIGHTS_FORMATS.get(Path(path).suffix.lower(), "pytorch") != "pytorch":
        from engine.tasks import TASKS
        from models.backend import InferenceBackend
        from models.hub import HubModel
        from utils.dist import api_device

        backend = InferenceBackend(path, device=api_device(device or "cpu"))
        return HubModel(backend, TASKS[backend.task].fields) if autoshape else backend
    return _wrap(attempt_load(path, device="cpu", fuse=True), autoshape, device)


def _create(name, pretrained=True, channels=3, classes=80, autoshape=True, device=None):
    """Official weights `name`.pt when pretrained (downloaded once), else the YAML `name` with `classes` classes."""
    from engine.tasks import TASKS
    from models.checkpoints import attempt_load
    from yolo.scripts import model_task

    if pretrained:
        return _wrap(attempt_load(f"{name}.pt", device="cpu", fuse=True), autoshape, device)
    model = TASKS[model_task(f"{name}.yaml")].model  # the class of the task the YAML's name says
    return _wrap(model(f"{name}.yaml", ch=channels, nc=classes), autoshape, device)


def _entry(name):
    default_classes = 1 if name.endswith("-pose") else 80  # official pose models: one class (person)

    def load(pretrained=True, channels=3, classes=default_classes, autoshape=True, device=None):
        return _create(name, pretrained, channels, classes, autoshape, device)

    load.__name__ = name.replace("-", "_")
    load.__doc__ = f"{name}: official weights when pretrained, else built from {name}.yaml with `classes` classes."
    return load


_NAMES = [f"yolov5{s}{t}" for t in ("", "-seg", "-cls") for s in "nsmlx"]
_NAMES += [f"yolov8{s}{t}" for t in ("", "-seg", "-cls", "-pose") for s in "nsmlx"]
_NAMES += [f"yolov5{s}u" for s in "nsmlx"]  # YOLOv5u: Ultralytics' anchor-free YOLOv5 (yolov5nu.pt)
_NAMES += ["yolov7", "yolov7x", "yolov7-tiny"]
globals().update({n.replace("-", "_"): _entry(n) for n in _NAMES})
