"""The images that calibrate an INT8 export (OpenVINO through NNCF, a TensorRT engine): the run's own training
images, prepared as the predictor prepares what it runs, so the activation ranges measured are the ones met later.

--data names the dataset (else the run that made the weights names it: engine/inherit.py); its train split is
listed, `--calib-images` of its images are spread evenly over it (a split sorted by name often groups alike images),
and each is read and prepared. The task's record says how (`Task.inputs`, an `Inputs` of this module: letterboxed
for the detection family, resized and centre-cropped for classifiers), so nothing here names a task. An image that
does not decode is skipped, named and counted. Too few images, or none given, ends with one line."""

import dataclasses
import functools
from typing import Callable

import numpy as np

from data.augment import chw_rgb, letterbox
from data.classify_dataset import classify_val_transforms
from data.dataset_yaml import check_cls_dataset, check_det_dataset
from data.image_files import scan_files
from utils.errors import BadDataset, BadOption
from utils.imageio import ImageTooLarge, NotAFile, printable, read_image
from utils.log import LOGGER

MIN_CALIB_IMAGES = 32  # below this the ranges of one batch's images would stand for every input the model sees


class CalibrationError(BadDataset):
    """--int8 has no calibration data, or too little."""


@dataclasses.dataclass(frozen=True)
class Inputs:
    """How a task's images reach its model, which calibration follows: `files(data)` lists the train split of the
    dataset `data` as the task's dataset check finds it, in the order the images are spread over; `prepare(im,
    imgsz)` turns a BGR image into the float32 (3, h, w) RGB array in [0, 1] the graph takes at `imgsz` (h, w)."""

    files: Callable
    prepare: Callable


def detection_files(data, keypoints=False):
    """The train split of a detection-family dataset, as listed (a list file's order is its author's).
    keypoints: a folder's COCO layout is sought in its keypoint files (pose)."""
    files, _ = scan_files(check_det_dataset(data, keypoints=keypoints)["train"])
    return files


def class_folder_files(data):
    """The train split of a classification dataset, sorted by name: its class folders are walked in no set order."""
    files, _ = scan_files(check_cls_dataset(data)["train"])
    return sorted(files)


def letterboxed(im, imgsz):
    """Resized keeping the aspect ratio and padded to `imgsz`, as the detection family's predictor does."""
    return chw_rgb(letterbox(im, imgsz, auto=False)[0]).astype(np.float32) / 255


def centre_cropped(im, imgsz):
    """The shorter side resized to imgsz[0], then the centre square cropped, as a classifier's predictor does."""
    return classify_val_transforms(imgsz[0])(im).numpy()


LETTERBOXED = Inputs(detection_files, letterboxed)
POSE_LETTERBOXED = Inputs(functools.partial(detection_files, keypoints=True), letterboxed)
CENTRE_CROPPED = Inputs(class_folder_files, centre_cropped)


def spread(files, n):
    """n of `files` at even steps over the whole list (all of them when there are n or fewer)."""
    if len(files) <= n:
        return list(files)
    return [files[i] for i in np.linspace(0, len(files) - 1, n).round().astype(int)]


def calibration_images(data, inputs, imgsz, n):
    """A list of `n` images (fewer where the split has fewer) from the train split of `data`, each prepared by
    `inputs` (the task's `Inputs`) as float32 (1, 3, h, w). CalibrationError (one line) when --data is missing or
    fewer than MIN_CALIB_IMAGES images decode."""
    if n < MIN_CALIB_IMAGES:
        raise BadOption(f"--calib-images {n}: INT8 calibration needs at least {MIN_CALIB_IMAGES} images")
    if not data:
        raise CalibrationError("--int8 needs calibration images: give --data, the dataset the weights trained on "
                               "(their run names none, or its file no longer exists)")
    files = inputs.files(data)
    chosen, skipped, out = spread(files, n), [], []
    for f in chosen:
        try:
            im = read_image(f)
        except (ImageTooLarge, NotAFile):
            im = None
        if im is None:
            skipped.append(f)
            continue
        out.append(inputs.prepare(im, imgsz)[None])
    if skipped:
        LOGGER.warning(f"--int8: skipped {len(skipped)} calibration image(s) that do not decode, e.g. "
                       f"{printable(skipped[0])}")
    if len(out) < MIN_CALIB_IMAGES:
        raise CalibrationError(f"--data {data}: {len(out)} training image(s) read, INT8 calibration needs at least "
                               f"{MIN_CALIB_IMAGES}")
    LOGGER.info(f"--int8: calibrating on {len(out)} of the {len(files)} training images of {printable(str(data))}"
                f"{' (all of them)' if len(out) == len(files) else ''}")
    return out

