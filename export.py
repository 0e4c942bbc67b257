"""Export a trained or official model (YOLOv5/v7/v8; detect, segment, classify, pose) to ONNX and/or TorchScript.

The exported files run with detect.py, segment/predict.py, classify/predict.py, pose/predict.py and the val scripts
(`--weights best.onnx`). They take any batch and image size (--dynamic, the default), so at the same --img they see
the input the .pt sees and give its detections; `--no-dynamic` fixes the input to --imgsz and --batch-size.

Usage:
    $ python export.py --weights runs/train/exp/weights/best.pt --include onnx torchscript --img 320
    $ python export.py --weights yolov8n.pt --include onnx --simplify                   # onnxslim
    $ python export.py --weights best.pt --include onnx --no-dynamic --img 320          # one input size only
    $ python export.py --weights best.pt --include onnx --half --device 0               # FP16, CUDA only
"""

import argparse

from engine.exporter import DEFAULT_OPSET, FORMATS, OPSETS, Exporter
from utils.cli import Parser, add_modules_arg
from utils.dist import get_rank
from utils.errors import run_cli
from utils.loggers import set_logging


def parse_opt(argv=None):
    p = Parser("Export a YOLO model", launcher=False)
    p.add_argument("--weights", type=str, required=True, help="our checkpoint or an official .pt")
    p.add_argument("--include", nargs="+", default=["torchscript", "onnx"], help=f"formats: {', '.join(FORMATS)}")
    p.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[640],
                   help="example input size h [w]; with --no-dynamic the one size the file takes")
    p.add_argument("--batch-size", "--batch", type=int, default=1,
                   help="example input batch; with --no-dynamic the largest batch the file takes")
    p.add_argument("--device", default="cpu", help="device to export on: cpu, or GPU 0 (for --half)")
    p.add_argument("--half", action="store_true", help="FP16 model (CUDA only)")
    p.add_argument("--dynamic", action=argparse.BooleanOptionalAction, default=True,
                   help="any batch and image size, so results equal the .pt's at the same --img; --no-dynamic: "
                        "only the example input's")
    p.add_argument("--simplify", action="store_true", help="ONNX: simplify the graph with onnxslim")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help=f"ONNX opset version, {OPSETS.start}..{OPSETS.stop - 1} with this torch")
    add_modules_arg(p)
    return p.parse_args(argv)


def main(opt):
    set_logging(get_rank())
    return Exporter(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
