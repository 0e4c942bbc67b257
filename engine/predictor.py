"""BasePredictor: load weights (.pt, .onnx, .torchscript), read a source (image, folder, glob, video, URL, webcam,
stream), run, draw and save results.

Task subclasses implement `postprocess` (raw model output -> per-image results) and `write_result`
(draw on the image, write the text file).
"""

from pathlib import Path
from types import SimpleNamespace

import cv2
import torch

from models.backend import InferenceBackend
from utils import dist as du
from utils.data.streams import open_source
from utils.files import increment_path
from utils.loggers import LOGGER
from utils.torch_utils import time_sync


class BasePredictor:
    default_project = "runs/detect"

    def __init__(self, args):
        self.args = args if isinstance(args, SimpleNamespace) else SimpleNamespace(**vars(args))
        self.device = du.select_device(self.args.device)
        half = bool(getattr(self.args, "half", False)) and self.device.type == "cuda"
        self.model = InferenceBackend(self.args.weights, device=self.device, half=half)
        self.half = self.model.fp16
        self.names = self.model.names
        self.stride = self.model.stride
        self.imgsz = self._input_size()
        project = Path(self.args.project or self.default_project)
        self.save_dir = increment_path(project / self.args.name, exist_ok=self.args.exist_ok)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        if self.args.save_txt:
            (self.save_dir / "labels").mkdir(exist_ok=True)
        self.writers = {}

    def _input_size(self):
        """--imgsz, or the one size a static export takes (h, w)."""
        if self.model.dynamic:
            return self.args.imgsz
        if (self.args.imgsz, self.args.imgsz) != self.model.imgsz:
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
        raise NotImplementedError

    def write_result(self, result, im, im0, path, txt_path):
        """Draw `result` on im0 (in place) and write its text line(s); return a summary string."""
        raise NotImplementedError

    @torch.no_grad()
    def __call__(self):
        dataset = self.load_source()
        results, dt, n = [], [0.0, 0.0, 0.0], 0
        for path, im, im0, desc in dataset:
            t0 = time_sync()
            x = self.preprocess(im)
            t1 = time_sync()
            preds = self.model(x)
            t2 = time_sync()
            result = self.postprocess(preds, x, im0)
            t3 = time_sync()
            dt = [dt[0] + t1 - t0, dt[1] + t2 - t1, dt[2] + t3 - t2]
            n += 1
            p = Path(path)
            stem = p.stem if dataset.mode == "image" else f"{p.stem}_{dataset.frame}"
            txt_path = self.save_dir / "labels" / f"{stem}.txt" if self.args.save_txt else None
            summary = self.write_result(result, x, im0, path, txt_path)
            self.save(dataset, path, im0)
            if self.args.view_img:
                cv2.imshow(str(p), im0)
                cv2.waitKey(1)
            LOGGER.info(f"{desc}{summary}, {(t2 - t1) * 1e3:.1f}ms")
            results.append(result)
        for w in self.writers.values():
            w.release()
        shape = (1, 3, *im.shape[-2:]) if n else None
        if n:
            LOGGER.info(
                f"Speed: {dt[0] * 1e3 / n:.1f}ms pre-process, {dt[1] * 1e3 / n:.1f}ms inference, "
                f"{dt[2] * 1e3 / n:.1f}ms post-process per image at shape {shape}"
            )
        if not self.args.nosave or self.args.save_txt:
            LOGGER.info(f"Results saved to {self.save_dir}")
        return results

    def save(self, dataset, path, im0):
        if self.args.nosave:
            return
        p = Path(path)
        if dataset.mode == "image":
            cv2.imwrite(str(self.save_dir / p.name), im0)
            return
        if path not in self.writers:
            cap = getattr(dataset, "cap", None)
            fps = cap.get(cv2.CAP_PROP_FPS) if cap is not None else 30
            h, w = im0.shape[:2]
            out = str((self.save_dir / p.name).with_suffix(".mp4"))
            self.writers[path] = cv2.VideoWriter(out, cv2.VideoWriter_fourcc(*"mp4v"), fps or 30, (w, h))
        self.writers[path].write(im0)
