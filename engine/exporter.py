"""Exporter: a checkpoint (ours or official) -> ONNX and/or TorchScript files, an OpenVINO folder (fp32, or INT8
calibrated on the run's training images) or a TensorRT engine (engine/export_targets.py), that run without this code.

The exported graph is the fused inference model (BatchNorm folded, YOLOv7 RepConv and implicit layers
re-parameterised) and returns what inference reads of `model.eval()`'s output: the prediction, and the mask
prototypes where the head has them (models/backend.ExportWrapper; not the raw per-level maps of the training loss).
That nesting, the stride, names, task and image size go into the file's metadata so models/backend.py can run it as
the `.pt` runs for inference.
"""

import dataclasses
import json
import threading
import warnings
from pathlib import Path

import torch
from torch.onnx import _constants as onnx_constants

from engine.calibration import calibration_images
from engine.eval_memory import settle_batch
from engine.export_targets import (
    build_engine,
    check_engine_onnx,
    export_openvino,
    openvino_folder,
    tensorrt_missing,
)
from engine.inherit import run_values
from engine.options import ExportOptions
from models.backend import METADATA_KEY, ExportWrapper, export_metadata, flatten_outputs, model_task
from models.checkpoints import load_model
from models.registry import use_modules
from utils import dist as du
from utils.cli import DEFAULT_OPSET, EXPORT_DYNAMIC, WEIGHTS_FORMATS
from utils.cli import EXPORT_FORMATS as FORMATS
from utils.errors import BadFile, BadOption
from utils.log import LOGGER

# The opsets the TorchScript-based exporter (torch.onnx.export(dynamo=False)) supports; torch has no public accessor
# for them. Outside ONNX_MIN_OPSET..ONNX_MAX_OPSET it fails with a traceback, and above this range it warns that the
# opset is not supported.
OPSETS = range(onnx_constants.ONNX_MIN_OPSET, onnx_constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET + 1)

ALIASES = {"tensorrt": "engine", "trt": "engine"}  # Ultralytics' other names of a format

# One export traces at a time in a process: torch's tracer and warnings.catch_warnings are process-wide, and two
# YOLO(...).export() calls in threads failed ('Tracing failed sanity checks! Graphs differed across invocations')
_TRACING = threading.Lock()


def _imgsz(imgsz, stride):
    """--img h [w] -> (h, w), each a multiple of the model's largest stride."""
    hw = tuple(imgsz) * 2 if len(imgsz) == 1 else tuple(imgsz)
    if len(hw) != 2 or any(s <= 0 or s % stride for s in hw):
        raise BadOption(f"--img {' '.join(map(str, imgsz))}: give one or two sizes, multiples of stride {stride}")
    return hw


def _forget_symbolic_shapes(model):
    """Drop the exporter's symbolic shapes of intermediate values, and give each output dim its own name.

    The TorchScript-based exporter names the height/width of every pyramid level alike (as if 8x8, 4x4 and 2x2 were
    one size); onnxruntime trusts those names, reuses one level's buffer for another and fails at run time.
    Without them onnxruntime infers the shapes itself.
    """
    del model.graph.value_info[:]
    for o in model.graph.output:
        for j, d in enumerate(o.type.tensor_type.shape.dim):
            if d.dim_param and d.dim_param != "batch":
                d.dim_param = f"{o.name}_dim{j}"


