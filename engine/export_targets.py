"""The exports that are built by another runtime's tools: an OpenVINO IR folder (fp32, or INT8 by NNCF's
post-training quantisation) and a TensorRT engine (fp16, optionally INT8), built from the ONNX graph export.py
writes, which is checked first on any machine (opset, dynamic batch, no NMS inside: NMS stays ours).

Both carry the same JSON metadata as the ONNX and TorchScript files (models/backend.export_metadata): an IR in its
rt_info (models/runtimes.METADATA_PATH), an engine in a header before TensorRT's bytes (models/runtimes.py).
"""

import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from models.runtimes import METADATA_PATH, engine_file_bytes
from utils.errors import BadOption
from utils.log import LOGGER


def openvino_folder(weights, int8):
    """Where --include openvino writes: `<stem>_openvino_model/` (`<stem>_int8_openvino_model/` with --int8) beside
    the weights, holding `<stem>.xml` and `<stem>.bin` (the names Ultralytics gives its exports)."""
    w = Path(weights)
    return w.with_name(f"{w.stem}{'_int8' if int8 else ''}_openvino_model")


def _float_scope(wrapper):
    """The node-name patterns INT8 leaves in float: the head's own arithmetic (box decoding, sigmoid, the DFL: its
    softmax and its convolution, whose weights 0..15 int8 would round by up to 0.06 of a cell), and the first
    convolution, which takes the image. The converter names each node after the module that made it
    (`__module.model.model.22/aten::mul/...`, `...22.dfl.conv/...`); the head's other convolutions are its children
    (`...22.cv2.0...`) and are quantised. Quantised too, the first convolution cost Ultralytics' yolov5n 0.008
    mAP50-95 on COCO128 and 0.012 on 128 images it did not calibrate on (a static IR: fp32 0.357 / 0.341); left in
    float, 0.006 and 0.003, at no measurable speed (an INT8 convolution of 3 input channels runs no faster on this
    CPU): docs/deploy.md."""
    first = next(name for name, m in wrapper.named_modules() if isinstance(m, torch.nn.Conv2d))
    prefix = re.escape(f"__module.model.model.{len(wrapper.model.model) - 1}")
    return [f"{prefix}/.*", rf"{prefix}\.dfl[./].*", rf"__module\.{re.escape(first)}/.*"]


def calibration_batches(calib, batch):
    """The prepared images (each (1, 3, h, w)) in batches of `batch`, the input a static IR takes (it refuses any
    other batch); the last batch filled from the first images, so every image is seen."""
    if batch == 1:
        return calib
    cycle = calib + [calib[i % len(calib)] for i in range(-len(calib) % batch)]
    return [np.concatenate(cycle[i:i + batch]) for i in range(0, len(calib), batch)]


def _quantize(ov_model, wrapper, calib, batch):
    try:
        import nncf
    except ImportError:
        raise BadOption("--int8 with openvino needs nncf: pip install nncf (or pip install -e '.[openvino]')") from None
    nncf.set_log_level(logging.WARNING)  # not a line per operator it leaves in fp32
    scope = nncf.IgnoredScope(patterns=_float_scope(wrapper), validate=False)
    calib = calibration_batches(calib, batch)
    return nncf.quantize(ov_model, nncf.Dataset(calib), subset_size=len(calib),
                         preset=nncf.QuantizationPreset.MIXED, ignored_scope=scope)


@contextlib.contextmanager
def _no_telemetry():
    """Inside the block OpenVINO's converter sends no usage report. It reports each conversion to Google Analytics,
    from a process it forks, unless a consent file in the user's home says no or it believes it runs in CI (its
    `disable_in_ci`, read from `CI`): that is the one switch that leaves the home alone. An export sends nothing
    (docs/safety.md), and that fork from torch's threaded process aborted the test suite ('Fatal Python error:
    Aborted' in openvino_telemetry's send)."""
    before = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["CI"]
        else:
            os.environ["CI"] = before


def export_openvino(wrapper, im, folder, meta, calib=None):
    """Write the IR of `wrapper` (the exported model, outputs flat) into `folder`: any batch and image size where
    the metadata `meta` says it is `dynamic`, else im's shape; INT8 where `calib` (prepared images,
    engine/calibration.py) is given. The folder is written beside and then renamed, so a failed export leaves the
    last one whole."""
    try:
        import openvino as ov
    except ImportError:
        raise BadOption("--include openvino needs openvino: pip install openvino (or pip install -e '.[openvino]')"
                        ) from None
    shape = [-1, 3, -1, -1] if meta["dynamic"] else list(im.shape)
    with _no_telemetry():
        ov_model = ov.convert_model(wrapper, example_input=im, input=[ov.PartialShape(shape)])
    ov_model.inputs[0].get_tensor().set_names({"images"})
    if calib is not None:
        ov_model = _quantize(ov_model, wrapper, calib, 1 if meta["dynamic"] else im.shape[0])
    ov_model.set_rt_info(json.dumps(meta), METADATA_PATH)
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    stem = folder.name.removesuffix("_openvino_model").removesuffix("_int8")
    ov.save_model(ov_model, str(tmp / f"{stem}.xml"), compress_to_fp16=False)  # fp32 weights: the .pt's boxes
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def check_engine_onnx(model, opset):
    """What TensorRT is given, checked on any machine: the opset asked for, a batch dimension left free (the
    engine's optimisation profile spans batches), and no NonMaxSuppression node (NMS is ours, on the outputs)."""
    opsets = {o.domain: o.version for o in model.opset_import}
    problems = []
    if opsets.get("", opsets.get("ai.onnx")) != opset:
        problems.append(f"opset {opsets} is not {opset}")
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    if not batch.dim_param:
        problems.append("its batch dimension is fixed")
    if any(n.op_type == "NonMaxSuppression" for n in model.graph.node):
        problems.append("it holds NMS")
    if problems:  # the exporter made it: a bug, not the user's
        raise RuntimeError(f"the ONNX graph for TensorRT is not what it should be: {'; '.join(problems)}")


def tensorrt_missing():
    """What building an engine here lacks ('' when nothing)."""
    missing = []
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        missing.append("the tensorrt package (pip install tensorrt)")
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    return " and ".join(missing)


def build_engine(onnx_file, f, meta, imgsz, max_batch, calib=None):
    """A TensorRT engine from `onnx_file` (fp16 where the GPU has it; INT8 calibrated on `calib`) for batches of 1 to
    `max_batch` images of up to `imgsz` (h, w), written to `f` after the metadata header."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_file).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT cannot parse {onnx_file}: {errors}")
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    h, w = imgsz
    profile.set_shape("images", (1, 3, 32, 32), (1, 3, h, w), (max_batch, 3, h, w))
    config.add_optimization_profile(profile)
    if builder.platform_has_fast_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if calib is not None:
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = _calibrator(trt, calib, f.with_suffix(".cache"))
        config.set_calibration_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError(f"TensorRT could not build an engine from {onnx_file} (its log above says why)")
    f.write_bytes(engine_file_bytes(meta, engine))
    LOGGER.info(f"engine: fp16 {builder.platform_has_fast_fp16}, int8 {calib is not None}, batch 1..{max_batch}")


def _calibrator(trt, calib, cache):
    """TensorRT's entropy calibrator fed the prepared images one at a time, on the GPU."""

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self):
            super().__init__()
            self.images, self.held = iter(calib), None

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            im = next(self.images, None)
            if im is None:
                return None
            self.held = torch.from_numpy(np.ascontiguousarray(im)).cuda()  # alive until the next call
            return [int(self.held.data_ptr())]

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            cache.write_bytes(bytes(data))

    return Calibrator()
