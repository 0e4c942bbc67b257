"""The runtimes of exported folders and engines: an OpenVINO IR folder (`*_openvino_model/`, or its `.xml`) and a
TensorRT `.engine`. models/backend.InferenceBackend chooses one by what the path is and calls it with a float batch;
each returns the flat outputs in the order the exporter flattened them (models/backend.flatten_outputs).

Neither holds code: an IR is an XML graph of OpenVINO's operators and a `.bin` of weights (no extension library is
loaded, so no custom operator runs), and a TensorRT engine is deserialised by TensorRT's runtime with no plugin
library loaded. What each declares is checked before it runs: its metadata (models/backend._parse_metadata), and
its outputs' shapes at the exported input size from OpenVINO's shape inference (no inference) or TensorRT's
bindings. A run that takes longer than the budget allows for its input is stopped (OpenVINO: the request is
cancelled).
"""

import json
import struct
from pathlib import Path

import numpy as np
import torch

from utils.budget import MAX_EXPORT_INPUT, WORK_PER_INPUT
from utils.dry_run import inference_seconds
from utils.errors import BadFile, BadOption
from utils.log import LOGGER

METADATA_PATH = ["framework", "yolo"]  # where an IR's rt_info holds the export's JSON metadata
ENGINE_MAGIC = b"YOLOTRT1"  # an engine file: magic, metadata length (uint32 little-endian), metadata JSON, engine


def openvino_xml(path):
    """The IR's .xml: `path` itself, or the one .xml in the folder `path`. BadFile otherwise."""
    p = Path(path)
    if p.is_dir():
        xmls = sorted(p.glob("*.xml"))
        if len(xmls) != 1:
            raise BadFile(f"--weights {path}: an OpenVINO folder holds one .xml model (export.py --include openvino), "
                          f"found {len(xmls)}")
        p = xmls[0]
    if not p.is_file() or not p.with_suffix(".bin").is_file():
        raise BadFile(f"--weights {path}: OpenVINO model {p.name} and its {p.with_suffix('.bin').name} not found")
    # OpenVINO reads any format it knows by its content, whatever the name: an ONNX file named .xml would run past
    # the checks of models/graphs.py (external data included), as would TensorFlow's and PaddlePaddle's files
    with open(p, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"<"):
        raise BadFile(f"--weights {path}: {p.name} is not an OpenVINO IR (an XML file); run an .onnx file by its "
                      "own name")
    return p


def _import_openvino(weights):
    try:
        import openvino
    except ImportError:
        raise BadOption(f"--weights {weights}: running OpenVINO models needs openvino: pip install openvino "
                        "(or pip install -e '.[openvino]')") from None
    return openvino


