"""The images that calibrate an INT8 export (OpenVINO through NNCF, a TensorRT engine): the run's own training
images, prepared as the predictor prepares what it runs, so the activation ranges measured are the ones met later.

--data names the dataset (else the run that made the weights names it: engine/inherit.py); its train split is
listed, `--calib-images` of its images are spread evenly over it (a split sorted by name often groups alike images),
and each is read, letterboxed (detection family) or resized and centre-cropped (classifiers). An image that does not
decode is skipped, named and counted. Too few images, or none given, ends with one line.
"""

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


def training_images(data, task):
    """The sorted image files of the train split of `data` (a dataset YAML or, for classifiers, a folder)."""
    if not data:
        raise CalibrationError("--int8 needs calibration images: give --data, the dataset the weights trained on "
                               "(their run names none, or its file no longer exists)")
    d = check_cls_dataset(data) if task == "classify" else check_det_dataset(data, keypoints=task == "pose")
    files, _ = scan_files(d["train"])
    return sorted(files) if task == "classify" else files


def spread(files, n):
    """n of `files` at even steps over the whole list (all of them when there are n or fewer)."""
    if len(files) <= n:
        return list(files)
    return [files[i] for i in np.linspace(0, len(files) - 1, n).round().astype(int)]


def prepare(im, imgsz, task):
    """A BGR image -> the float32 (3, h, w) RGB array in [0, 1] the exported graph takes at `imgsz` (h, w)."""
    if task == "classify":
        return classify_val_transforms(imgsz[0])(im).numpy()
    return chw_rgb(letterbox(im, imgsz, auto=False)[0]).astype(np.float32) / 255


def calibration_images(data, task, imgsz, n):
    """A list of `n` prepared images (fewer where the split has fewer) from the train split of `data`, each
    float32 (1, 3, h, w). CalibrationError (one line) when --data is missing or fewer than MIN_CALIB_IMAGES
    images decode."""
    if n < MIN_CALIB_IMAGES:
        raise BadOption(f"--calib-images {n}: INT8 calibration needs at least {MIN_CALIB_IMAGES} images")
    files = training_images(data, task)
    chosen, skipped, out = spread(files, n), [], []
    for f in chosen:
        try:
            im = read_image(f)
        except (ImageTooLarge, NotAFile):
            im = None
        if im is None:
            skipped.append(f)
            continue
        out.append(prepare(im, imgsz, task)[None])
    if skipped:
        LOGGER.warning(f"--int8: skipped {len(skipped)} calibration image(s) that do not decode, e.g. "
                       f"{printable(skipped[0])}")
    if len(out) < MIN_CALIB_IMAGES:
        raise CalibrationError(f"--data {data}: {len(out)} training image(s) read, INT8 calibration needs at least "
                               f"{MIN_CALIB_IMAGES}")
    LOGGER.info(f"--int8: calibrating on {len(out)} of the {len(files)} training images of {printable(str(data))}"
                f"{' (all of them)' if len(out) == len(files) else ''}")
    return out

