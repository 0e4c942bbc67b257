"""Training criteria, chosen by name through `build_criterion`.

Every criterion is called as `loss, loss_items = criterion(preds, batch)` on the model's train-mode output and
a batch dict on the model's device; `loss_names` labels the entries of `loss_items`.

Reductions (what DDP with `loss * WORLD_SIZE` reproduces): detection, segmentation and pose return the sum of their
weighted components times the per-rank batch size, as official. The objectness (v5/v7) and mask terms are sums over
images, so DDP gives exactly the single-process gradient of the concatenated batch; box and class terms are
normalised per rank (by the number of positives, or v8's target-score mass), so they match only when the ranks
hold similar numbers of targets, as in the official repos; so are pose's keypoint terms (means over the rank's
positives, as official) and oriented boxes' angle term. Classification returns sum of CE / 64, exact under DDP.
"""

import importlib
import pkgutil

# re-exported for callers; the registry below finds every criterion whether or not it is named here
from losses.cls import ClassificationLoss
from losses.obb import V8OBBLoss
from losses.seg import V5SegmentationLoss, V8SegmentationLoss
from losses.tal import Assignment, TaskAlignedAssigner
from losses.v5 import V5DetectionLoss
from losses.v7_ota import AuxOTADetectionLoss, OTADetectionLoss
from losses.v8 import V8DetectionLoss
from losses.v8pose import V8PoseLoss
from utils.dist import de_parallel
from utils.errors import BadOption


def _criteria():
    """{name: class} of every class a module of this package defines with a `name` of its own: a new criterion's
    module is found here, so no list of criteria is kept by hand (tests/utils/loss/test_loss_build.py checks that
    every class with `loss_names` declares one). Sorted by name: the order messages list them in."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__ and "name" in vars(cls) \
                    and hasattr(cls, "loss_names"):
                if cls.name in found:
                    raise TypeError(f"criteria {found[cls.name].__qualname__} and {cls.__qualname__} share the name "
                                    f"{cls.name!r}")
                found[cls.name] = cls
    return dict(sorted(found.items()))


REGISTRY = _criteria()

# the heads (by their `default_loss`) each criterion can train: its own `trains` where it declares one (own, not
# inherited: a subclass trains its own head), else the head whose loss it is. The anchor-based detection losses stand
# in for each other (`loss: v5` trains a YOLOv7 model); any other pairing reads outputs the head does not make (a v5
# or OTA loss would read IAuxDetect's auxiliary maps as more levels)
FITS = {name: set(vars(cls).get("trains", (name,))) for name, cls in REGISTRY.items()}


# the hyp key this module reads: which criterion trains the model (default: the head's own)
HYP_KEYS = {"loss": "criterion"}
HYP_DEFAULTS = {"loss": None}


def criterion_class(model, hyp):
    """The criterion class named by `hyp['loss']`, else by the head's `default_loss`."""
    head = de_parallel(model).model[-1]
    own = getattr(head, "default_loss", None)
    name = hyp.get("loss") or own
    if name not in REGISTRY:
        raise BadOption(f"unknown loss {name!r}; known: {', '.join(REGISTRY)}")
    if own is not None and own not in FITS[name]:
        raise BadOption(f"hyp loss {name!r} cannot train the model's {type(head).__name__} head (its loss is {own!r})")
    return REGISTRY[name]


def build_criterion(model, hyp, imgsz=640):
    """The criterion `criterion_class` names; `imgsz` (train image size) scales the anchor-based objectness gain. The
    hyp dict is only read."""
    return criterion_class(model, hyp)(model, hyp, imgsz)


__all__ = [
    "REGISTRY",
    "build_criterion",
    "criterion_class",
    "Assignment",
    "TaskAlignedAssigner",
    "ClassificationLoss",
    "V5DetectionLoss",
    "OTADetectionLoss",
    "AuxOTADetectionLoss",
    "V8DetectionLoss",
    "V5SegmentationLoss",
    "V8SegmentationLoss",
    "V8PoseLoss",
    "V8OBBLoss",
]
