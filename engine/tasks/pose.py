"""Pose task: the detection hooks plus keypoints (YOLOv8-pose). kpt_shape, flip_idx and skeleton come from the dataset
YAML (utils/data/dataset_yaml.check_pose_dataset); the head declares its keypoint columns (OutputLayout.kpt_shape)."""

from pathlib import Path

import torch

from engine.tasks.detect import DetectionPredictor, DetectionTrainer, DetectionValidator, single_class
from engine.validator import ValOptions
from models.yolo import PoseModel
from utils import ops
from utils.coco import image_id_from_path, keypoints_to_coco_json
from utils.data.dataset_yaml import check_pose_dataset, pose_skeleton
from utils.data.label_formats import PoseLabels
from utils.errors import BadCheckpoint
from utils.metrics import PoseMetrics, keypoint_sigmas, process_keypoint_batch

# COCO's person skeleton (0-based keypoint pairs), drawn for 17 keypoints when the dataset gives none
COCO_SKELETON = [[15, 13], [13, 11], [16, 14], [14, 12], [11, 12], [5, 11], [6, 12], [5, 6], [5, 7], [6, 8], [7, 9],
                 [8, 10], [1, 2], [0, 1], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]]


def keypoint_txt_lines(det, kpts, shape, conf):
    """--save-txt lines of detections `det` (n, 6+: xyxy, conf, cls in pixels of an image of `shape` (h, w)) and their
    keypoints `kpts` (n, K, ndim): `cls cx cy w h` + K keypoints `x y [v]`, normalised, + conf when `conf`. The val
    and predict scripts write the same lines (val with conf)."""
    h, w = shape
    xywhn = ops.xyxy2xywh(det[:, :4]) / torch.tensor((w, h, w, h), device=det.device)
    kptsn = kpts / torch.tensor([w, h, 1][: kpts.shape[-1]], device=kpts.device)
    return [f"{int(c)} " + " ".join(f"{v:.6g}" for v in box + k) + (f" {p:.6g}" if conf else "") + "\n"
            for box, k, (p, c) in zip(xywhn.tolist(), kptsn.flatten(1).tolist(), det[:, 4:6].tolist())]


def pose_data(data, options, autodownload=True):
    data = check_pose_dataset(data, autodownload)
    return single_class(data) if options.single_cls else data


class PoseTrainer(DetectionTrainer):
    default_project = "runs/train-pose"
    task = "pose"

    def get_data(self):
        return pose_data(self.opt.data, self.opt, autodownload=not self.resume_from)

    @staticmethod
    def model_class():
        return PoseModel

    def model_kwargs(self):
        return {"kpt_shape": self.data["kpt_shape"]}

    def dataset_kwargs(self, mode):
        return {"task": PoseLabels(self.data["kpt_shape"], self.data["flip_idx"])}

    def build_validator(self):
        options = ValOptions.from_train(self.opt, self.batch_size * 2, single_cls=self.opt.single_cls)
        return PoseValidator(options, self.save_dir, self.names, criterion=self.criterion,
                             label_names=self.data.get("label_names"), kpt_shape=self.data["kpt_shape"])


