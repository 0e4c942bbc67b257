"""Classification: the trainer, validator and predictor of YOLOv5-cls and YOLOv8-cls, which read the task's record
(`record`: engine/tasks/__init__.py) for its options and run folders."""

import shlex
from pathlib import Path

import torch

from data.classify_dataset import ClassificationDataset, classify_val_transforms
from data.dataset_yaml import check_cls_dataset
from data.image_files import class_folders
from data.streams import open_source
from engine.messages import check_task
from engine.predictor import BasePredictor
from engine.trainer import BaseTrainer
from engine.validator import BaseValidator
from evaluation.fields import ClassScores, Predictions
from evaluation.metrics import ClassifyMetrics, ConfusionMatrix
from evaluation.plots import plot_images
from models.checkpoints import attempt_load, load_pretrained, transfer_weights
from models.yolo import CLASSIFY_TASKS, ClassificationModel, DetectionModel, head_task, yaml_model_load
from utils.dist import get_rank, get_world_size
from utils.errors import BadCheckpoint
from utils.log import LOGGER
from utils.torch_utils import labels_to


def build_classifier(model_arg, nc, names):
    """(model, given): a ClassificationModel from a YAML, or seeded from a .pt: a classifier checkpoint (fine-tuning:
    every tensor whose shape fits, so a head for another class count is left new) or a detector checkpoint, whose
    backbone is cut before its 10th layer as the official YOLOv5 classifier is (layers 0-8 copied, Classify in place
    of SPPF); `given`: the state keys the .pt gave (None for a YAML)."""
    given = None
    if str(model_arg).endswith(".pt"):
        src = attempt_load(model_arg, device="cpu", fuse=False)
        if isinstance(src, DetectionModel):
            model = ClassificationModel.from_detection_model(src, nc=nc, cutoff=10)
            head = f"model.{len(model.model) - 1}."
            given = {k for k in model.state_dict() if not k.startswith(head)}
            LOGGER.info(f"Classifier seeded from the backbone (layers 0-8) of detector {model_arg}")
        else:
            model = ClassificationModel(src.yaml, nc=nc)
            model.names = dict(names)  # classes that src names alike keep their weights
            given = transfer_weights(model, src, model_arg, exclude=())
    else:
        d = yaml_model_load(model_arg)
        check_task(head_task(d), CLASSIFY_TASKS, f"--model {model_arg}", "train")
        model = ClassificationModel(d, nc=nc)
    model.names = dict(names)
    return model, given


def whole_image_targets(cls, conf=None):
    """plot_images rows for a classification batch: one whole-image box per image carrying its class (and the
    confidence of a prediction)."""
    n = len(cls)
    whole = torch.tensor([[0.5, 0.5, 1.0, 1.0]]).expand(n, 4)
    cols = [torch.arange(n)[:, None].float(), cls.cpu()[:, None].float(), whole]
    if conf is not None:
        cols.append(conf.cpu()[:, None].float())
    return torch.cat(cols, 1)


def cls_data(data, options, role, autodownload=True):
    """The dataset dict of a classification run: one class map for every split (data/dataset_yaml.py)."""
    return check_cls_dataset(data, autodownload)


class ClassificationTrainer(BaseTrainer):
    record = None  # the task's, set on the class the task binds

    def get_data(self):
        return self.record.data(self.opt.data, self.opt, "train", autodownload=not self.resume_from)

    def predict_source(self):
        """The validation images, which sit in class folders: a glob, since --source reads a folder itself only."""
        return shlex.quote(str(Path(self.data["val"]) / "*" / "*"))

    def build_model(self, nc, names, resumed=None):
        if resumed is not None:  # the run's own model, whose weights restore() puts back
            model = ClassificationModel(resumed, nc=nc)
            model.names = dict(names)
            return model, None
        model, given = build_classifier(self.opt.cfg, nc, names)
        if self.opt.weights and not self.opt.train_checkpoint_model:  # else build_classifier seeded it from them
            given = (given or set()) | load_pretrained(model, self.opt.weights)
        return model, given

    def build_dataset(self, path, mode, stride):
        """The training set (the validation set comes from the validator's `build_dataset`), under the dataset's
        one class map."""
        return ClassificationDataset(
            path, imgsz=self.opt.train_imgsz, augment=True, hyp=self.hyp, cache=self.opt.cache, prefix=f"{mode}: ",
            rank=get_rank(), world_size=get_world_size(), seed=self.opt.seed, names=self.names,
        )

    def preprocess_batch(self, batch):
        batch["img"] = batch["img"].to(self.device, non_blocking=True)  # floats in [0, 1] already
        return labels_to(batch, self.device)

    def plot_training_batch(self, batch, step):
        if step < 3:
            plot_images(batch["img"], whole_image_targets(batch["cls"]), fname=self.save_dir / f"train_batch{step}.jpg",
                        names=self.names)

    def build_validator(self):
        return self.record.validator(self.record.val.from_train(self.opt, self.batch_size * 2), self.save_dir,
                                     self.names, criterion=self.criterion)


