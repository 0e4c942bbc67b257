"""One way to run a model file, whatever its format: our/official `.pt`, an exported `.onnx` or `.torchscript`, an
OpenVINO folder (`*_openvino_model/` or its `.xml`) or a TensorRT `.engine` (models/runtimes.py).

The predictors and validators call `InferenceBackend(weights, device)(im)` and get back the same nested tensors that
`model.eval()` gives, so NMS and mask assembly never ask where the model came from. Exported files carry what the
PyTorch model would have told (stride, names, task, nc, image size, output nesting) in their metadata
(`export_metadata`), written by engine/exporter.py.
"""

import dataclasses
import io
import json
import re
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from models.checkpoints import load_model, run_record
from models.graphs import onnx_dry_run, read_onnx
from models.runtimes import OpenVINORunner, TensorRTRunner, read_engine_file
from models.untrusted import UnsafeTorchScript, check_torchscript
from utils.budget import MAX_CLASSES, MAX_EXPORT_BATCH, MAX_EXPORT_INPUT, MAX_EXPORT_SIDE
from utils.cli import WEIGHTS_FORMATS as FORMATS
from utils.dist import is_main_process
from utils.dry_run import DryRunError, dry_run, inference_seconds, wall_clock_guard
from utils.errors import BadFile, BadOption
from utils.log import LOGGER
from utils.ops import OutputLayout
from utils.tasks import TASKS
from utils.text import has_controls
from utils.torch_utils import memory_format, to_float32

METADATA_KEY = "yolo"  # ONNX metadata_props key / TorchScript extra-file name holding the JSON metadata


def model_task(model):
    """The task a model serves, as its head declares it (what its exports record)."""
    return model.model[-1].task


def flatten_outputs(out):
    """Nested tuples/lists of tensors -> (flat tuple of tensors, structure with leaf indices), e.g.
    (y, [x0, x1]) -> ((y, x0, x1), [0, [1, 2]]). The structure is JSON, so exported files can store it."""
    flat = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            flat.append(o)
            return len(flat) - 1
        return [walk(v) for v in o]

    structure = walk(out)
    return tuple(flat), structure


def unflatten_outputs(flat, structure):
    """Inverse of flatten_outputs (lists come back as tuples, as the heads return them)."""
    if isinstance(structure, int):
        return flat[structure]
    return tuple(unflatten_outputs(flat, s) for s in structure)


def export_metadata(model, imgsz, batch, half, structure, data=None):
    """What every format exported from `model` carries (each format adds whether it is `dynamic`); `structure`: the
    nesting of ExportWrapper's outputs (flatten_outputs); `data`: the dataset of the run the weights come from
    (engine/inherit.py), where known. Exports made before ExportWrapper kept only what inference reads declare the
    whole eval output (prototypes at their path in it): they still run."""
    head = model.model[-1]
    return {
        "task": model_task(model),
        "stride": int(max(model.stride)),
        "names": {int(k): str(v) for k, v in model.names.items()},
        "nc": int(model.nc),
        "layout": dataclasses.asdict(export_layout(head.output_layout)) if hasattr(head, "output_layout") else None,
        "imgsz": list(imgsz),
        "batch": int(batch),
        "half": bool(half),
        "outputs": structure,
        **({"data": str(data)} if data else {}),
    }


_METADATA_TYPES = {"task": str, "stride": int, "names": dict, "nc": int, "imgsz": list, "batch": int, "dynamic": bool,
                   "half": bool, "outputs": (int, list)}


def _structure_ok(s, n, depth=0):
    """An output nesting of leaf indices below `n`, nested at most 8 deep (the heads nest 3)."""
    if isinstance(s, int) and not isinstance(s, bool):
        return 0 <= s < n
    return depth < 8 and isinstance(s, list) and bool(s) and all(_structure_ok(x, n, depth + 1) for x in s)


