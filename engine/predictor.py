"""BasePredictor: load weights (.pt, .onnx, .torchscript), read a source (image, folder, glob, video, URL, webcam,
stream), run, draw and save results.

The task's predictor (engine/tasks: a family's class bound to the task's record) declares what its model predicts
(`declare_fields`: evaluation/fields.py, as the record says) and implements `postprocess` (raw model output -> one
`evaluation/fields.Predictions` record per image, in original-image pixels); the predictor walks
the fields to draw each image, and asks the first one for its --save-txt lines (`lines`, in the task's label format),
the crops and csv rows (`objects`) and the log line (`summary`). Each image's record is what the run returns.
"""

import csv
import dataclasses
import itertools
import math
from pathlib import Path

import cv2
import torch

from data.streams import open_source
from engine.eval_memory import settle_batch
from engine.inherit import run_values
from engine.messages import check_task
from engine.options import PredictOptions
from evaluation.plots import Annotator, save_one_box
from evaluation.results import Results, window_problem
from models.backend import InferenceBackend
from models.registry import use_modules
from utils import dist as du
from utils.cli import check_imgsz
from utils.errors import BadOption
from utils.files import increment_path
from utils.imageio import printable, write_image
from utils.log import LOGGER
from utils.text import escape_controls
from utils.torch_utils import inference_bf16, time_sync