class OpenVINORunner:
    """An IR on the CPU (OpenVINO's latency hint: one request at a time uses every core), in the arithmetic
    `compile` is given."""

    def __init__(self, weights):
        ov = _import_openvino(weights)
        self.weights, self.core = weights, ov.Core()
        xml = openvino_xml(weights)
        try:
            self.model = self.core.read_model(str(xml))
        except RuntimeError as e:
            raise BadFile(f"--weights {weights}: not a loadable OpenVINO model ({' '.join(str(e).split())[:200]})"
                          ) from None
        rt = self.model.get_rt_info()
        self.metadata_text = (self.model.get_rt_info(METADATA_PATH).astype(str)
                              if "framework" in rt and self.model.has_rt_info(METADATA_PATH) else None)

    def output_shapes(self, shape):
        """The outputs' shapes at an input of `shape`, from OpenVINO's shape inference on a copy (nothing runs)."""
        ov = _import_openvino(self.weights)
        probe = self.model.clone()
        try:
            probe.reshape({probe.inputs[0]: ov.PartialShape(list(shape))})
        except RuntimeError as e:
            raise BadFile(f"--weights {self.weights}: its graph does not take a {'x'.join(map(str, shape))} input "
                          f"({' '.join(str(e).split())[:160]})") from None
        return [tuple(o.get_partial_shape().to_shape()) for o in probe.outputs]

    def compile(self, bf16=None):
        """`bf16` None (predict --amp auto, and val): the arithmetic OpenVINO chooses for this CPU, as Ultralytics'
        runtime leaves it: bf16 where the CPU has bfloat16 units (AVX512-BF16, AMX), about twice fp32's speed and
        boxes within about a pixel at 640 px, else fp32. True: bf16 (--amp bf16); False: fp32 (--amp off), the
        .pt's boxes to float rounding. The precision it runs in is logged."""
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if bf16 is not None:
            config["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
        self.compiled = self.core.compile_model(self.model, "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        how = "OpenVINO's choice for this CPU; --amp off for fp32" if bf16 is None else "asked"
        LOGGER.info(f"OpenVINO: {self.precision} arithmetic ({how})")

    def __call__(self, im):
        x = im.cpu().numpy()
        seconds = inference_seconds(x.size * WORK_PER_INPUT)
        self.request.start_async({0: x})
        if not self.request.wait_for(int(seconds * 1000)):
            self.request.cancel()
            raise BadFile(f"--weights {self.weights}: inference stopped after {seconds:.0f} s, beyond the budget of "
                          "its input")
        return [torch.from_numpy(np.array(self.request.get_output_tensor(i).data)).to(im.device)
                for i in range(len(self.compiled.outputs))]


def read_engine_file(path):
    """(metadata JSON text, serialised engine bytes) of an engine file the exporter wrote."""
    data = Path(path).read_bytes()
    head = len(ENGINE_MAGIC) + 4
    if len(data) < head or not data.startswith(ENGINE_MAGIC):
        raise BadFile(f"--weights {path}: not an engine written by export.py --include engine")
    (n,) = struct.unpack("<I", data[len(ENGINE_MAGIC):head])
    if head + n > len(data):
        raise BadFile(f"--weights {path}: its metadata runs past the end of the file")
    return data[head:head + n].decode("utf-8", errors="replace"), data[head + n:]


def engine_file_bytes(meta, engine):
    text = json.dumps(meta).encode()
    return ENGINE_MAGIC + struct.pack("<I", len(text)) + text + bytes(engine)


class TensorRTRunner:
    """A TensorRT engine on a CUDA device: inputs and outputs are torch tensors on that device."""

    def __init__(self, weights, device):
        if device.type != "cuda" or not torch.cuda.is_available():
            raise BadOption(f"--weights {weights}: a TensorRT engine runs on a CUDA GPU: give --device 0")
        try:
            import tensorrt as trt
        except ImportError:
            raise BadOption(f"--weights {weights}: running TensorRT engines needs the tensorrt package: "
                            "pip install tensorrt") from None
        self.metadata_text, blob = read_engine_file(weights)
        self.weights, self.device = weights, device
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise BadFile(f"--weights {weights}: TensorRT cannot load its engine (built by another TensorRT or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = [self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names]
        self.input_name = names[is_input.index(True)]
        self.output_names = [n for n, i in zip(names, is_input) if not i]
        dtype = {n: torch.half if self.engine.get_tensor_dtype(n) == trt.DataType.HALF else torch.float for n in names}
        self.dtypes, self.half = dtype, dtype[self.input_name] == torch.half
        # the largest input of its one optimisation profile (engine/export_targets.build_engine): TensorRT refuses a
        # larger one only by leaving the outputs' shapes unknown
        self.max_shape = tuple(self.engine.get_tensor_profile_shape(self.input_name, 0)[2])

    def output_shapes(self, shape):
        self.context.set_input_shape(self.input_name, tuple(shape))
        return [tuple(self.context.get_tensor_shape(n)) for n in self.output_names]

    def __call__(self, im):
        if im.numel() > MAX_EXPORT_INPUT:
            raise BadOption(f"--weights {self.weights}: an input of {tuple(im.shape)} is beyond the budget")
        if any(s > m for s, m in zip(im.shape, self.max_shape)):
            n, _, h, w = self.max_shape
            raise BadOption(f"--weights {self.weights}: the engine takes up to {n} images of up to {h}x{w}, got "
                            f"{tuple(im.shape)}: give a smaller --batch-size or --img, or export it at that size")
        x = im.to(self.device, torch.half if self.half else torch.float).contiguous()
        self.context.set_input_shape(self.input_name, tuple(x.shape))
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        outs = []
        for n in self.output_names:
            y = torch.empty(tuple(self.context.get_tensor_shape(n)), device=self.device, dtype=self.dtypes[n])
            self.context.set_tensor_address(n, y.data_ptr())
            outs.append(y)
        stream = torch.cuda.current_stream(self.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise BadFile(f"--weights {self.weights}: TensorRT failed to run the engine")
        stream.synchronize()
        return [y.float() for y in outs]