def _metadata_values(meta):
    """{key: whether its value is one an export of this project has} for the values the backend allocates by."""
    imgsz = meta["imgsz"]
    return {"task": meta["task"] in TASKS, "nc": 1 <= meta["nc"] <= MAX_CLASSES, "stride": 1 <= meta["stride"] <= 512,
            "batch": 1 <= meta["batch"] <= MAX_EXPORT_BATCH,
            "imgsz": len(imgsz) == 2 and all(type(v) is int and 1 <= v <= MAX_EXPORT_SIDE for v in imgsz)
            and 3 * meta["batch"] * imgsz[0] * imgsz[1] <= MAX_EXPORT_INPUT,
            "outputs": _structure_ok(meta["outputs"], 64)}


def _parse_metadata(text, weights):
    """The JSON an exported file carries (export_metadata), checked for the keys and types the backend reads."""
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BadFile(f"--weights {weights}: its '{METADATA_KEY}' metadata is not JSON ({e})") from None
    bad = [k for k, t in _METADATA_TYPES.items() if not isinstance(meta, dict) or not isinstance(meta.get(k), t)]
    bad = bad or [k for k, ok in _metadata_values(meta).items() if not ok]
    names = meta.get("names") if not bad else {}
    if not all(k.isdecimal() and isinstance(v, str) and not has_controls(v) for k, v in names.items()):
        bad = ["names"]
    elif not bad and sorted(map(int, names)) != list(range(meta["nc"])):
        bad = ["names"]  # one name per class 0..nc-1, as a checkpoint's: a predicted class is looked up by its index
    if not bad and meta.get("layout") is not None:
        try:
            meta["layout"] = dataclasses.asdict(OutputLayout(**meta["layout"]))
        except TypeError:
            bad = ["layout"]
    if bad:
        raise BadFile(f"--weights {weights}: its '{METADATA_KEY}' metadata lacks or mistypes {bad}: export it again "
                      "with export.py")
    return meta


def _onnx_reason(e):
    """onnxruntime's reason for not loading a model, without the prefix that repeats the path and the C++ source
    location some messages start with ('/onnxruntime_src/...h:46 void f(...) Opset 999 is ...')."""
    why = " ".join(str(e).split()).partition(" failed:")[2] or str(e)
    return re.sub(r"^\S+:\d+ .*?\) (?=[A-Z])", "", why)[:200].rstrip()


def _weights_format(weights):
    if Path(weights).is_dir():  # export.py's OpenVINO folder; models/runtimes.openvino_xml checks what it holds
        return "openvino"
    suffix = Path(weights).suffix.lower()
    if suffix not in FORMATS:
        raise BadFile(f"--weights {weights}: unsupported format '{suffix}', expected one of {sorted(FORMATS)}")
    return FORMATS[suffix]