class ClassificationValidator(BaseValidator):
    """Top-1 / top-5 accuracy, per-class accuracy and the confusion matrix."""

    record = None  # the task's, set on the class the task binds

    @classmethod
    def get_data(cls, data, options):
        return cls.record.data(data, options, "val")

    @classmethod
    def val_names(cls, data, model, options):
        """The checkpoint's class map (the ids the model predicts, by name): the val folders are matched to it by
        name, so a split lacking a class, or a dataset whose folders sort otherwise, is still scored correctly."""
        names = dict(model.names)
        unknown = [f for f in class_folders(cls.split_path(data, options.split)) if f not in names.values()]
        if unknown:
            raise BadCheckpoint(f"--weights {options.weights} knows no class {', '.join(map(repr, unknown))} of "
                                f"--data {options.data} (its classes: {', '.join(names.values())})")
        return names

    def build_dataset(self, path, stride, rect=True):  # classifiers' images are cropped square at any rect
        return ClassificationDataset(path, imgsz=self.args.imgsz, augment=False, prefix="val: ", names=self.names)

    def preprocess(self, batch, device, half):
        return ClassScores.to_device(batch, device, half)

    def description(self):
        return ("%22s" + "%11s" * 2) % ("classes", "top1_acc", "top5_acc")

    def init_metrics(self, model):
        self.metrics = ClassifyMetrics()
        self.confusion = ConfusionMatrix(nc=self.nc, background=False)

    def postprocess(self, preds, batch):
        """Class probabilities (B, nc): one row per image."""
        return preds[0] if isinstance(preds, (list, tuple)) else preds

    def loss_inputs(self, probs):
        """Log-probabilities stand in for the logits the eval-mode head does not return: cross-entropy applies
        log-softmax, which leaves normalised log-probabilities unchanged. The floor keeps a probability that
        underflowed to 0 finite."""
        return probs.float().clamp(min=torch.finfo(torch.float32).tiny).log()

    def update_metrics(self, probs, batch):
        self.seen += len(probs)
        return ClassScores.match(probs, batch)

    def get_stats(self, records):
        return ClassScores.accumulate(records, self.metrics, self.confusion)

    def print_results(self, final=False):
        LOGGER.info(("%22s" + "%11.3g" * 2) % ("all", self.metrics.top1, self.metrics.top5))
        if final:
            for name, _, top1 in self.class_table()[1]:
                LOGGER.info(("%22s" + "%11.3g") % (name, top1))
            self.print_speed((1, 3, self.args.imgsz, self.args.imgsz))

    def class_table(self):
        """class, images, top-1 accuracy, for each class the validation set holds."""
        m = self.confusion.matrix  # [predicted, true]
        rows = [[name, int(m[:, c].sum()), float(m[c, c] / m[:, c].sum())] for c, name in self.names.items()
                if m[:, c].sum()]
        return ["class", "images", "metrics/accuracy_top1"], rows

    def plot_metrics(self):
        for normalize in (False, True):
            self.confusion.plot(save_dir=self.save_dir, names=list(self.names.values()), normalize=normalize)

    def plot_val_batch(self, batch, probs, bi):
        """The labels, and the top-1 predictions with their probabilities, as image grids."""
        plot_images(batch["img"], whole_image_targets(batch["cls"]), fname=self.save_dir / f"val_batch{bi}_labels.jpg",
                    names=self.names)
        conf, top1 = probs.float().max(1)
        plot_images(batch["img"], whole_image_targets(top1, conf), fname=self.save_dir / f"val_batch{bi}_pred.jpg",
                    names=self.names)


class ClassificationPredictor(BasePredictor):
    record = None  # the task's, set on the class the task binds

    def load_source(self):
        size = self.imgsz if self.model.dynamic else self.imgsz[0]  # classifiers are exported square
        return open_source(self.args.source, imgsz=size, transforms=classify_val_transforms(size),
                           vid_stride=self.args.vid_stride)

    def preprocess(self, im):
        im = im.to(self.device) if isinstance(im, torch.Tensor) else torch.from_numpy(im).to(self.device)
        im = im.half() if self.half else im.float()
        return im[None] if im.ndim == 3 else im

    def declare_fields(self):
        return self.record.fields(self.names, None)

    def postprocess(self, preds, im, im0):
        probs = preds[0] if isinstance(preds, (list, tuple)) else preds
        return Predictions(probs=probs[0])