class Exporter:
    def __init__(self, opt, task_inputs=None):
        """`opt`: export.py's parsed command line (or a namespace naming some of its options), read once into
        ExportOptions. `task_inputs`: {task: engine/calibration.Inputs}, how each task's images are prepared, from
        the task records (export.py gives them: the records stand a floor above the engine); --int8 reads it."""
        self.opt = ExportOptions.from_values(opt)
        named = [ALIASES.get(f.lower(), f.lower()) for f in self.opt.include]  # format=OpenVINO, as Ultralytics
        self.opt = dataclasses.replace(self.opt, include=named)
        self.task_inputs = task_inputs or {}
        unknown = set(self.opt.include) - set(FORMATS)
        if unknown:
            raise BadOption(f"--include {' '.join(sorted(unknown))}: supported formats are {', '.join(FORMATS)}")
        if "onnx" in self.opt.include and self.opt.opset not in OPSETS:
            raise BadOption(f"--opset {self.opt.opset}: torch {torch.__version__} exports ONNX opsets "
                            f"{OPSETS.start}..{OPSETS.stop - 1}")
        if self.opt.int8 and not {"openvino", "engine"} & set(self.opt.include):
            raise BadOption("--int8 quantises the openvino and engine formats: add --include openvino or engine")
        if self.opt.half and "openvino" in self.opt.include:
            raise BadOption("--half: an OpenVINO export runs on the CPU in fp32 (--int8 makes it smaller and faster)")

    @torch.no_grad()
    def __call__(self):
        made = WEIGHTS_FORMATS.get(Path(self.opt.weights).suffix.lower(), "pytorch")
        if made != "pytorch":  # read as a checkpoint, an .onnx or .xml said only 'opcode ... unknown'
            raise BadFile(f"refusing --weights {self.opt.weights}: an export ({made}), not a checkpoint: export.py "
                          "converts the .pt it was made from (an export runs in the predict and val scripts)")
        use_modules(self.opt.modules)
        device = du.select_device(self.opt.device)
        if self.opt.half and device.type != "cuda":
            raise BadOption("--half export needs a CUDA device (--device 0)")
        return self.export(*load_model(self.opt.weights, device=device, fuse=True))

    @torch.no_grad()
    def export(self, model, run):
        """Write the formats of `model` (fused, on its device; fp16 with --half) beside --weights; `run`: what its
        checkpoint says of its training run (models/checkpoints.load_model). The CLI refuses --half on a CPU, where
        fp16 runs slowly, yet the graph traced is the same on any device (tests use that)."""
        opt = dataclasses.replace(self.opt, **run_values(self.opt, run))
        device = next(model.parameters()).device
        dynamic = self._dynamic(model, opt)
        imgsz = _imgsz(opt.imgsz if isinstance(opt.imgsz, list) else [opt.imgsz], int(max(model.stride)))
        fixed = [fmt for fmt in dict.fromkeys(opt.include) if not dynamic[fmt]]
        if "onnx" in fixed and "engine" in opt.include:  # both write <stem>.onnx; the engine's would win unsaid
            raise BadOption(f"--include onnx engine: the engine is built from a dynamic {Path(opt.weights).stem}.onnx, "
                            "which would replace the fixed ONNX asked for: export the fixed one in a run of its own")
        if fixed and imgsz[0] != imgsz[1] and model_task(model) == "classify":  # predict and val crop it square
            raise BadOption(f"--img {imgsz[0]} {imgsz[1]}: a classifier sees square crops, and {', '.join(fixed)} "
                            f"would take {imgsz[0]}x{imgsz[1]} only: export it with --img {max(imgsz)} or --dynamic")
        settle_batch(model, imgsz, opt.batch_size, device, f"--weights {opt.weights}", export=True)
        model.info(imgsz=imgsz[0])
        for p in model.parameters():
            p.requires_grad_(False)
        if opt.half:
            model.half()
        im = torch.zeros(opt.batch_size, 3, *imgsz, device=device, dtype=torch.half if opt.half else torch.float)
        wrapper = ExportWrapper(model).eval()
        flat, structure = flatten_outputs(wrapper.kept(model(im)))
        meta = export_metadata(model, imgsz, opt.batch_size, opt.half, structure, run.get("data"))
        LOGGER.info(f"Exporting {opt.weights} with input {tuple(im.shape)} and {len(flat)} outputs "
                    f"{[tuple(y.shape) for y in flat]}")
        calib = calibration_images(opt.data, self.task_inputs[meta["task"]], imgsz, opt.calib_images) \
            if opt.int8 else None
        files = []
        for fmt in dict.fromkeys(opt.include):  # each format once, in the order given
            f = Path(opt.weights).with_suffix(f".{fmt}")
            f = openvino_folder(opt.weights, opt.int8) if fmt == "openvino" else f
            with _TRACING, warnings.catch_warnings():
                # the tracer's notes on Python ints taken from shapes, the deprecation notices of both exporters
                warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
                warnings.simplefilter("ignore", category=DeprecationWarning)
                warnings.simplefilter("ignore", category=FutureWarning)  # torch.jit.trace: we chose TorchScript
                getattr(self, f"export_{fmt}")(wrapper, im, f, {**meta, "dynamic": dynamic[fmt]}, len(flat), calib)
            size = sum(p.stat().st_size for p in f.iterdir()) if f.is_dir() else f.stat().st_size
            takes = "any batch and image size" if dynamic[fmt] else f"input {tuple(im.shape)} only"
            LOGGER.info(f"{fmt}: saved {f} ({size / 1e6:.1f} MB; {takes})")
            files.append(f)
        LOGGER.info(f"Results saved to {Path(opt.weights).parent}")
        return files

    @staticmethod
    def _dynamic(model, opt):
        """{format: whether its file takes any batch and image size}: --dynamic/--no-dynamic where given, else the
        format's default (utils/cli.EXPORT_DYNAMIC), and fixed wherever the model has modules that trace only the
        example input's size."""
        fixed = sorted({type(m).__name__ for m in model.modules() if getattr(m, "dynamic_export", True) is False})
        if fixed and opt.dynamic:
            raise BadOption(f"--dynamic: {opt.weights} has {', '.join(fixed)}, whose traced graph holds only the "
                            "example input's size; export it with --no-dynamic at the size it will run")
        if fixed and opt.dynamic is None:
            LOGGER.info(f"{opt.weights} has {', '.join(fixed)}: every format takes the example input's size only")
        default = {fmt: EXPORT_DYNAMIC[fmt] and not fixed for fmt in FORMATS}
        return {fmt: default[fmt] if opt.dynamic is None else opt.dynamic for fmt in FORMATS}

    def export_openvino(self, wrapper, im, f, meta, n_out, calib):
        export_openvino(wrapper, im, f, meta, calib)

    def export_engine(self, wrapper, im, f, meta, n_out, calib):
        """The ONNX graph (dynamic batch and size, at the default opset) is written and checked here on any machine;
        the engine is built where TensorRT and a GPU are."""
        onnx_file, opset = f.with_suffix(".onnx"), self.opt.opset
        self.export_onnx(wrapper, im, onnx_file, {**meta, "dynamic": True}, n_out)
        import onnx

        check_engine_onnx(onnx.load(str(onnx_file)), opset)
        LOGGER.info(f"engine: {onnx_file} checked: opset {opset}, dynamic batch, no NMS in the graph")
        missing = tensorrt_missing()
        if missing:
            raise BadOption(f"--include engine needs {missing} here; {onnx_file} is ready to build it where they are")
        max_batch = max(self.opt.batch_size, 32)  # a validation batch fits
        build_engine(onnx_file, f, {**meta, "dynamic": True}, tuple(im.shape[2:]), max_batch, calib)

    def export_torchscript(self, wrapper, im, f, meta, n_out, calib=None):
        ts = torch.jit.trace(wrapper, im, strict=False)
        ts.save(str(f), _extra_files={METADATA_KEY: json.dumps(meta)})

    def export_onnx(self, wrapper, im, f, meta, n_out, calib=None):
        try:
            import onnx
        except ImportError as e:
            raise BadOption('--include onnx needs the onnx package: pip install -e ".[export]" in this clone (onnx, '
                            'and onnxruntime to run the file)') from e
        outputs = [f"output{i}" for i in range(n_out)]
        dynamic = None
        if meta["dynamic"]:  # batch, height and width of the input; every output follows the batch
            dynamic = {"images": {0: "batch", 2: "height", 3: "width"}, **{o: {0: "batch"} for o in outputs}}
        try:  # dynamo=False: the TorchScript-based exporter needs only torch and onnx (the dynamo one also onnxscript)
            torch.onnx.export(wrapper, im, str(f), dynamo=False, opset_version=self.opt.opset,
                              do_constant_folding=True, input_names=["images"], output_names=outputs,
                              dynamic_axes=dynamic)
        except torch.onnx.OnnxExporterError as e:  # an operator the chosen opset cannot express (upsampling at 7, 8)
            if self.opt.opset == DEFAULT_OPSET:
                raise  # at the default every model exports: a failure there is a bug
            why = str(e).partition(". Please")[0]  # without the invitation to file a request with PyTorch
            raise BadOption(f"--opset {self.opt.opset}: {why}; a later opset may have it (default {DEFAULT_OPSET})"
                            ) from None
        model = onnx.load(str(f))
        if meta["dynamic"]:
            _forget_symbolic_shapes(model)
        onnx.checker.check_model(model)
        if self.opt.simplify:
            model = self._simplify(model)
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, json.dumps(meta)
        onnx.save(model, str(f))

    @staticmethod
    def _simplify(model):
        try:
            import onnxslim
        except ImportError:
            LOGGER.warning("--simplify needs onnxslim (pip install onnxslim): saving the graph unsimplified")
            return model
        return onnxslim.slim(model)
