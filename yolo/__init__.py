"""The Python API (`from yolo import YOLO`, yolo/model.py) and the `yolo` command (yolo/cli.py) over this clone's
scripts."""

from yolo.model import YOLO

__all__ = ["YOLO"]