class InferenceBackend(nn.Module):
    """Load `weights` (.pt, .onnx, .torchscript) on `device`; call with a float image batch (B, 3, H, W).

    A module, so the validators take it where they take a model (eval(), half(), its device from its parameters).
    Exported files keep the precision they were exported with: half() and float() change only a `.pt` model.
    `bf16` True: a `.pt` model runs under bfloat16 autocast (CPU or CUDA) and returns fp32 outputs, an OpenVINO
    model in OpenVINO's bf16 precision; False: both in fp32; None: a `.pt` in fp32, an OpenVINO model in the
    precision OpenVINO chooses for the CPU (models/runtimes.OpenVINORunner.compile). A `.pt` model takes
    utils.torch_utils.memory_format (channels_last on CPU: fused yolov8n at 640 px 75 -> 58 ms, yolov5n 50 -> 39 ms
    on a 2-core AVX512 CPU, the same results to float rounding).

    Attributes every format sets: format, task, stride, names, nc, output_layout (the head's declaration of
    its eval output, None for classifiers), dynamic (any batch and image size is
    accepted), imgsz (the exported input size, for static exports), fp16 (inputs are cast to half), device, run
    ({'imgsz', 'data'} the weights say of the run that made them, read with the weights: engine/inherit.py).
    `model` is the nn.Module for .pt files (None otherwise); `metadata` an export's metadata (None for .pt files).
    """

    def __init__(self, weights, device=torch.device("cpu"), half=False, fuse=True, bf16=None):
        super().__init__()
        self.weights, self.device = str(weights), torch.device(device)
        self.format = _weights_format(weights)
        self.model = self.metadata = None
        self.limits = {}  # input shape -> wall-clock seconds a run may take, set by its dry run (exported files)
        self.bf16 = bf16 if self.format == "openvino" else bool(bf16) and self.format == "pytorch"
        if self.format == "pytorch":
            self._load_pytorch(fuse, half)
        else:
            if self.format != "openvino" and not Path(weights).is_file():
                raise BadFile(f"--weights {weights}: file not found")
            # an empty parameter on the device: `next(model.parameters()).device` works for an ONNX session too
            self.device_anchor = nn.Parameter(torch.empty(0, device=self.device), requires_grad=False)
            load = {"onnx": self._load_onnx, "torchscript": self._load_torchscript, "openvino": self._load_openvino,
                    "engine": self._load_engine}[self.format]
            self._set_metadata(load())
        self.eval()  # for inference only; also what a validator restores when it is done

    # ---------------------------------------------------------------- loading
    def _load_pytorch(self, fuse, half):
        self.model, self.run = load_model(self.weights, device=self.device, fuse=fuse)
        self.fp16 = half and self.device.type == "cuda" and not self.bf16
        if self.fp16:
            self.model.half()
        self.model.to(memory_format=memory_format(self.device))
        self.task, self.names, self.nc = model_task(self.model), dict(self.model.names), self.model.nc
        self.stride = int(max(self.model.stride))
        self.output_layout = getattr(self.model, "output_layout", None)
        self.dynamic, self.imgsz, self.batch = True, None, None

    def _set_metadata(self, meta):
        self.metadata = meta
        self.run = run_record(meta.get("imgsz"), meta.get("data"), self.weights)
        self.task, self.stride, self.nc = meta["task"], meta["stride"], meta["nc"]
        if self.task != "classify" and not meta.get("layout"):
            raise BadFile(f"--weights {self.weights} has no output layout in its metadata: export it again")
        self.output_layout = OutputLayout(**meta["layout"]) if meta.get("layout") else None
        self.names = {int(k): v for k, v in meta["names"].items()}
        self.dynamic, self.imgsz, self.batch = meta["dynamic"], tuple(meta["imgsz"]), meta["batch"]
        self.fp16, self.structure = meta["half"], meta["outputs"]
        if self.fp16 and self.device.type != "cuda":
            raise BadOption(f"--weights {self.weights} was exported with --half, which runs on CUDA only")

    def _load_onnx(self):
        """The graph is read and judged first (models/graphs.py: what it holds, and a dry run at its exported size),
        then onnxruntime loads the same bytes."""
        try:
            import onnxruntime
        except ImportError as e:
            raise BadOption(f"--weights {self.weights}: running ONNX models needs onnxruntime: pip install "
                            "onnxruntime (onnxruntime-gpu for CUDA)") from e
        data = Path(self.weights).read_bytes()
        self.held = len(data)
        self.graph = read_onnx(data, f"--weights {self.weights}")
        meta = {p.key: p.value for p in self.graph.metadata_props}
        if METADATA_KEY not in meta:
            raise BadFile(f"--weights {self.weights} has no '{METADATA_KEY}' metadata: export it with export.py")
        meta = _parse_metadata(meta[METADATA_KEY], self.weights)
        self._dry_run((meta["batch"], 3, *meta["imgsz"]), meta)
        providers = ["CPUExecutionProvider"]
        if self.device.type == "cuda" and "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": self.device.index or 0}))
        # onnxruntime's errors share no base class but Exception: these are the ones it raises for a file it cannot
        # read as a model (not protobuf, truncated, no graph, an invalid graph, an opset or IR version it lacks)
        ort = onnxruntime.capi.onnxruntime_pybind11_state
        try:
            self.session = onnxruntime.InferenceSession(data, providers=providers)
        except (ort.InvalidProtobuf, ort.InvalidArgument, ort.InvalidGraph, ort.Fail, ort.NotImplemented) as e:
            raise BadFile(f"--weights {self.weights}: not a loadable ONNX file ({_onnx_reason(e)})") from None
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [o.name for o in self.session.get_outputs()]
        return meta

    def _load_torchscript(self):
        """TorchScript is code: the archive is checked (models/untrusted.check_torchscript) and then loaded from the
        same bytes, so nothing torch compiles or runs was not checked."""
        data = Path(self.weights).read_bytes()
        self.held = len(data)
        check_torchscript(data, f"--weights {self.weights}")
        extra = {METADATA_KEY: ""}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", category=FutureWarning)  # torch.jit.load's deprecation notice
                self.jit = torch.jit.load(io.BytesIO(data), map_location=self.device, _extra_files=extra)
        except RuntimeError as e:  # code that passed the check but does not compile, a damaged archive
            why = " ".join(str(e).split())[:200]
            raise BadFile(f"--weights {self.weights}: not a loadable TorchScript file ({why})") from None
        self.jit.eval()
        if not extra[METADATA_KEY]:
            raise BadFile(f"--weights {self.weights} has no '{METADATA_KEY}' metadata: export it with export.py")
        meta = _parse_metadata(extra[METADATA_KEY], self.weights)
        self._dry_run((meta["batch"], 3, *meta["imgsz"]), meta)
        return meta

    def _load_openvino(self):
        """An IR folder: its metadata and its outputs' shapes at the exported input size (shape inference, nothing
        runs) are checked before OpenVINO compiles it."""
        self.runner = OpenVINORunner(self.weights)
        meta = self._runner_metadata()
        self.runner.compile(self.bf16)
        return meta

    def _load_engine(self):
        self.runner = TensorRTRunner(self.weights, self.device)
        return self._runner_metadata()

    def _runner_metadata(self):
        """The metadata of an OpenVINO or TensorRT runner, checked against the outputs it declares."""
        if not self.runner.metadata_text:
            raise BadFile(f"--weights {self.weights} has no '{METADATA_KEY}' metadata: export it with export.py")
        meta = _parse_metadata(self.runner.metadata_text, self.weights)
        shape = (meta["batch"], 3, *meta["imgsz"])
        flat = [torch.empty(s, device="meta") for s in self.runner.output_shapes(shape)]
        why = _outputs_problem(flat, meta, shape[0])
        if why:
            raise BadFile(f"--weights {self.weights}: {why}, unlike its metadata: export it again with export.py")
        return meta

    def _dry_run(self, shape, meta=None):
        """Before the graph first runs on an input of `shape`: a dry run (utils/dry_run.py) within the budget, whose
        outputs must be what the metadata declares; its work sets the wall-clock limit of a run at that size.
        UnsafeOnnx / UnsafeTorchScript (one line) otherwise."""
        meta = meta or {"outputs": self.structure, "layout": dataclasses.asdict(self.output_layout)
                        if self.output_layout else None, "nc": self.nc}
        label = f"--weights {self.weights}"
        if self.format == "onnx":
            probe, flat = onnx_dry_run(self.graph, shape, label, self.held)
        else:
            try:
                probe, flat = dry_run(self.jit, shape, held=self.held)
            except DryRunError as e:
                raise UnsafeTorchScript(f"refusing {label}: run on a {'x'.join(map(str, shape))} input, {e}") from None
            except RuntimeError as e:  # code that passed the static check but does not run
                raise BadFile(f"{label}: its graph does not run ({' '.join(str(e).split())[:200]})") from None
        flat = flat if isinstance(flat, (tuple, list)) else (flat,)
        why = _outputs_problem(flat, meta, shape[0])
        if why:
            raise BadFile(f"{label}: {why}, unlike its metadata: export it again with export.py")
        self.limits[tuple(shape)] = inference_seconds(probe.work)

    # ---------------------------------------------------------------- inference
    def forward(self, im):
        """Outputs for im (B, 3, H, W) float on self.device, nested as model.eval() nests them."""
        if self.format == "pytorch":
            im = im.to(torch.float16 if self.fp16 else torch.float32, memory_format=memory_format(self.device))
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = self.model(im)
            return to_float32(out) if self.bf16 else out
        n = im.shape[0]
        if not self.dynamic:
            im = self._fit_static(im)
        im = im.half() if self.fp16 else im.float()
        if self.format in ("openvino", "engine"):  # each runner bounds its own runs (models/runtimes.py)
            return unflatten_outputs([y[:n] for y in self.runner(im)], self.structure)
        if tuple(im.shape) not in self.limits:
            self._dry_run(tuple(im.shape))
        seconds = self.limits[tuple(im.shape)]
        if self.format == "onnx":
            flat = self._run_onnx(im, seconds)
        else:
            with wall_clock_guard(seconds, f"--weights {self.weights}: inference"):
                flat = self.jit(im)
            flat = flat if isinstance(flat, (tuple, list)) else (flat,)  # as its dry run read it
        flat = [y[:n] for y in flat]  # drop the rows of a static batch's padding
        return unflatten_outputs(flat, self.structure)

    def _run_onnx(self, im, seconds):
        """One run, stopped by onnxruntime itself (RunOptions.terminate) past `seconds`."""
        import onnxruntime

        x = im.cpu().numpy()
        options = onnxruntime.RunOptions()
        timer = threading.Timer(seconds, lambda: setattr(options, "terminate", True))
        timer.start()
        try:
            ys = self.session.run(self.output_names, {self.input_name: x}, options)
        except Exception:  # onnxruntime's errors share no base class; a stop is one of them
            if options.terminate:
                raise BadFile(f"--weights {self.weights}: inference stopped after {seconds:.0f} s, far beyond what "
                              "its dry run counted") from None
            raise
        finally:
            timer.cancel()
        return [torch.from_numpy(np.asarray(y)).to(self.device) for y in ys]

    def _fit_static(self, im):
        """A static export takes exactly its batch and image size: pad a smaller batch with zero images."""
        if tuple(im.shape[2:]) != self.imgsz:
            raise BadOption(f"{self.weights} was exported for {self.imgsz[0]}x{self.imgsz[1]} images, got "
                             f"{im.shape[2]}x{im.shape[3]}: export with --dynamic or use --imgsz {self.imgsz[0]}")
        if im.shape[0] > self.batch:
            raise BadOption(f"{self.weights} was exported for batch {self.batch}, got {im.shape[0]}")
        if im.shape[0] < self.batch:
            pad = im.new_zeros((self.batch - im.shape[0], *im.shape[1:]))
            im = torch.cat((im, pad))
        return im


    def half(self):
        if self.model is not None:
            self.model.half()
            self.fp16 = True
        return self

    def float(self):
        if self.model is not None:
            self.model.float()
            self.fp16 = False
        return self


