"""The box tasks' trainer, validator and predictor (detect, segment, pose: every model ending in a box head), each
reading its task's record (engine/tasks/__init__.py: `record`) for what differs: the model class, the fields, the
label format, the dataset check and the options."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from data.dataset_yaml import check_det_dataset, check_pose_dataset, has_keypoints, pose_skeleton
from data.detect_dataset import YOLODataset
from data.image_weights import ImageWeightSampler
from engine.messages import SCRIPTS, check_task
from engine.predictor import BasePredictor
from engine.track import FrameTracker
from engine.trainer import BaseTrainer
from engine.validator import BaseValidator
from evaluation.charts import plot_metric_curves
from evaluation.coco import eval_coco_json, labels_to_coco_json
from evaluation.fields import (
    MAX_PLOTTED_PREDS,
    Letterbox,
    Predictions,
    in_original_pixels,
    plotted_labels,
    txt_lines,
)
from evaluation.metrics import ConfusionMatrix, DetMetrics, iou_vector
from evaluation.plots import plot_images
from evaluation.results import nms_iou
from models.autoanchor import check_anchors
from models.backend import InferenceBackend
from models.checkpoints import attempt_load, model_yaml, transfer_weights
from models.tta import TTAModel, augment_backend
from models.yolo import head_task
from utils import ops
from utils.cli import check_imgsz
from utils.dist import get_rank, get_world_size
from utils.errors import BadCheckpoint, BadDataset, BadOption
from utils.log import LOGGER
from utils.ops import CLS, CONF


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


def pose_data(data, options, role, autodownload=True):
    """The dataset dict of a pose run: kpt_shape, flip_idx and skeleton checked (data/dataset_yaml.py)."""
    d = check_pose_dataset(data, autodownload)
    return single_class(d) if options.single_cls else d


# COCO's person skeleton (0-based keypoint pairs), drawn for 17 keypoints when the dataset gives none
COCO_SKELETON = [[15, 13], [13, 11], [16, 14], [14, 12], [11, 12], [5, 11], [6, 12], [5, 6], [5, 7], [6, 8], [7, 9],
                 [8, 10], [1, 2], [0, 1], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]]


def pose_skeleton_of(data, k):
    """The keypoint pairs drawn for `k` keypoints: the `skeleton` of the dataset YAML `data` when given, else COCO's
    for 17 keypoints."""
    skeleton = pose_skeleton(data, k) if data else None
    if skeleton is None and k == 17:
        return COCO_SKELETON
    return skeleton


class BoxTrainer(BaseTrainer):
    """Training of a box task; `record` (the task's, engine/tasks/__init__.py) is set on the class each task binds."""

    record = None

    def get_data(self):
        return self.record.data(self.opt.data, self.opt, "train", autodownload=not self.resume_from)

    def build_model(self, nc, names, resumed=None):
        """--cfg's model (a YAML, or a .pt's own model: what --weights without --cfg trains, engine/resume.py), seeded
        from --weights by key and shape."""
        if resumed is not None:  # the run's own model, whose weights restore() puts back
            src, own, cfg = None, False, resumed
        else:
            src = attempt_load(self.opt.weights, device="cpu", fuse=False) if self.opt.weights else None
            own = self.opt.train_checkpoint_model
            cfg = src.yaml if own else model_yaml(self.opt.cfg)
        # the loss and the labels fit one kind of head
        check_task(head_task(cfg), (self.task,), f"--weights {self.opt.weights}" if own else f"--cfg {self.opt.cfg}",
                   "train")
        model = self.record.model(cfg, nc=nc, **self.record.model_kwargs(self.data))
        model.names = dict(names)
        return model, (None if src is None else transfer_weights(model, src, self.opt.weights))

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
            task=self.record.train_labels(self.opt, self.data),
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

    def preprocess_batch(self, batch):
        batch = super().preprocess_batch(batch)
        if "masks" in batch:  # a segmentation batch's overlap maps come as integers
            batch["masks"] = batch["masks"].float()
        return batch

    def build_validator(self):
        options = self.record.val.from_train(self.opt, self.batch_size * 2, **self.record.val_extras(self.opt,
                                                                                                    self.data))
        return self.record.validator(options, self.save_dir, self.names, criterion=self.criterion,
                                     label_names=self.data.get("label_names"))

    def plot_training_batch(self, batch, step):
        if step < 3:
            rows, angles = plotted_labels(batch["targets"])
            plot_images(batch["img"], rows, batch["paths"], self.save_dir / f"train_batch{step}.jpg", self.names,
                        masks=batch.get("masks"), overlap=batch.get("overlap"), keypoints=batch["targets"].keypoints,
                        angles=angles)


class BoxValidator(BaseValidator):
    """mAP50 and mAP50-95 with per-threshold matching, in original-image coordinates as the official validators, of
    each field the task's record declares for the model's output layout (evaluation/fields.py)."""

    postprocess_name = "NMS"
    record = None  # the task's (engine/tasks/__init__.py), set on the class each task binds

    def __init__(self, args, save_dir, names, criterion=None, label_names=None):
        super().__init__(args, save_dir, names, criterion, label_names)
        self.iouv = iou_vector()
        self.fields = ()  # what the model predicts of each object, boxes first: init_metrics reads its layout
        self.layout = None  # the model's output_layout, read by init_metrics
        # the last validation's: every image's matches (for inspection), COCO JSON rows, whether any image had a
        # prediction, labels per class
        self.records, self.jdict, self.has_preds, self.nt_per_class = {}, [], False, None

    @classmethod
    def get_data(cls, data, options):
        return cls.record.data(data, options, "val")

    @classmethod
    def val_names(cls, data, model, options):
        """The dataset's names (BaseValidator.val_names); a dataset with keypoints must have the model's kpt_shape."""
        names = super().val_names(data, model, options)
        if "kpt_shape" in data and tuple(model.output_layout.kpt_shape or ()) != tuple(data["kpt_shape"]):
            raise BadCheckpoint(f"--weights {options.weights} predicts kpt_shape "
                                f"{list(model.output_layout.kpt_shape or ())} but --data {options.data} has "
                                f"{data['kpt_shape']}")
        return names

    def build_dataset(self, path, stride, rect=True):
        return YOLODataset(path, imgsz=self.args.imgsz, batch_size=self.args.batch, augment=False, rect=rect,
                           stride=stride, pad=0.5, prefix="val: ", nc=self.label_nc,
                           names=self.label_names, single_cls=self.args.single_cls, names_from=self.args.names_from,
                           task=self.record.val_labels(self.args))

    def init_metrics(self, model):
        self.layout = model.output_layout
        self.fields = self.record.fields(self.names, self.layout)
        self.metrics = DetMetrics(names=self.names, parts=[(f.metric, f.suffix) for f in self.fields])
        # at its own conf 0.25 (val's 0.001 floods the background row), overlaps as the first field measures them
        self.confusion = ConfusionMatrix(nc=self.nc, iou=self.fields[0].pair_iou)

    def description(self):
        columns = ("P", "R", "mAP50", "mAP50-95")
        if len(self.fields) > 1:  # each field's columns under its title
            columns = [c for f in self.fields for c in (f"{f.title}(P", "R", "mAP50", "mAP50-95)")]
        return ("%22s" + "%11s" * (2 + len(columns))) % ("Class", "Images", "Instances", *columns)

    def postprocess(self, preds, batch):
        """One record per image (evaluation/fields.Predictions): its NMS rows (n, 6 + nm + nk), xyxy input pixels, conf,
        cls and the columns after the class scores; and its prototypes where the model has them."""
        det, protos = self.layout.split(preds)
        boxes = ops.non_max_suppression(
            det,
            conf_thres=self.args.conf,
            iou_thres=self.args.iou,
            multi_label=True,
            max_det=self.args.max_det,
            layout=self.layout,
        )  # no time limit: dropping the images left when it runs out would bias mAP (max_nms bounds the work)
        return [Predictions(b, proto=None if protos is None else protos[i]) for i, b in enumerate(boxes)]

    def loss_inputs(self, preds):
        return self.layout.train_output(preds)

    def update_metrics(self, preds, batch):
        """The matches of each image, on the CPU: its labels are there (`preprocess`), and its predictions come over
        in one copy; what is matched on the device (masks) stays there in the fields' `decode` and `match`."""
        record = {k: [] for k in ("conf", "pred_cls", "target_cls", "json", *(f.key for f in self.fields))}
        for si, image in enumerate(preds):
            self.seen += 1
            labels = self.fields[0].labels(batch, si)  # cls and the first field's geometry
            record["target_cls"].append(labels[:, 0])
            image = Predictions.of(image)
            if len(image.boxes) == 0:
                if len(labels):
                    self.confusion.process_batch(None, labels)
                continue
            self.match_image(record, image, labels, batch, si)
        return record

    def match_image(self, record, image, labels, batch, si):
        """Image si's matches and rows into `record`, where it has predictions: each field decodes on the device, the
        rows come to the CPU once, each field scales its columns back and matches."""
        fit = Letterbox.of_batch(batch, si)
        for f in self.fields:
            image = f.decode(image, fit)
        native = image.boxes.cpu().clone()
        for f in self.fields:
            f.scale(native, fit)
        for f in self.fields:
            record[f.key].append(f.match(image, native, labels, batch, si, self.iouv) if len(labels)
                                 else torch.zeros((len(native), len(self.iouv)), dtype=torch.bool))
        record["conf"].append(native[:, CONF])
        record["pred_cls"].append(native[:, CLS])
        self.confusion.process_batch(native, labels)  # whole rows: an oriented box's angle is the last column
        if self.args.save_txt:
            file = self.save_dir / "labels" / f"{Path(batch['paths'][si]).stem}.txt"
            self.save_txt(native, batch["shapes"][si][0], file)
        if self.args.save_json:
            record["json"] += self.pred_to_json(image, native, batch, si)

    def save_txt(self, native, shape, file):
        """Image si's --save-txt lines: cls, each field's values normalised to the image, conf."""
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(file, "a") as f:
            f.writelines(txt_lines(native, torch.cat([f.txt_columns(native, shape) for f in self.fields], 1).tolist()))

    def pred_to_json(self, image, native, batch, si):
        """COCO JSON rows of image si's predictions: each field adds its values (`native`: its rows in
        original-image pixels)."""
        rows = []
        for f in self.fields:
            rows = f.to_json(rows, image, native, batch, si)
        return rows

    def get_stats(self, records):
        self.records = records  # every image's matches, kept for inspection
        self.jdict = records.get("json", [])
        self.has_preds = bool(records.get("conf"))
        conf, pred_cls, target_cls = (torch.cat(records[k]).numpy() if records.get(k) else np.zeros(0)
                                      for k in ("conf", "pred_cls", "target_cls"))
        self.nt_per_class = np.bincount(target_cls.astype(int), minlength=self.nc)
        if self.has_preds:  # at least one image had predictions
            self.metrics.process(*(torch.cat(records[f.key]).numpy() for f in self.fields), conf, pred_cls, target_cls)
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
        for f in self.fields:
            metric = getattr(self.metrics, f.metric)
            if metric.curves is not None:  # None when no image had a prediction
                plot_metric_curves(metric.curves, self.names, self.save_dir, f.curve)

    def plot_val_batch(self, batch, preds, bi):
        rows, angles = plotted_labels(batch["targets"])
        plot_images(batch["img"], rows, batch["paths"], self.save_dir / f"val_batch{bi}_labels.jpg",
                    self.names, masks=batch.get("masks"), overlap=batch.get("overlap"),
                    keypoints=batch["targets"].keypoints, angles=angles)
        drawn = {"masks": None, "keypoints": None, "angles": None}
        for f in self.fields:
            drawn.update(f.plot_kwargs(preds, batch))
        boxes = [image.boxes[:MAX_PLOTTED_PREDS] for image in preds]
        plot_images(batch["img"], self.fields[0].plotted(boxes), batch["paths"],
                    self.save_dir / f"val_batch{bi}_pred.jpg", self.names, overlap=False, **drawn)

    @classmethod
    def adapt_to_weights(cls, model, stride, options):
        """--img rounded up to the stride; --augment wraps the model for test-time augmentation."""
        if options.augment:
            if isinstance(model, InferenceBackend):
                raise BadOption(f"--augment needs .pt weights: {options.weights} takes one input size per pass")
            model = TTAModel(model)
        return model, dataclasses.replace(options, imgsz=check_imgsz(options.imgsz, stride))

    def finalize(self, stats):
        if not (self.args.save_json and self.jdict):
            return stats
        pred_json = self.write_predictions()
        LOGGER.info(f"Saved {len(self.jdict)} predictions to {pred_json}")
        for f in self.fields:
            if f.iou_type:  # pycocotools has no rotated boxes
                stats = self.coco_eval(stats, pred_json, f.iou_type, f.suffix, **f.coco_kwargs(self.args))
        return stats

    def write_predictions(self):
        """The COCO result rows of the last validation as save_dir/predictions.json; returns its path."""
        pred_json = self.save_dir / "predictions.json"
        pred_json.write_text(json.dumps(self.jdict))
        return pred_json

    def coco_eval(self, stats, pred_json, iou_type="bbox", key="B", **kwargs):
        """pycocotools mAP on the same predictions, against the dataset's labels written as COCO JSON; `kwargs` go to
        eval_coco_json (a field's `coco_kwargs`)."""
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


class BoxPredictor(BasePredictor):
    """Prediction of a box task: NMS, then each field of the task's record (`record`, set on the class each task
    binds) in original-image pixels."""

    record = None

    def __init__(self, args):
        super().__init__(args)
        if self.args.augment:
            augment_backend(self.model)

    def check_args(self):
        unknown = [c for c in self.args.classes or [] if c not in self.names]
        if unknown:  # NMS would keep nothing of them, without a word
            raise BadOption(f"--classes {' '.join(map(str, unknown))}: {self.args.weights} has classes "
                            f"0-{len(self.names) - 1} only")

    def make_tracker(self):
        return FrameTracker(self.args.track, rotated=self.model.output_layout.angle) if self.args.track else None

    def declare_fields(self):
        layout = self.model.output_layout
        return self.record.fields(self.names, layout, self.record.skeleton(self.args, layout))

    def postprocess(self, preds, im, im0):
        """The image's record in original-image pixels: its NMS rows (xyxy, conf, cls, the columns after the class
        scores) and what each field adds of its own (masks at the image's size)."""
        layout = self.model.output_layout
        det, protos = layout.split(preds)
        iou = nms_iou(layout) if self.args.iou_thres is None else self.args.iou_thres  # None: the family's
        rows = ops.non_max_suppression(
            det, self.args.conf_thres, iou, self.args.classes, self.args.agnostic_nms,
            max_det=self.args.max_det, layout=layout,
        )[0]
        return in_original_pixels(self.fields, rows, None if protos is None else protos[0],
                                  Letterbox.placed(im.shape[2:], im0.shape))
