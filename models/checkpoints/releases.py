"""Official weights by name: the release each official file name is published in, and its download."""

import re
from pathlib import Path

from data.downloads import fetch
from utils.errors import BadFile
from utils.log import LOGGER

RELEASES = (
    (r"yolov5[nsmlx]6?(-seg|-cls)?\.pt", "https://github.com/ultralytics/yolov5/releases/download/v7.0/"),
    (r"yolov7(x|-tiny|-w6|-e6|-d6|-e6e)?(_training)?\.pt", "https://github.com/WongKinYiu/yolov7/releases/download/v0.1/"),
    (r"yolov8[nsmlx](-seg|-cls|-pose)?\.pt", "https://github.com/ultralytics/assets/releases/download/v0.0.0/"),
    (r"yolov5[nsmlx]6?u\.pt", "https://github.com/ultralytics/assets/releases/download/v8.2.0/"),  # YOLOv5u
    (r"yolo11[nsmlx](-seg|-cls|-pose)?\.pt", "https://github.com/ultralytics/assets/releases/download/v8.3.0/"),
)


def official_url(name):
    """Release asset URL of an official weights file name, or None if the name is not an official one."""
    for pattern, base in RELEASES:
        if re.fullmatch(pattern, name):
            return base + name
    return None


def attempt_download(name, dest_dir="."):
    """Download official weights `name` (e.g. 'yolov5s.pt') from its GitHub release into dest_dir; return the path.

    Published by rename (utils.files.publish): ranks or nodes downloading it at once each fetch a private copy and
    the file appears whole. Call it on one rank per machine first (torch_distributed_zero_first) to fetch it once.
    """
    url = official_url(name)
    if url is None:
        raise BadFile(f"weights '{name}' not found and not an official release name")
    dst = Path(dest_dir) / name
    LOGGER.info(f"downloading {url} to {dst}")
    fetch(url, dst)
    return dst


def resolve_weights(weights):
    path = Path(weights)
    if path.is_file():
        return path
    if path.is_dir():  # an OpenVINO IR's folder, most likely: export.py's default for --include openvino
        raise BadFile(f"{weights}: a folder, not a .pt checkpoint (a model exported with export.py runs in the "
                      "predict and val scripts only)")
    if path.name == str(weights) and official_url(path.name):
        return attempt_download(path.name)
    raise BadFile(f"weights file not found: {weights}")