def _outputs_problem(flat, meta, batch):
    """Why outputs of these shapes (a dry run's, meta tensors) are not what the metadata declares, or None: the
    nesting must index them, and the prediction must have the layout's columns (NMS indexes them), the prototypes
    its mask count, a classifier's scores its class count."""
    if not _structure_ok(meta["outputs"], len(flat)):
        return f"its {len(flat)} outputs do not fit the declared nesting {meta['outputs']}"
    out = unflatten_outputs(list(flat), meta["outputs"])
    if meta.get("layout") is None:  # a classifier: (batch, nc) probabilities
        pred, proto, width = out if isinstance(out, torch.Tensor) else out[0], None, meta["nc"]
        got = tuple(pred.shape)
        return None if got == (batch, width) else f"its scores have shape {got}, not ({batch}, {width})"
    layout = OutputLayout(**meta["layout"])
    try:
        pred, proto = layout.split(out)
        rows = layout.rows(pred)
    except (IndexError, TypeError, RuntimeError):
        return "its outputs do not hold the declared prediction and prototypes"
    if pred.dim() != 3 or rows.shape[0] != batch or rows.shape[2] != layout.width:
        return f"its prediction has shape {tuple(pred.shape)}, not rows of {layout.width} columns for {batch} images"
    if layout.nm and (proto is None or proto.dim() != 4 or tuple(proto.shape[:2]) != (batch, layout.nm)):
        return f"its mask prototypes are not ({batch}, {layout.nm}, h, w)"
    return None


