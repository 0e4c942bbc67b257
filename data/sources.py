"""Prediction inputs: images and videos from a file, folder, glob, list .txt file or a list of those."""

import os

import cv2

from data.augment import chw_rgb, letterbox
from data.image_files import (
    IMG_FORMATS,
    MISSING,
    SUBFOLDER,
    VID_FORMATS,
    ListingTooLarge,
    entry_problem,
    scan_files,
    suffix,
)
from utils.budget import MAX_IMAGE_PIXELS
from utils.errors import BadFile
from utils.imageio import check_pixels, is_utf8, printable, read_image
from utils.log import LOGGER


class SourceNotFound(BadFile, FileNotFoundError):
    """A prediction source that does not exist or holds no image or video file."""


class LoadImages:
    """Iterate images and every frame of videos.

    Yields (path, im, im0, description): im0 is the original BGR image/frame; im is `transforms(im0)` when
    transforms is given, else im0 letterboxed to imgsz (padded to a stride multiple with auto=True) as a
    contiguous RGB (3, H, W) uint8 array. `mode` is 'image' or 'video'; for videos `frame` is the 1-based
    index of the frame just read and `frames` the frame count the container reports; only every vid_stride-th
    frame is read (1, 1 + vid_stride, ...).
    A missing source, or one without an image or video file, raises SourceNotFound naming it. Unreadable images and
    videos (also one that ends before the frames it reports, a truncated file) are warned about and the rest go on;
    when not one image or frame could be read, the iteration ends in BadFile.
    """

    def __init__(self, source, imgsz=640, stride=32, auto=True, transforms=None, vid_stride=1):
        self.files = self._find(source)
        self.source = source
        self.video_flag = [suffix(f) in VID_FORMATS for f in self.files]
        self.nf = len(self.files)
        self.imgsz, self.stride, self.auto, self.transforms = imgsz, stride, auto, transforms
        self.vid_stride = max(int(vid_stride), 1)
        self.mode, self.frame, self.frames, self.cap = "image", 0, 0, None
        self.count, self.read = 0, 0

    def __len__(self):
        return self.nf

    @staticmethod
    def _find(source):
        """The image and video files of `source`. A folder is read itself, not its sub-folders (a run's output
        under it would become input): they are named in one note, with the glob that reads them."""
        formats = IMG_FORMATS | VID_FORMATS
        try:
            files, others = scan_files(source, formats, recursive=False)
        except (FileNotFoundError, ListingTooLarge) as e:
            raise SourceNotFound(str(e)) from None
        skipped = [printable(p) for p, why in others if why == SUBFOLDER]
        files = LoadImages._regular(files)
        hint = f"--source '{os.path.join(os.path.dirname(skipped[0]), '**', '*')}' reads them too" if skipped else ""
        if not files:
            if os.path.isfile(source) and not str(source).endswith(".txt"):  # not a media file, nor a list of them
                raise SourceNotFound(f"{source} is not an image, a video, a .txt list or a .streams file (formats: "
                                     f"{', '.join(sorted(formats))})")
            where = f"; its {len(skipped)} sub-folder(s) are not read: {hint}" if skipped else ""
            raise SourceNotFound(f"no supported files found in {source} (formats: {', '.join(sorted(formats))})"
                                 f"{where}")
        if skipped:
            names = ", ".join(os.path.basename(p) for p in skipped[:3]) + (", ..." if len(skipped) > 3 else "")
            LOGGER.info(f"note: {len(skipped)} sub-folder(s) not read ({names}); {hint}")
        return files

    @staticmethod
    def _regular(files):
        """The regular files of `files`: a FIFO, device or socket named like an image would block the reader (a FIFO
        waits for a writer that never comes); each is named in a warning and skipped."""
        kept = []
        for f in files:
            why = entry_problem(f)
            if why and why != MISSING:
                LOGGER.warning(f"WARNING: skipping {printable(f)}: it {why}")
            else:
                kept.append(f)
        return kept

    def __iter__(self):
        self._release()
        self.count, self.read = 0, 0
        return self

    def _open_video(self, path):
        """Open `path`; False (with a warning) when it cannot be opened."""
        self._release()
        if not is_utf8(path):  # cv2.VideoCapture takes the name as a C string: another one crashes it
            LOGGER.warning(f"WARNING: skipping video {printable(path)}: OpenCV opens only UTF-8 file names, rename it")
            return False
        self.cap = cv2.VideoCapture(path)
        if not self.cap.isOpened():
            self._release()
            LOGGER.warning(f"WARNING: skipping video {path}: cannot be opened (truncated, or not a video)")
            return False
        w, h = (int(self.cap.get(p)) for p in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT))
        try:
            check_pixels(w, h)
        except BadFile as e:
            self._release()
            LOGGER.warning(f"WARNING: skipping video {printable(path)}: its frames are {e}")
            return False
        self.mode, self.frame, self.opened_pixels = "video", 0, w * h
        self.frames = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT))
        return True

    def _video_ended(self, path):
        """Warn when a video gave no frame, or stopped more than a stride before the frame count it reports."""
        if self.frame == 0:
            LOGGER.warning(f"WARNING: skipping video {path}: no frame could be read (truncated, or not a video)")
        elif self.frame + self.vid_stride < self.frames:
            LOGGER.warning(f"WARNING: video {path} ended at frame {self.frame} of the {self.frames} it reports "
                           "(truncated?)")
        self._release()
        self.count += 1

    def _release(self):
        if self.cap is not None:
            self.cap.release()
            self.cap = None

    def _next_raw(self):
        """(path, im0, description) of the next image or frame; StopIteration at the end."""
        while self.count < self.nf:
            path = self.files[self.count]
            if self.video_flag[self.count]:
                if self.cap is None and not self._open_video(path):
                    self.count += 1
                    continue
                if self.frame:  # skip the frames between strides (grab does not decode them)
                    for _ in range(self.vid_stride - 1):
                        self.cap.grab()
                ok, im0 = self.cap.read()
                if ok and im0.shape[0] * im0.shape[1] > (self.opened_pixels or MAX_IMAGE_PIXELS):  # grown since
                    LOGGER.warning(f"WARNING: video {printable(path)}: a frame of {im0.shape[1]}x{im0.shape[0]}, "
                                   "larger than the size it opened with; the rest of it is skipped")
                    self._release()
                    self.count += 1
                    continue
                if ok:
                    self.frame += 1 if self.frame == 0 else self.vid_stride
                    return path, im0, f"video {self.count + 1}/{self.nf} ({self.frame}/{self.frames}) {path}: "
                self._video_ended(path)
                continue
            self.mode = "image"
            self.count += 1
            try:
                im0 = read_image(path)
            except BadFile as e:  # over the pixel limit, or no longer a regular file: never decoded nor saved
                LOGGER.warning(f"WARNING: skipping image {printable(path)}: {e}")
                continue
            if im0 is None:
                LOGGER.warning(f"WARNING: skipping unreadable image {printable(path)}")
                continue
            return path, im0, f"image {self.count}/{self.nf} {path}: "
        self._release()
        if not self.read:
            raise BadFile(f"nothing could be read from {self.source}: none of its {self.nf} files is a readable "
                          "image or video (see the warnings above)")
        raise StopIteration

    def __next__(self):
        path, im0, s = self._next_raw()
        self.read += 1
        if self.transforms is not None:
            im = self.transforms(im0)
        else:
            im = letterbox(im0, self.imgsz, stride=self.stride, auto=self.auto)[0]
            im = chw_rgb(im)
        return path, im, im0, s
