"""Detection task: the trainer, validator and predictor hooks for YOLOv5/v7/v8 detectors."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from engine.messages import SCRIPTS, check_task
from engine.options import DetectTrainOptions
from engine.predictor import BasePredictor
from engine.trainer import BaseTrainer
from engine.validator import BaseValidator, ValOptions
from models.backend import InferenceBackend
from models.checkpoints import attempt_load, model_yaml, transfer_weights
from models.tta import TTAModel, augment_backend
from models.yolo import DetectionModel, head_task
from utils import ops
from utils.autoanchor import check_anchors
from utils.charts import plot_metric_curves
from utils.cli import check_imgsz
from utils.coco import box_to_coco_json, eval_coco_json, image_id_from_path, labels_to_coco_json
from utils.data.dataset_yaml import check_det_dataset, has_keypoints
from utils.data.detect_dataset import YOLODataset
from utils.data.image_weights import ImageWeightSampler
from utils.dist import get_rank, get_world_size
from utils.errors import BadDataset, BadOption
from utils.loggers import LOGGER
from utils.metrics import ConfusionMatrix, DetMetrics, iou_vector, process_batch
from utils.plots import colors, plot_images

MAX_PLOTTED_PREDS = 30  # per image in val_batch*_pred.jpg: the most confident, enough to judge a tile


def prediction_targets(boxes):
    """Per-image NMS outputs (n, 6+) xyxy conf cls -> plot_images rows (N, 7): image, cls, xywh pixels, conf."""
    rows = [torch.cat((torch.full_like(p[:, :1], i), p[:, 5:6], ops.xyxy2xywh(p[:, :4]), p[:, 4:5]), 1)
            for i, p in enumerate(boxes)]
    return torch.cat(rows).float() if rows else torch.zeros((0, 7))


def single_class(data):
    """The dataset dict for --single-cls: one class, named as the dataset's only class or else 'item' (YOLOv5's
    name); `label_names` keeps the classes the label files are read with, `label_nc` their count."""
    names = data["names"] if data["nc"] == 1 else {0: "item"}
    return {**data, "nc": 1, "names": names, "label_nc": data["nc"], "label_names": data["names"]}


def box_data(data, options, role, autodownload=True):
    """The dataset dict of a detection or segmentation run. A pose set is refused: its label lines (a box, then the
    keypoints) would be read as polygons, and their boxes made from those points. Refused before its data is
    generated or downloaded."""
    if has_keypoints(data):
        raise BadDataset(f"--data {data}: a pose dataset (it has kpt_shape); use {SCRIPTS['pose'][role]}")
    d = check_det_dataset(data, autodownload)
    return single_class(d) if options.single_cls else d


class DetectionTrainer(BaseTrainer):
    default_project = "runs/train"
    options = DetectTrainOptions

    def get_data(self):
        return box_data(self.opt.data, self.opt, "train", autodownload=not self.resume_from)

    @staticmethod
    def model_class():
        return DetectionModel

    def model_kwargs(self):
        """What the model class takes from the dataset besides nc (pose: kpt_shape)."""
        return {}

    def build_model(self, nc, names):
        """--cfg's model (a YAML, or a .pt's own model: what --weights without --cfg trains, engine/resume.py), seeded
        from --weights by key and shape."""
        if self.resume_from:  # the run's own model, whose weights restore() puts back: nothing the file names is read
            src, own, cfg = None, False, model_yaml(self.resume_from)
        else:
            src = attempt_load(self.opt.weights, device="cpu", fuse=False) if self.opt.weights else None
            own = self.opt.train_checkpoint_model
            cfg = src.yaml if own else model_yaml(self.opt.cfg)
        # the loss and the labels fit one kind of head
        check_task(head_task(cfg), (self.task,), f"--weights {self.opt.weights}" if own else f"--cfg {self.opt.cfg}",
                   "train")
        model = self.model_class()(cfg, nc=nc, **self.model_kwargs())
        model.names = dict(names)
        if src is not None:
            transfer_weights(model, src, self.opt.weights)
        return model

    def dataset_kwargs(self, mode):
        return {}

    def build_dataset(self, path, mode, stride):
        """The training set (the validation set comes from the validator's `build_dataset`)."""
        return YOLODataset(
            path,
            imgsz=self.opt.train_imgsz,
            batch_size=self.batch_size,
            augment=True,
            hyp=self.hyp,
            rect=self.opt.rect,
            cache=self.opt.cache,
            stride=stride,
            pad=0.0,
            prefix=f"{mode}: ",
            nc=self.data.get("label_nc", self.nc),  # the class ids the label files may hold
            names=self.data.get("label_names", self.names),  # what annotation files' class names are matched to
            single_cls=self.opt.single_cls,
            rank=get_rank(),
            world_size=get_world_size(),
            seed=self.opt.seed,
            device_hsv=self.device.type == "cuda",  # colour on the GPU: a third of a loader core's time per sample
            names_from=None if self.opt.skip_unknown_classes else self.data.get("yaml_file") or "the dataset dict",
            **self.dataset_kwargs(mode),
        )

    def fit_model_to_data(self):
        # a resumed run's anchors come with its weights (refitting them would desynchronise the YAML copy)
        if self.resume_from:
            return
        if not self.opt.noautoanchor:
            check_anchors(self.model, self.train_set.labels, self.hyp, self.opt.train_imgsz)
        elif isinstance(self.model.yaml.get("anchors"), int):  # `anchors: 3` (yolov5-p2, -p7): placeholders 0..5 px
            raise BadOption(f"--noautoanchor: {self.opt.cfg or self.opt.weights} says `anchors: "
                            f"{self.model.yaml['anchors']}`, anchors that autoanchor computes from the labels; train "
                            "it without --noautoanchor")

    def train_sampler(self):
        if not self.opt.image_weights:
            return None
        if self.opt.rect:
            raise BadOption("--image-weights cannot be combined with --rect (rect batches are fixed neighbours)")
        return ImageWeightSampler([lb["cls"] for lb in self.train_set.labels], self.nc, self.world_size, self.rank,
                                  self.opt.seed, maps_fn=self._class_maps)

    def _class_maps(self):
        """Per-class mAP50-95 of the last validation (rank 0), zeros before the first one."""
        metrics = self.validator.metrics
        return metrics.maps(self.nc) if metrics is not None else np.zeros(self.nc)

    def build_validator(self):
        options = ValOptions.from_train(self.opt, self.batch_size * 2, single_cls=self.opt.single_cls)
        return DetectionValidator(options, self.save_dir, self.names, criterion=self.criterion,
                                  label_names=self.data.get("label_names"))

    def plot_training_batch(self, batch, step):
        if step < 3:
            plot_images(batch["img"], batch["targets"], batch["paths"], self.save_dir / f"train_batch{step}.jpg",
                        self.names, masks=batch.get("masks"), overlap=batch.get("overlap"),
                        keypoints=batch.get("keypoints"))


class DetectionValidator(BaseValidator):
    """mAP50 and mAP50-95 with per-threshold matching, in original-image coordinates as the official validators."""

    postprocess_name = "NMS"

    def __init__(self, args, save_dir, names, criterion=None, label_names=None):
        super().__init__(args, save_dir, names, criterion, label_names)
        self.iouv = iou_vector()
        self.layout = None  # the model's output_layout, read by init_metrics
        # the last validation's: every image's matches (for inspection), COCO JSON rows, whether any image had a
        # prediction, labels per class
        self.records, self.jdict, self.has_preds, self.nt_per_class = {}, [], False, None

    @staticmethod
    def get_data(data, options):
        return box_data(data, options, "val")

    def dataset_kwargs(self):
        return {}

    def build_dataset(self, path, stride):
        return YOLODataset(path, imgsz=self.args.imgsz, batch_size=self.args.batch, augment=False, rect=True,
                           stride=stride, pad=0.5, prefix="val: ", nc=self.label_nc,
                           names=self.label_names, single_cls=self.args.single_cls, names_from=self.args.names_from,
                           **self.dataset_kwargs())

    def init_metrics(self, model):
        self.metrics = DetMetrics(names=self.names)
        self.confusion = ConfusionMatrix(nc=self.nc)  # at its own conf 0.25: val's 0.001 floods the background row
        self.layout = model.output_layout

    def description(self):
        return ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")

    def postprocess(self, preds, batch):
        """One record per image: `boxes` (n, 6 + nm) xyxy input pixels, conf, cls (and mask coefficients)."""
        boxes = ops.non_max_suppression(
            preds,
            conf_thres=self.args.conf,
            iou_thres=self.args.iou,
            multi_label=True,
            max_det=self.args.max_det,
            layout=self.layout,
        )  # no time limit: dropping the images left when it runs out would bias mAP (max_nms bounds the work)
        return [{"boxes": b} for b in boxes]

    def loss_inputs(self, preds):
        return self.layout.train_output(preds)

    def _labels_native(self, batch, si):
        """Labels of image si as (cls (n,), xyxy boxes (n, 4)) in original-image pixels."""
        t = batch["targets"][batch["targets"][:, 0] == si]
        h, w = batch["img"].shape[2:]
        boxes = ops.xywh2xyxy(t[:, 2:6]) * torch.tensor((w, h, w, h), device=t.device)
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_boxes((h, w), boxes, shape, ratio_pad=ratio_pad)
        return t[:, 1], boxes

    def _native_preds(self, pred, batch, si):
        predn = pred.clone()
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_boxes(batch["img"].shape[2:], predn[:, :4], shape, ratio_pad=ratio_pad)
        return predn

    def new_record(self):
        return {"tp": [], "conf": [], "pred_cls": [], "target_cls": [], "json": []}

    def update_metrics(self, preds, batch):
        """The matches of each image, on the CPU: its labels are there (`preprocess`), and its predictions come over
        in one copy; what is matched on the device (masks) stays there in `decode` and `match_extra`."""
        record = self.new_record()
        for si, image in enumerate(preds):
            self.seen += 1
            cls, tboxes = self._labels_native(batch, si)
            record["target_cls"].append(cls)
            labelsn = torch.cat([cls[:, None], tboxes], 1)
            if len(image["boxes"]) == 0:
                if len(cls):
                    self.confusion.process_batch(None, labelsn)
                continue
            image = self.decode(image, batch)
            predn = self._native_preds(image["boxes"].cpu(), batch, si)
            correct = process_batch(predn[:, :6], labelsn, self.iouv)
            self.match_extra(record, image, batch, si, predn, labelsn, correct)
            record["tp"].append(correct)
            record["conf"].append(predn[:, 4])
            record["pred_cls"].append(predn[:, 5])
            self.confusion.process_batch(predn[:, :6], labelsn)
            path = Path(batch["paths"][si])
            if self.args.save_txt:
                self.save_txt(predn, batch["shapes"][si][0], self.save_dir / "labels" / f"{path.stem}.txt")
            if self.args.save_json:
                record["json"] += self.pred_to_json(image, predn, batch, si)
        return record

    def decode(self, image, batch):
        """Hook for subclasses: image's record with what its matching needs and postprocess left undone
        (segmentation: its masks)."""
        return image

    def match_extra(self, record, image, batch, si, predn, labelsn, correct):
        """Hook for subclasses: matches beyond the boxes' `correct` for image si's predictions `image` (segmentation
        adds its masks', pose its keypoints'); `predn` (its rows) and `labelsn` (cls, xyxy) in original-image pixels,
        as the box matching used them."""

    def save_txt(self, predn, shape, file):
        file.parent.mkdir(parents=True, exist_ok=True)
        h, w = shape
        xywhn = ops.xyxy2xywh(predn[:, :4]) / torch.tensor((w, h, w, h), device=predn.device)
        with open(file, "a") as f:
            for (cx, cy, bw, bh), conf, c in zip(xywhn.tolist(), predn[:, 4].tolist(), predn[:, 5].tolist()):
                f.write(f"{int(c)} {cx:.6g} {cy:.6g} {bw:.6g} {bh:.6g} {conf:.6g}\n")

    def pred_to_json(self, image, predn, batch, si):
        """COCO JSON rows of image si's predictions (`predn`: its boxes in original-image pixels)."""
        return box_to_coco_json(predn[:, :6], image_id_from_path(Path(batch["paths"][si])))

    def _concat_stats(self, records):
        out = {}
        for k in ("tp", "conf", "pred_cls", "target_cls"):
            v = records.get(k, [])
            out[k] = torch.cat(v).numpy() if v else np.zeros((0, 10) if k == "tp" else 0)
        return out

    def get_stats(self, records):
        self.records = records  # every image's matches, kept for inspection
        self.jdict = records.get("json", [])
        self.has_preds = bool(records.get("tp"))
        stats = self._concat_stats(records)
        self.nt_per_class = np.bincount(stats["target_cls"].astype(int), minlength=self.nc)
        if self.has_preds:  # at least one image had predictions
            self.metrics.process(**stats)
        return dict(self.metrics.results_dict)

    def print_results(self, final=False):
        pf = "%22s" + "%11i" * 2 + "%11.3g" * len(self.metrics.mean_results())  # box, or box + mask columns
        LOGGER.info(pf % ("all", self.seen, self.nt_per_class.sum(), *self.metrics.mean_results()))
        if self.nt_per_class.sum() == 0:
            LOGGER.warning("no labels found in the validation set: metrics cannot be computed")
        if final and self.nc > 1:
            for row in self.class_table()[1]:
                LOGGER.info(pf % tuple(row))
        if final:
            self.print_speed((1, 3, self.args.imgsz, self.args.imgsz))

    def class_table(self):
        """class, images, instances, then the metrics under their results.csv names, for each class predicted."""
        columns = ["class", "images", "instances", *self.metrics.keys]
        if not self.has_preds:
            return columns, []
        rows = [[self.names[c], self.seen, int(self.nt_per_class[c]), *self.metrics.class_result(i)]
                for i, c in enumerate(self.metrics.ap_class_index)]
        return columns, rows

    def plot_metrics(self):
        names = list(self.names.values())
        for normalize in (False, True):
            self.confusion.plot(save_dir=self.save_dir, names=names, normalize=normalize)
        for prefix, metric in self.curve_metrics():
            if metric.curves is not None:  # None when no image had a prediction
                plot_metric_curves(metric.curves, self.names, self.save_dir, prefix)

    def curve_metrics(self):
        """(file prefix, Metric) pairs whose curves are plotted."""
        return [("", self.metrics.box)]

    def plot_val_batch(self, batch, preds, bi):
        plot_images(batch["img"], batch["targets"], batch["paths"], self.save_dir / f"val_batch{bi}_labels.jpg",
                    self.names, masks=batch.get("masks"), overlap=batch.get("overlap"),
                    keypoints=batch.get("keypoints"))
        boxes = [image["boxes"][:MAX_PLOTTED_PREDS] for image in preds]
        plot_images(batch["img"], prediction_targets(boxes), batch["paths"], self.save_dir / f"val_batch{bi}_pred.jpg",
                    self.names, masks=self.plotted_pred_masks(preds, batch), overlap=False,
                    keypoints=self.plotted_pred_keypoints(boxes))

    def plotted_pred_masks(self, preds, batch):
        """Masks (N, H, W) of the plotted predictions, in prediction_targets' order (segmentation); None for boxes
        only."""
        return None

    def plotted_pred_keypoints(self, boxes):
        """Keypoints (N, K, ndim) in input pixels of the plotted NMS rows `boxes` (per image), in prediction_targets'
        order (pose); None for boxes only."""
        return None

    @classmethod
    def adapt_to_weights(cls, model, stride, options, opt):
        """--img rounded up to the stride; --augment wraps the model for test-time augmentation."""
        if opt.augment:
            if isinstance(model, InferenceBackend):
                raise BadOption(f"--augment needs .pt weights: {opt.weights} takes one input size per pass")
            model = TTAModel(model)
        return model, dataclasses.replace(options, imgsz=check_imgsz(options.imgsz, stride))

    def finalize(self, stats):
        if not (self.args.save_json and self.jdict):
            return stats
        pred_json = self.save_dir / "predictions.json"
        pred_json.write_text(json.dumps(self.jdict))
        LOGGER.info(f"Saved {len(self.jdict)} predictions to {pred_json}")
        return self.coco_eval(stats, pred_json)

    def coco_eval(self, stats, pred_json, iou_type="bbox", key="B", **kwargs):
        """pycocotools mAP on the same predictions, against the dataset's labels written as COCO JSON; `kwargs` go to
        eval_coco_json (pose: kpt_sigmas)."""
        anno_json = self.save_dir / "annotations.json"
        anno_json.write_text(json.dumps(labels_to_coco_json(self.dataloader.dataset, self.names)))
        try:
            m, m50 = eval_coco_json(anno_json, pred_json, iou_type=iou_type, **kwargs)
        except ImportError as e:
            LOGGER.warning(f"pycocotools unavailable, skipping COCO evaluation: {e}")
            return stats
        LOGGER.info(f"pycocotools {iou_type}: mAP50-95 {m:.4f}, mAP50 {m50:.4f}")
        stats[f"coco/mAP50-95({key})"], stats[f"coco/mAP50({key})"] = m, m50
        return stats


class DetectionPredictor(BasePredictor):
    default_project = "runs/detect"

    def __init__(self, args):
        super().__init__(args)
        if self.args.augment:
            augment_backend(self.model)

    def postprocess(self, preds, im, im0):
        det = ops.non_max_suppression(
            preds, self.args.conf_thres, self.args.iou_thres, self.args.classes, self.args.agnostic_nms,
            max_det=self.args.max_det, layout=self.model.output_layout,
        )[0]
        ops.scale_boxes(im.shape[2:], det[:, :4], im0.shape)
        return det

    def boxes(self, det):
        return [(xyxy, int(c), conf) for *xyxy, conf, c in det[:, :6].tolist()]

    def write_result(self, det, im, im0, path, txt_path):
        annotator = self.annotator(im0)
        counts = {}
        for *xyxy, conf, c in reversed(det.tolist()):
            c = int(c)
            counts[c] = counts.get(c, 0) + 1
            annotator.box_label(xyxy, self.label(c, conf), color=colors(c, True))
            if txt_path is not None:
                h, w = im0.shape[:2]
                cx, cy, bw, bh = ((xyxy[0] + xyxy[2]) / 2 / w, (xyxy[1] + xyxy[3]) / 2 / h,
                                  (xyxy[2] - xyxy[0]) / w, (xyxy[3] - xyxy[1]) / h)
                line = f"{c} {cx:.6g} {cy:.6g} {bw:.6g} {bh:.6g}" + (f" {conf:.6g}" if self.args.save_conf else "")
                with open(txt_path, "a") as f:
                    f.write(line + "\n")
        im0[:] = annotator.result()
        return ", ".join(f"{n} {self.names[c]}" for c, n in counts.items()) or "(no detections)"
