"""`YOLO`: the Python API Ultralytics' users know, over this project's scripts and hub wrapper.

    from yolo import YOLO
    model = YOLO("yolov8n.yaml")                      # a model YAML to train, or weights: .pt, .onnx, .torchscript
    model.train(data="data/shapes.yaml", epochs=3, imgsz=160, batch=8)   # then `model` is the run's best.pt
    metrics = model.val()                             # the run's dataset and image size unless given
    results = model.predict("data/images")            # models.hub.Results, as torch.hub's models return
    results.xyxy[0], results.tolist()
    path = model.export(format="onnx")                # the exported file

Each method runs the script of the model's task and mode (yolo/scripts.py), with keyword arguments named as the
script's flags or as Ultralytics names them (batch, conf, iou, format), checked as a command line is; a mistake is a
utils.errors.UserError naming the option. `predict` runs the hub wrapper (models/hub.py) on images, arrays or PIL
images, a folder or a glob; the predict scripts (or `yolo predict`) also take videos and streams and save pictures.
"""

from pathlib import Path

from yolo.scripts import check_words, load_script, model_task


class YOLO:
    """A model YAML or weights file, and the task its head serves (`task` to say it where the name does not)."""

    def __init__(self, model="yolov8n.yaml", task=None):
        from utils.versions import check_torch_pair

        check_torch_pair()  # as every script does at start
        self.model = str(model)
        self.task = task or model_task(self.model)
        check_words(self.task, "train")
        self.trainer = self.metrics = None

    def __repr__(self):
        return f"YOLO({self.model!r}, task={self.task!r})"

    def _opt(self, mode, options):
        """The script module of `mode` and its options: `options` as `key=value` words, the model first."""
        module = load_script(self.task, mode)
        words = [f"{k}={v}" for k, v in {"model": self.model, **options}.items() if v is not None]
        return module, module.parse_opt(words)

    def train(self, callbacks=None, **options):
        """Train (train.run's options; `callbacks` as it takes them); afterwards this object is the run's best.pt
        (last.pt where no epoch validated). Returns the final metrics."""
        module, opt = self._opt("train", options)
        self.trainer, self.metrics = module.main(opt, callbacks)
        ck = self.trainer.checkpointer
        self.model = str(ck.best if ck.best.is_file() else ck.last)
        return self.metrics

    def val(self, **options):
        """Validate (the val script's options); returns its results dict."""
        module, opt = self._opt("val", options)
        self.metrics = module.main(opt)
        return self.metrics

    def export(self, **options):
        """Export (export.py's options; format= is --include); returns the path of the file, or the paths of several
        formats."""
        module, opt = self._opt("export", options)
        files = [str(f) for f in module.main(opt)]
        return files[0] if len(files) == 1 else files

    def predict(self, source, imgsz=None, conf=0.25, iou=0.45, classes=None, max_det=1000, augment=False,
                device=None):
        """models.hub.Results of `source`: an image path, a folder or a glob of images, a numpy HWC RGB array, a PIL
        image, or a list of them. `imgsz` defaults to the size the weights trained at (engine/inherit.py), else 640."""
        import torch

        from models.backend import InferenceBackend
        from models.hub import HubModel

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        backend = InferenceBackend(self.model, device=device)
        if augment and backend.model is None:
            from utils.errors import BadOption

            raise BadOption(f"augment=True needs .pt weights, not {self.model} (an export takes one input size)")
        size = imgsz or backend.run.get("imgsz") or 640
        # a .pt model back in torch's default layout (the backend's channels_last changes float rounding): the
        # boxes torch.hub's model gives, to the bit
        model = backend.model.to(memory_format=torch.contiguous_format) if backend.model is not None else backend
        hub = HubModel(model)
        hub.conf, hub.iou, hub.classes, hub.max_det = conf, iou, classes, max_det
        return hub(_images(source), size=size, augment=augment)

    __call__ = predict


def _images(source):
    """A folder or glob (text naming no file) as its image files; anything else as it is."""
    items = source if isinstance(source, (list, tuple)) else [source]
    out = []
    for item in items:
        if isinstance(item, (str, Path)) and not Path(item).is_file():
            from utils.data.image_files import scan_files

            try:
                out += scan_files(str(item), recursive=False)[0]
            except FileNotFoundError as e:
                from utils.errors import BadFile

                raise BadFile(f"source {item}: {e}") from None
        else:
            out.append(item)
    return out
