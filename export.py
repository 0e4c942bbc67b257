"""Export a trained or official model (YOLOv5/v7/v8/11; detect, segment, classify, pose, obb) to ONNX, TorchScript,
OpenVINO or a TensorRT engine.

The exported files run with detect.py, segment/predict.py, classify/predict.py, pose/predict.py and the val scripts
(`--weights best.onnx`). ONNX and TorchScript files take any batch and image size unless made with --no-dynamic, so
at the same --img they see the input the .pt sees and give its detections; an OpenVINO IR takes --imgsz and
--batch-size only unless made with --dynamic (OpenVINO runs a fixed input fastest), and images are letterboxed square
to it.

Usage:
    $ python export.py --weights runs/train/exp/weights/best.pt --include onnx torchscript --img 320
    $ python export.py --weights yolov8n.pt --include onnx --simplify                   # onnxslim
    $ python export.py --weights best.pt --include onnx --no-dynamic --img 320          # one input size only
    $ python export.py --weights best.pt --include openvino --int8 --data data/coco128.yaml
    $ python export.py --weights best.pt --include onnx --half --device 0               # FP16, CUDA only
"""

from engine.options import ExportOptions
from utils.cli import export_parser
from utils.run import run_cli


def parse_opt(argv=None):
    return export_parser(ExportOptions, "Export a YOLO model").parse_args(argv)


def main(opt):
    from engine.exporter import Exporter  # imports torch: after parsing, for a quick --help
    from engine.tasks import TASKS
    from utils.dist import get_rank
    from utils.log import set_logging

    set_logging(get_rank())
    return Exporter(opt, {name: task.inputs for name, task in TASKS.items()})()


if __name__ == "__main__":
    run_cli(main, parse_opt)
