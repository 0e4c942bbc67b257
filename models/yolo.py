"""YOLO models built from YAML (models/model_yaml.py reads the YAML and builds the layers): the detection,
segmentation, classification and pose models, and the budget check of a model about to be built.
"""

from copy import deepcopy
from pathlib import Path

import torch
import torch.nn as nn

from losses import build_criterion
from models.model_yaml import (  # noqa: F401 (head_class, make_divisible: imported from here by callers)
    MODELS_DIR,
    check_head,
    check_values,
    head_class,
    head_task,
    make_divisible,
    parse_model,
    yaml_model_load,
)
from utils.budget import ACTIVATION_BYTES_PER_INPUT, MAX_MODEL_BYTES, MAX_WEIGHT_BYTES, MODEL_PROBE_SIDE
from utils.dry_run import DryRunError, Unrunnable, dry_run
from utils.errors import BadModelYaml
from utils.log import LOGGER
from utils.tasks import TASKS

CLASSIFY_TASKS = ("classify",)  # the heads ClassificationModel builds; DetectionModel builds every other task's
BOX_TASKS = tuple(t for t in TASKS if t not in CLASSIFY_TASKS)


def check_cost(d, ch, s=MODEL_PROBE_SIDE):
    """Refuse (BadModelYaml) a model dict whose weights or forward pass would cost more than the budget
    (utils/budget.py), before any weight exists: the layers are built on the meta device, which allocates nothing,
    and a `s` x `s` image runs through them as a dry run that computes shapes only. The budget is memory: the
    weights as float32, and those plus the activations of that forward pass. Every model of models/ is inside
    (docs/safety.md). Returns the meta layers' count of weights and buffers."""
    check_values(d)
    where = d.get("yaml_file", "<dict>")
    with torch.device("meta"):
        layers, save = parse_model(d, ch)
    n = sum(p.numel() for p in layers.parameters())
    if 4 * n > MAX_WEIGHT_BYTES:
        raise BadModelYaml(f"{where}: describes {n} weights, {4 * n / 2**30:.2f} GiB as float32, more than the "
                           f"{MAX_WEIGHT_BYTES / 2**30:g} GiB a model's weights may take (docs/safety.md)")
    probe = BaseModel()
    probe.model, probe.save = layers, save
    try:
        run, _ = dry_run(lambda x: probe.eval()._forward_once(x, head=False), (1, ch, s, s))
    except Unrunnable as e:
        raise BadModelYaml(f"{where}: its layers do not fit together ({e})") from None
    except DryRunError as e:
        raise BadModelYaml(f"{where}: run on a {s}x{s} image, {e}: beyond the budget of {ACTIVATION_BYTES_PER_INPUT} "
                           "bytes of activations per input value (docs/safety.md)") from None
    if 4 * n + run.bytes > MAX_MODEL_BYTES:
        raise BadModelYaml(f"{where}: its weights and the activations of one {s}x{s} image take "
                           f"{(4 * n + run.bytes) / 2**30:.2f} GiB, more than the {MAX_MODEL_BYTES / 2**30:g} GiB a "
                           "model may take (docs/safety.md)")
    return sum(t.numel() for t in layers.state_dict().values())


def _check_budget(cfg, d, ch):
    """The budget check of a model about to be built: the values of this project's own YAMLs (a name under models/,
    whose layers are known), the whole cost of any other (a dict from a checkpoint, a user's file)."""
    own = not isinstance(cfg, dict) and Path(d["yaml_file"]).resolve().parent == MODELS_DIR
    check_values(d) if own else check_cost(d, ch)


def _sources(m):
    """The layer indices a layer reads (its `from`, -1 and other negatives made absolute); the input for layer 0."""
    f = m.f if isinstance(m.f, list) else [m.f]
    return [j % m.i if j < 0 else j for j in f] if m.i > 0 else []


def eval_idle_layers(layers):
    """Indices of the layers that eval mode need not run, sorted: those whose outputs reach only head inputs the head
    does not read in eval mode (its `eval_inputs`: the first so many of them; IAuxDetect's auxiliary maps are the
    rest). Empty for a head that reads all its inputs. A tuple: a model pickled whole holds it, and the checkpoint
    loader admits no set type."""
    head = layers[-1]
    n = getattr(head, "eval_inputs", None)
    if n is None:
        return ()
    needed, todo = set(), _sources(head)[:n]
    while todo:
        i = todo.pop()
        if i not in needed:
            needed.add(i)
            todo += _sources(layers[i])
    return tuple(i for i in range(head.i) if i not in needed)