class BasePredictor:
    # the task record's (engine/tasks), set on the class the task binds: its run folder, the tasks of the models whose
    # output it reads (a head's `task`) and its options class (engine/options.py)
    default_project = None
    tasks = ()
    options = PredictOptions

    def __init__(self, args):
        """`args`: a predict script's parsed command line, read once into the task's options (`self.args`)."""
        opt = self.options.from_values(args)
        use_modules(opt.modules)
        self.device = du.select_device(opt.device)
        half = opt.half and self.device.type == "cuda"
        bf16 = inference_bf16(self.device, opt.amp)
        self.model = InferenceBackend(opt.weights, device=self.device, half=half, bf16=bf16)
        self.args = dataclasses.replace(opt, **run_values(opt, self.model.run), **conf_default(opt))
        check_task(self.model.task, self.tasks, f"--weights {opt.weights}", "predict")
        self.half = self.model.fp16
        self.names = self.model.names
        self.check_args()
        self.fields = self.declare_fields()
        self.stride = self.model.stride
        self.imgsz = self._input_size(opt.imgsz)
        # one image at this size (a run record may give up to 4096 px) must fit in memory; refused before any source
        settle_batch(self.model, self.imgsz, 1, self.device, f"--weights {opt.weights}")
        if getattr(self.args, "track", None) == "":  # `tracker=` left empty: the run would go on untracked
            raise BadOption("--track '': name a tracker: bytetrack, botsort or a tracker YAML")
        self.tracker = self.make_tracker()  # its settings are checked before a source opens (a stream reads at once)
        self.dataset = self.load_source()  # a source that is missing or empty is refused before a run folder exists
        project = Path(self.args.project or self.default_project)
        self.save_dir = increment_path(project / self.args.name, exist_ok=self.args.exist_ok)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        if self.args.save_txt:
            (self.save_dir / "labels").mkdir(exist_ok=True)
        self.csv_path = self.save_dir / "predictions.csv"
        if self.args.save_csv:
            self._csv(["image", "class", "confidence", "x1", "y1", "x2", "y2"])
        if self.tracker is not None:
            self.tracker.save_dir = self.save_dir
        self.show = self.args.view_img and can_show_windows()
        self.writers = {}
        self.stems = {}  # video or stream path (None: the images) -> the stem its outputs take (output_stem)

    @property
    def draws(self):
        """Whether a frame is drawn on: where it is saved or shown (--nosave alone: a drawing no one would see)."""
        return not self.args.nosave or self.args.view_img

    def check_args(self):
        """Hook: refuse options the loaded model cannot honour (BadOption), before a run folder exists."""

    def make_tracker(self):
        """Hook: the task's engine.track.FrameTracker where it tracks (--track), else None."""
        return None

    def declare_fields(self):
        """What the task's model predicts (evaluation/fields.py), the first field speaking for the whole image."""
        raise NotImplementedError

    def _input_size(self, given):
        """--imgsz (`given`, else the weights' run's), or the one size a static export takes (h, w)."""
        if self.model.dynamic:
            return check_imgsz(self.args.imgsz, self.stride)
        if given is not None and (given, given) != self.model.imgsz:
            LOGGER.warning(f"{self.args.weights} takes {self.model.imgsz[0]}x{self.model.imgsz[1]} images only "
                           f"(exported without --dynamic): using that instead of --imgsz {self.args.imgsz}")
        return self.model.imgsz

    def load_source(self):
        # a static export needs exactly its input size; otherwise pad only to the stride (less work)
        return open_source(self.args.source, imgsz=self.imgsz, stride=self.stride, auto=self.model.dynamic,
                           vid_stride=self.args.vid_stride)

    def preprocess(self, im):
        im = torch.from_numpy(im).to(self.device)
        im = (im.half() if self.half else im.float()) / 255
        return im[None] if im.ndim == 3 else im

    def postprocess(self, preds, im, im0):
        """The image's `Predictions` record in original-image pixels (im0's)."""
        raise NotImplementedError

    def annotator(self, im0):
        return Annotator(im0, line_width=self.args.line_thickness)

    def label(self, c, conf):
        """The text drawn beside a box or on an image: name and confidence, as --hide-labels/--hide-conf allow."""
        if self.args.hide_labels:
            return ""
        return self.names[c] if self.args.hide_conf else f"{self.names[c]} {conf:.2f}"

    def _csv(self, row):
        with open(self.csv_path, "a", newline="", errors="surrogateescape") as f:  # names as their bytes on disk
            csv.writer(f).writerow([escape_controls(v) if isinstance(v, str) else v for v in row])

    def save_extras(self, image, imc, name):
        """--save-crop (from the undrawn image imc) and --save-csv rows of one image or frame: the first field's
        `objects`, (xyxy in original-image pixels, class, confidence); a classifier's is the whole image."""
        for xyxy, c, conf in self.fields[0].objects(image):
            if self.args.save_crop and xyxy is not None:
                save_one_box(xyxy, imc, self.save_dir / "crops" / self.names[c] / f"{Path(name).stem}.jpg")
            if self.args.save_csv:
                coords = [f"{v:.1f}" for v in xyxy] if xyxy is not None else [""] * 4
                self._csv([name, self.names[c], f"{conf:.4f}", *coords])

    def write_result(self, image, im0, txt_path, ids=None):
        """Draw each field of `image` on im0 (in place, where saved or shown), the first on top; append the
        image's --save-txt lines to txt_path (when given; each row's track id last where `ids` are given); return
        the log line's summary."""
        if self.draws:
            annotator = self.annotator(im0)
            for f in reversed(self.fields):
                f.draw(annotator, image, self.label)
            im0[:] = annotator.result()
        first = self.fields[0]
        lines = first.lines(self.fields, image, im0.shape[:2], self.args.save_conf, ids) if txt_path is not None else []
        if lines:
            with open(txt_path, "a") as f:
                f.writelines(lines)
        return first.summary(image, self.names)

    def __call__(self):
        """Every image's record (`evaluation/fields.Predictions`, original-image pixels), in the source's order."""
        return [r.record for r in self.stream(keep_original=False)]

    def stream(self, keep_original=True):
        """Yields each image's or frame's `evaluation/results.Results` as soon as it is predicted, drawn, written and
        saved as the options say; nothing is kept between frames, so a long video takes the memory of one. With
        `keep_original` a Results' `orig_img` is the image as read, else the one drawn where saved or shown (no
        copy)."""
        dataset, dt, n, shape = self.dataset, [0.0, 0.0, 0.0], 0, None
        try:  # a caller that stops early (breaks out of the stream) still gets whole video files
            with torch.no_grad():
                for path, im, im0, desc in dataset:
                    result, times, shape = self._frame(dataset, path, im, im0, desc, keep_original)
                    dt, n = [a + b for a, b in zip(dt, times)], n + 1
                    yield result
        finally:
            self._release_writers()
        if n:
            LOGGER.info(
                f"Speed: {dt[0] * 1e3 / n:.1f}ms pre-process, {dt[1] * 1e3 / n:.1f}ms inference, "
                f"{dt[2] * 1e3 / n:.1f}ms post-process per image at shape {(1, 3, *shape)}"
            )
        a = self.args
        if not a.nosave or a.save_txt or a.save_csv or a.save_crop:
            LOGGER.info(f"Results saved to {self.save_dir}")

    def _frame(self, dataset, path, im, im0, desc, keep_original):
        """One image or frame predicted, tracked, drawn, written and saved: (its Results, the seconds of its three
        steps, the input's (h, w))."""
        t0 = time_sync()
        x = self.preprocess(im)
        t1 = time_sync()
        preds = self.model(x)
        t2 = time_sync()
        result = self.postprocess(preds, x, im0)
        ids = None
        if self.tracker is not None:  # before drawing: BoT-SORT reads the frame as it was
            # a video's frames are one sequence; the images of a folder (or of persisting API calls) another
            key, frame = (path, dataset.frame) if dataset.mode != "image" else (None, None)
            result, ids = self.tracker.update(result, im0, key, _fps(dataset, self.args.vid_stride),
                                              self.output_stem(dataset, path), frame)
        t3 = time_sync()
        orig = im0.copy() if keep_original or self.args.save_crop else im0
        summary = self._write(dataset, path, result, im0, orig, ids)
        LOGGER.info(f"{desc}{summary}, {(t2 - t1) * 1e3:.1f}ms")
        speed = {"preprocess": (t1 - t0) * 1e3, "inference": (t2 - t1) * 1e3, "postprocess": (t3 - t2) * 1e3}
        out = Results(orig, path, self.names, self.fields, result, speed,
                      id=None if ids is None else torch.from_numpy(ids))
        return out, (t1 - t0, t2 - t1, t3 - t2), x.shape[-2:]

    def _write(self, dataset, path, result, im0, imc, ids=None):
        """Draw `result` (and its track `ids`) on im0, write its label lines, crops and csv rows (crops from imc,
        undrawn), save and show the drawn image; returns the log line's summary."""
        # the names saved (image, labels, crops) with control characters escaped: listed, they would drive a terminal
        p = Path(escape_controls(path))
        stem = p.stem if dataset.mode == "image" else f"{self.output_stem(dataset, path)}_{dataset.frame}"
        txt_path = self.save_dir / "labels" / f"{stem}.txt" if self.args.save_txt else None
        summary = self.write_result(result, im0, txt_path, ids)
        if ids is not None and self.draws:
            self.tracker.draw(im0, result, ids, path if dataset.mode != "image" else None)
        self.save_extras(result, imc, p.name if dataset.mode == "image" else f"{stem}{p.suffix or '.jpg'}")
        self.save(dataset, path, im0)
        if self.show:
            cv2.imshow(printable(p), im0)
            cv2.waitKey(1)
        return summary

    def output_stem(self, dataset, path):
        """The stem a video's or stream's outputs take in the run folder (its saved video, label files and MOT file;
        the images' MOT file: `images`): its own, or where an earlier source of the run took that (a.mp4 and a.avi,
        two cameras' .../live), the same with its suffix, then with a count; a stream of several is numbered first."""
        key = path if dataset.mode != "image" else None
        if key not in self.stems:
            p = Path(escape_controls(path)) if key is not None else Path("images")
            base = f"{dataset.sources.index(path)}_{p.stem}" if dataset.mode == "stream" and len(dataset) > 1 \
                else p.stem
            names = itertools.chain([base, f"{base}_{p.suffix[1:]}"] if p.suffix[1:] else [base],
                                    (f"{base}_{k}" for k in itertools.count(2)))
            taken = set(self.stems.values())
            self.stems[key] = next(n for n in names if n not in taken)
        return self.stems[key]

    def _release_writers(self, keep=None):
        """Finish every saved video but `keep`'s (an mp4 is playable only once its writer is released)."""
        for path in [p for p in self.writers if p != keep]:
            self.writers.pop(path).release()

    def save(self, dataset, path, im0):
        if self.args.nosave:
            return
        if dataset.mode == "video":  # a file's videos come one after another: the one before is done
            self._release_writers(keep=path)
        p = Path(escape_controls(path))
        if dataset.mode == "image":
            write_image(self.save_dir / p.name, im0)
            return
        if path not in self.writers:
            h, w = im0.shape[:2]
            # .mp4 whatever the source's suffix: the writer's mp4v codec takes no other container
            out = str(self.save_dir / f"{printable(self.output_stem(dataset, path))}.mp4")
            self.writers[path] = cv2.VideoWriter(out, cv2.VideoWriter_fourcc(*"mp4v"), source_fps(dataset), (w, h))
        self.writers[path].write(im0)