def export_layout(layout):
    """The layout of what an export holds: the prediction, then the prototypes at index 1 where there are some."""
    return dataclasses.replace(layout, proto=(1,) if layout.proto else ())


class ExportWrapper(nn.Module):
    """The model with only what inference reads as a flat tuple of tensors: (prediction,) or (prediction, prototypes)
    by the head's layout (`export_layout` declares it), a classifier's scores as they are. The raw per-level maps
    the eval output also holds feed only the training loss; copying them out cost 3-7 % of an OpenVINO run
    (docs/deploy.md)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.layout = getattr(model.model[-1], "output_layout", None)

    def kept(self, out):
        """What the export holds of the eval output `out`, nested (flatten_outputs gives its metadata's nesting)."""
        if self.layout is None:
            return out
        pred, proto = self.layout.split(out)
        return (pred,) if proto is None else (pred, proto)

    def forward(self, x):
        return flatten_outputs(self.kept(self.model(x)))[0]


def weights_task(weights):
    """The task a weights file or OpenVINO folder serves: an IR's from its checked metadata without compiling it (the
    script that runs it compiles it once), a TensorRT engine's from its header (no GPU needed to name it), other
    formats' as the backend loads them."""
    made = _weights_format(weights)
    if made == "openvino":
        runner = OpenVINORunner(weights)
        if runner.metadata_text:
            return _parse_metadata(runner.metadata_text, weights)["task"]
    if made == "engine":
        return _parse_metadata(read_engine_file(weights)[0], weights)["task"]
    return InferenceBackend(weights).task


def validation_model(backend, imgsz):
    """(model, largest stride, task) for a val script from its InferenceBackend: the `.pt` module itself (summary
    printed by rank 0), or the backend of an export."""
    if backend.model is not None:
        if is_main_process():
            backend.model.info(imgsz=imgsz)
        return backend.model, backend.stride, backend.task
    return backend, backend.stride, backend.task


def static_input(backend, imgsz, batch):
    """{'imgsz', 'batch'} a val script runs a static export at, {} for a `.pt` or a dynamic export (validated as the
    `.pt` is, each batch letterboxed to its own rectangle). A static export takes one size: every image is
    letterboxed square to it (as Ultralytics validates its static exports), in batches of the size it was exported
    with (a last, smaller one padded). An --imgsz given for another size is replaced, in one line, as predict does."""
    if backend.dynamic:
        return {}
    h, w = backend.imgsz
    if h != w:
        raise BadOption(f"--weights {backend.weights} takes {h}x{w} images only, and validation letterboxes them "
                        f"square: export it with --img {max(h, w)} or --dynamic")
    if imgsz != h:
        LOGGER.warning(f"{backend.weights} takes {h}x{w} images only (exported without --dynamic): validating at "
                       f"that size instead of --imgsz {imgsz}")
    if batch != backend.batch:
        LOGGER.info(f"{backend.weights} takes batches of {backend.batch} (exported without --dynamic): --batch-size "
                    f"{batch} -> {backend.batch}")
    return {"imgsz": h, "batch": backend.batch}