class BaseModel(nn.Module):
    """A YAML-built layer list run in order, keeping only the outputs later layers read (`save`). In eval mode the
    layers in `eval_idle` are skipped (their outputs are None): only a training head's auxiliary branch reads them."""

    eval_idle = ()

    def forward(self, x):
        return self._forward_once(x)

    def _forward_once(self, x, head=True):
        """Run the layers; with head=False stop at the head and return its inputs."""
        y = []
        last = len(self.model) - 1
        idle = () if self.training else self.eval_idle
        for m in self.model:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            if not head and m.i == last:
                return x
            if m.i in idle:
                y.append(None)
                continue
            x = m(x)
            y.append(x if m.i in self.save else None)
        return x

    def fuse(self):
        """Fold BatchNorm into convs, re-parameterise RepConv, fold YOLOv7 implicit layers; for inference. The
        parameter count before folding is kept for `info`, so that every summary counts the same model."""
        if not getattr(self, "fused", False):
            self.unfused_params = sum(x.numel() for x in self.parameters())
        for m in list(self.modules()):
            if m is not self and callable(getattr(m, "fuse", None)):
                m.fuse()
        self.fused = True
        return self

    @property
    def default_hyp(self):
        """The hyperparameter file the YAML names (`hyp:`), or None."""
        return self.yaml.get("hyp")

    def init_criterion(self, hyp, **kwargs):
        return build_criterion(self, hyp, **kwargs)

    def info(self, verbose=False, imgsz=640):
        """Log and return (layers, parameters, trainable parameters, GFLOPs at imgsz x imgsz).

        Parameters are those of the model as trained (a fused model's count from before fusing, with the folded
        count beside it), so training, val and export name the same number; the trainable ones are shown for a
        model in training mode only, where they decide what the optimizer updates."""
        n_p = sum(x.numel() for x in self.parameters())
        n_g = sum(x.numel() for x in self.parameters() if x.requires_grad)
        if verbose:
            LOGGER.info(f"{'':>3}{'from':>18}{'n':>3}{'params':>10}  {'module':<20}")
            for m in self.model:
                n = len(m) if isinstance(m, nn.Sequential) else 1
                LOGGER.info(f"{m.i:>3}{str(m.f):>18}{n:>3}{m.np:10.0f}  {m.type:<20}")
        gflops = self._gflops(imgsz)
        if getattr(self, "fused", False):
            counts = f"{self.unfused_params} parameters ({n_p} after fusing)"
        else:
            counts = f"{n_p} parameters" + (f" ({n_g} trainable)" if self.training else "")
        name = type(self).__name__ + (" (fused)" if getattr(self, "fused", False) else "")
        LOGGER.info(f"{name}: {len(self.model)} layers, {counts}, {gflops:.3g} GFLOPs at {imgsz} px")
        return len(self.model), getattr(self, "unfused_params", n_p), n_g, gflops

    @torch.no_grad()
    def _gflops(self, imgsz):
        """FLOPs of one image at imgsz x imgsz, counted at the largest stride: convolution cost grows with the pixels,
        a classifier's final linear layer (after global pooling) does not. Counted as torch's FlopCounterMode counts
        them, 2 per multiply-add of every convolution and linear layer, with forward hooks: FlopCounterMode imports
        torch._dynamo, 1.4 s of a 6 s val.py run on a 2-core CPU. Attention's products of activations (q @ k) are
        not counted, nor by thop, which the official repositories count with."""
        s = max(int(self.stride.max()), 32)
        p = next(self.parameters())
        x = torch.zeros(1, self.yaml.get("ch", 3), s, s, device=p.device, dtype=p.dtype)
        flops, fixed = [], []

        def count(m, inputs, out):
            # weight[0]: the multiply-adds per output element (per input element for a transposed convolution); a
            # linear layer on pooled features (B, C) costs the same at any size, one on tokens grows with the pixels
            n = inputs[0].numel() if isinstance(m, nn.ConvTranspose2d) else out.numel()
            pooled = isinstance(m, nn.Linear) and inputs[0].dim() == 2
            (fixed if pooled else flops).append(2 * n * m.weight[0].numel())

        layers = (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)
        hooks = [m.register_forward_hook(count) for m in self.modules() if isinstance(m, layers)]
        training = self.training
        self.eval()
        try:
            self(x)
        finally:
            self.train(training)
            for h in hooks:
                h.remove()
        return (sum(flops) * (imgsz / s) ** 2 + sum(fixed)) / 1e9