def conf_default(opt):
    """{'conf_thres': its default} where the options take one and it was not given: 0.25, or 0.1 with --track, as
    Ultralytics' track sets it. ByteTrack's second association matches the boxes between track_low_thresh (0.1)
    and track_high_thresh (0.25) to the tracks the first one left; cut at 0.25 it got none (the synthetic video's
    ByteTrack MOTA 0.892 -> 0.866, HOTA 0.773 -> 0.748 on seed 0)."""
    if "conf_thres" not in {f.name for f in dataclasses.fields(opt)} or opt.conf_thres is not None:
        return {}
    return {"conf_thres": 0.1 if getattr(opt, "track", None) else 0.25}


def source_fps(dataset):
    """The frame rate of the video being read: its container's, or 30 where it says none, or one outside (0, 65535]
    (the most the saved video's mp4v timebase holds). A header's 2147483647 made the writer fail to open (no video
    saved, the run said saved) and the tracker keep every lost track for 2e9 frames."""
    cap = getattr(dataset, "cap", None)
    fps = cap.get(cv2.CAP_PROP_FPS) if cap is not None else 0
    return fps if math.isfinite(fps) and 0 < fps <= 65535 else 30


def _fps(dataset, vid_stride):
    """Frames a second the tracker sees: the video's (source_fps), over --vid-stride."""
    return source_fps(dataset) / max(1, vid_stride)


def can_show_windows():
    """Whether cv2.imshow can open a window here; warns once (per run) when it cannot, instead of failing later."""
    return window_problem("--view-img") is None