class PoseValidator(DetectionValidator):
    """Box and keypoint mAP; keypoints matched by OKS (utils/metrics.keypoint_oks) in original-image pixels, with the
    label's box area x 0.53 as its scale, as the official validator."""

    tasks = ("pose",)

    def __init__(self, args, save_dir, names, criterion=None, label_names=None, kpt_shape=(17, 3)):
        super().__init__(args, save_dir, names, criterion, label_names)
        self.kpt_shape = tuple(kpt_shape)
        self.sigmas = keypoint_sigmas(self.kpt_shape[0])

    @staticmethod
    def get_data(data, options):
        return pose_data(data, options)

    @staticmethod
    def data_kwargs(data):
        return {"kpt_shape": data["kpt_shape"]}

    @classmethod
    def val_names(cls, data, model, opt):
        names = super().val_names(data, model, opt)
        shape = tuple(model.output_layout.kpt_shape)
        if shape != tuple(data["kpt_shape"]):
            raise BadCheckpoint(f"--weights {opt.weights} predicts kpt_shape {list(shape)} but --data {opt.data} has "
                                f"{data['kpt_shape']}")
        return names

    def dataset_kwargs(self):
        return {"task": PoseLabels(self.kpt_shape)}

    def init_metrics(self, model):
        super().init_metrics(model)
        self.metrics = PoseMetrics(names=self.names)

    def new_record(self):
        return {**super().new_record(), "tp_p": []}

    def description(self):
        return ("%22s" + "%11s" * 10) % (
            "Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)", "Pose(P", "R", "mAP50", "mAP50-95)",
        )

    def _native_keypoints(self, kpts, batch, si):
        """Keypoints (n, K, ndim) in input pixels -> original-image pixels (a copy)."""
        kpts = kpts.clone().float()
        shape, ratio_pad = batch["shapes"][si]
        ops.scale_coords(batch["img"].shape[2:], kpts[..., :2], shape, ratio_pad=ratio_pad)
        return kpts

    def _gt_keypoints(self, batch, si):
        """Labels of image si: keypoints (m, K, 3) in original-image pixels, visibility 0 where not labelled."""
        kpts = batch["keypoints"][batch["targets"][:, 0] == si].clone()
        h, w = batch["img"].shape[2:]
        kpts[..., 0] *= w
        kpts[..., 1] *= h
        return self._native_keypoints(kpts, batch, si)

    def _native_preds(self, pred, batch, si):
        """NMS rows in original-image pixels, the keypoint columns included."""
        predn = super()._native_preds(pred, batch, si)
        kpts = self._native_keypoints(self.layout.det_keypoints(pred), batch, si)
        predn[:, 6 + self.layout.nm :] = kpts.flatten(1)  # after xyxy, conf, cls (and mask coefficients)
        return predn

    def match_extra(self, record, image, batch, si, predn, labelsn, correct):
        """Keypoint matches of image si by OKS, in the same rows as its box matches (`correct`)."""
        if len(labelsn):
            tp_p = process_keypoint_batch(predn[:, :6], labelsn, self.layout.det_keypoints(predn),
                                          self._gt_keypoints(batch, si), self.sigmas, self.iouv)
        else:
            tp_p = torch.zeros_like(correct)
        record["tp_p"].append(tp_p)

    def save_txt(self, predn, shape, file):
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(file, "a") as f:
            f.writelines(keypoint_txt_lines(predn, self.layout.det_keypoints(predn), shape, conf=True))

    def pred_to_json(self, image, predn, batch, si):
        """Boxes and keypoints in original-image pixels, as COCO keypoint results."""
        kpts = self.layout.det_keypoints(predn)
        path = Path(batch["paths"][si])
        return keypoints_to_coco_json(predn[:, :6].cpu(), kpts.cpu(), image_id_from_path(path))

    def curve_metrics(self):
        return [("", self.metrics.box), ("Pose", self.metrics.pose)]

    def plotted_pred_keypoints(self, boxes):
        kpts = [self.layout.det_keypoints(b) for b in boxes]
        return torch.cat(kpts).float() if kpts else None

    def _concat_stats(self, records):
        out = super()._concat_stats(records)
        tp_p = records.get("tp_p", [])
        # the names PoseMetrics.process takes
        out["tp_box"], out["tp_pose"] = out.pop("tp"), torch.cat(tp_p).numpy() if tp_p else out["tp"][:0]
        return out

    def finalize(self, stats):
        stats = super().finalize(stats)
        if self.args.save_json and self.jdict:
            stats = self.coco_eval(stats, self.save_dir / "predictions.json", iou_type="keypoints", key="P",
                                   kpt_sigmas=self.sigmas, max_dets=self.args.max_det)
        return stats


class PosePredictor(DetectionPredictor):
    """Boxes with keypoints and the skeleton drawn: the `skeleton` of --data when given, COCO's for 17 keypoints."""

    tasks = ("pose",)
    default_project = "runs/predict-pose"

    def __init__(self, args):
        super().__init__(args)
        self.kpt_shape = tuple(self.model.output_layout.kpt_shape)
        self.skeleton = self._skeleton(getattr(self.args, "data", None))

    def _skeleton(self, data):
        skeleton = pose_skeleton(data, self.kpt_shape[0]) if data else None
        if skeleton is None and self.kpt_shape[0] == 17:
            return COCO_SKELETON
        return skeleton

    def postprocess(self, preds, im, im0):
        """(n, 6 + K * ndim) rows in im0 pixels: xyxy, conf, cls, keypoints."""
        layout = self.model.output_layout
        det = ops.non_max_suppression(
            preds, self.args.conf_thres, self.args.iou_thres, self.args.classes, self.args.agnostic_nms,
            max_det=self.args.max_det, layout=layout,
        )[0]
        kpts = layout.det_keypoints(det)
        ops.scale_coords(im.shape[2:], kpts[..., :2], im0.shape)
        ops.scale_boxes(im.shape[2:], det[:, :4], im0.shape)
        return torch.cat([det[:, :6], kpts.flatten(1)], 1)

    def write_result(self, det, im, im0, path, txt_path):
        k, ndim = self.kpt_shape
        kpts = det[:, 6:].reshape(len(det), k, ndim)
        if len(det):
            annotator = self.annotator(im0)
            for row in kpts:
                annotator.keypoints(row, self.skeleton)
            im0[:] = annotator.result()
        summary = super().write_result(det[:, :6], im, im0, path, None)
        if txt_path is not None and len(det):
            with open(txt_path, "a") as f:
                f.writelines(keypoint_txt_lines(det, kpts, im0.shape[:2], self.args.save_conf))
        return summary