class DetectionModel(BaseModel):
    """YOLOv5/v7/v8 detector. `cfg`: a YAML name under models/ (e.g. 'yolov8s.yaml'), a path, or a dict."""

    def __init__(self, cfg="yolov5n.yaml", ch=3, nc=None, anchors=None, verbose=False):
        super().__init__()
        self.yaml = yaml_model_load(cfg)
        ch = self.yaml["ch"] = self.yaml.get("ch", ch)
        if nc is not None:
            self.yaml["nc"] = nc
        if anchors is not None:
            self.yaml["anchors"] = anchors
        check_head(self.yaml, BOX_TASKS)
        _check_budget(cfg, self.yaml, ch)
        self.model, self.save = parse_model(self.yaml, ch)
        self.eval_idle = eval_idle_layers(self.model)
        self.names = {i: str(i) for i in range(self.yaml["nc"])}
        self._init_head(ch)
        if verbose:
            self.info(verbose=True)

    @property
    def nc(self):
        return self.model[-1].nc

    @property
    def stride(self):
        return self.model[-1].stride

    @property
    def output_layout(self):
        """The head's declaration of its eval output (`utils.ops.OutputLayout`), for NMS and the task code."""
        return self.model[-1].output_layout

    @torch.no_grad()
    def _init_head(self, ch, s=256):
        """Strides from a dummy forward (in eval mode, so BatchNorm statistics stay untouched), then anchors in
        grid units and the prior biases."""
        head = self.model[-1]
        training = self.training
        self.eval()
        try:
            feats = self._forward_once(torch.zeros(1, ch, s, s), head=False)
        except RuntimeError as e:  # layers built one by one whose shapes do not meet (a Concat of other sizes)
            raise BadModelYaml(f"{self.yaml.get('yaml_file', '<dict>')}: its layers do not fit together "
                               f"({' '.join(str(e).split())[:200]})") from None
        self.train(training)
        # a head may read more maps than it has levels (IAuxDetect: then its auxiliary maps, of the same sizes)
        head.stride.copy_(torch.tensor([s / f.shape[-2] for f in feats[: head.nl]]))
        if head.anchor_based:
            area = head.anchors.prod(-1).mean(-1)
            if (area[-1] - area[0]).sign() * (head.stride[-1] - head.stride[0]).sign() < 0:
                LOGGER.info("reversing anchor order to match the stride order")
                head.anchors.copy_(head.anchors.flip(0))
            head.anchors /= head.stride.view(-1, 1, 1)
        head.bias_init()


class SegmentationModel(DetectionModel):
    """YOLOv5/v8 instance segmentation: a DetectionModel whose YAML ends in a Segment head."""

    def __init__(self, cfg="yolov5n-seg.yaml", ch=3, nc=None, anchors=None, verbose=False):
        super().__init__(cfg, ch, nc, anchors, verbose)


class PoseModel(DetectionModel):
    """YOLOv8 pose: a DetectionModel whose YAML ends in a Pose head; `kpt_shape` (K, 2 or 3) as the dataset YAML
    gives it replaces the model YAML's."""

    def __init__(self, cfg="yolov8n-pose.yaml", ch=3, nc=None, anchors=None, verbose=False, kpt_shape=None):
        if kpt_shape is not None:
            cfg = {**yaml_model_load(cfg), "kpt_shape": list(kpt_shape)}
        super().__init__(cfg, ch, nc, anchors, verbose)

    @property
    def kpt_shape(self):
        return self.model[-1].kpt_shape


class OBBModel(DetectionModel):
    """YOLOv8/YOLO11 oriented boxes: a DetectionModel whose YAML ends in an OBB head (Ultralytics' class name, which
    its pickles hold)."""

    def __init__(self, cfg="yolov8n-obb.yaml", ch=3, nc=None, anchors=None, verbose=False):
        super().__init__(cfg, ch, nc, anchors, verbose)


class ClassificationModel(BaseModel):
    """YOLOv5/v8 classifier: a backbone followed by Classify; eval output is softmax probabilities."""

    def __init__(self, cfg="yolov8n-cls.yaml", ch=3, nc=None, verbose=False):
        super().__init__()
        self.yaml = yaml_model_load(cfg)
        ch = self.yaml["ch"] = self.yaml.get("ch", ch)
        if nc is not None:
            self.yaml["nc"] = nc
        check_head(self.yaml, CLASSIFY_TASKS)
        _check_budget(cfg, self.yaml, ch)
        self.model, self.save = parse_model(self.yaml, ch)
        self.names = {i: str(i) for i in range(self.yaml["nc"])}
        self.register_buffer("stride", torch.ones(1), persistent=False)
        if verbose:
            self.info(verbose=True)

    @property
    def nc(self):
        return self.model[-1].linear.out_features

    @classmethod
    def from_detection_model(cls, model, nc=1000, cutoff=10):
        """Classifier from a detector's first `cutoff` layers, the last of them replaced by Classify (as the
        official YOLOv5 classifiers: cutoff 10 keeps layers 0-8 and puts Classify where SPPF was)."""
        det = model.yaml
        rows = (det["backbone"] + det["head"])[: cutoff - 1]
        if any(r[0] != -1 and not (isinstance(r[0], int) and r[0] < cutoff - 1) for r in rows):
            raise ValueError(f"layers 0..{cutoff - 2} must only read earlier layers to be cut at {cutoff}")
        keep = ("depth_multiple", "width_multiple", "scales", "scale", "ch")
        d = {k: det[k] for k in keep if k in det}
        d.update(nc=nc, backbone=deepcopy(rows), head=[[-1, 1, "Classify", ["nc"]]], hyp="hyp.cls.yaml")
        new = cls(d)
        prefixes = tuple(f"model.{i}." for i in range(cutoff - 1))
        state = {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}
        missing, unexpected = new.load_state_dict(state, strict=False)
        assert not unexpected and all(k.startswith(f"model.{cutoff - 1}.") for k in missing)
        return new


Model = DetectionModel  # the class name in pickles of old YOLOv5 and of YOLOv7
