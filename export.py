"""Export a trained or official model (YOLOv5/v7/v8; detect, segment, classify) to ONNX and/or TorchScript.

The exported files run with detect.py, segment/predict.py, classify/predict.py and the val scripts
(`--weights best.onnx`) and give the detections of the .pt they came from.

Usage:
    $ python export.py --weights runs/train/exp/weights/best.pt --include onnx torchscript --img 320
    $ python export.py --weights yolov8n.pt --include onnx --dynamic --simplify   # any batch and image size
    $ python export.py --weights best.pt --include onnx --half --device 0         # FP16, CUDA only
"""

import argparse

from engine.exporter import FORMATS, Exporter
from utils.dist import get_rank
from utils.errors import run_cli
from utils.loggers import set_logging


def parse_opt(argv=None):
    p = argparse.ArgumentParser(description="Export a YOLO model",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--weights", type=str, required=True, help="our checkpoint or an official .pt")
    p.add_argument("--include", nargs="+", default=["torchscript", "onnx"], help=f"formats: {', '.join(FORMATS)}")
    p.add_argument("--imgsz", "--img", "--img-size", nargs="+", type=int, default=[640], help="image size h [w]")
    p.add_argument("--batch-size", "--batch", type=int, default=1, help="batch size of the example input")
    p.add_argument("--device", default="cpu", help="cuda device, i.e. 0, or cpu")
    p.add_argument("--half", action="store_true", help="FP16 model (CUDA only)")
    p.add_argument("--dynamic", action="store_true", help="dynamic batch and image size")
    p.add_argument("--simplify", action="store_true", help="ONNX: simplify the graph with onnxslim")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    return p.parse_args(argv)


def main(opt):
    set_logging(get_rank())
    return Exporter(opt)()


if __name__ == "__main__":
    run_cli(main, parse_opt)
