"""End to end on CPU: train.py -> val.py -> detect.py on a tiny synthetic dataset, resume, atomic saves."""

import csv
import dataclasses

import pytest
import torch
import yaml

import detect
import train
import val
from engine.tasks import TASKS
from engine.trainer import run
from models.backend import InferenceBackend, flatten_outputs, validation_model
from tests.probes import probing

DetectionTrainer, DetectionValidator = TASKS["detect"].trainer, TASKS["detect"].validator


def _train_args(data, tmp_path, *extra):
    return [
        "--data", str(data), "--imgsz", "96", "--batch-size", "8", "--epochs", "2", "--workers", "0",
        "--project", str(tmp_path / "runs"), "--name", "exp", "--device", "cpu", *extra,
    ]


@pytest.fixture(scope="module")
def trained_v5(shapes_detect, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train_v5")
    trainer, metrics = train.main(train.parse_opt(_train_args(shapes_detect, tmp, "--cfg", "yolov5n.yaml")))
    return trainer, metrics


def test_train_writes_run_folder(trained_v5):
    trainer, metrics = trained_v5
    d = trainer.save_dir
    for f in ("weights/last.pt", "weights/best.pt", "results.csv", "opt.yaml", "hyp.yaml"):
        assert (d / f).is_file(), f
    assert not (d / "profile.json").exists()  # only with --profile
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert [int(r["epoch"]) for r in rows] == [1, 2]  # as the progress bar numbers them
    assert {"train/box_loss", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "lr/pg0"} <= set(rows[0])
    assert list(d.glob("events.out.tfevents*")), "TensorBoard scalars"
    ckpt = torch.load(d / "weights/best.pt", weights_only=True)
    assert ckpt["optimizer"] is None and ckpt["model"]["state_dict"]  # stripped at the end of training
    assert "fitness" in metrics


def test_val_and_detect_on_trained_weights(trained_v5, shapes_detect, tmp_path):
    trainer, metrics = trained_v5
    best = str(trainer.save_dir / "weights/best.pt")
    # the training's final validation batches twice its batch size: the same batches give the same figures
    stats = val.main(val.parse_opt(["--weights", best, "--data", str(shapes_detect), "--imgsz", "96",
                                    "--project", str(tmp_path / "val"), "--device", "cpu", "--workers", "0",
                                    "--batch-size", "16", "--save-txt", "--save-json"]))
    assert 0.0 <= stats["metrics/mAP50-95(B)"] <= stats["metrics/mAP50(B)"] <= 1.0
    assert stats["metrics/mAP50(B)"] > 0  # a model that finds something, so that the comparison below means something
    for key in ("metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)"):
        assert stats[key] == metrics[key], key  # the run reports what val.py reports on its best.pt
    results = detect.main(detect.parse_opt(["--weights", best, "--source", str(detect_source()), "--imgsz", "96",
                                            "--project", str(tmp_path / "det"), "--device", "cpu", "--save-txt",
                                            "--conf-thres", "0.01"]))
    assert len(results) == len(list(detect_source().glob("*.jpg")))
    out = tmp_path / "det" / "exp"
    assert len(list(out.glob("*.jpg"))) == len(results)


def test_final_validation_is_of_the_model_val_py_loads(shapes_detect, tmp_path, monkeypatch):
    """The run's last figures come from the very model val.py validates on best.pt: the same outputs, bit for bit
    (an unfused model's convolutions round differently from the fused one's)."""
    validated = []
    init_metrics = DetectionValidator.init_metrics

    def recording(self, model):
        validated.append(model)
        return init_metrics(self, model)

    monkeypatch.setattr(DetectionValidator, "init_metrics", recording)
    trainer, _ = train.main(train.parse_opt(_train_args(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml",
                                                        "--epochs", "1")))
    final = validated[-1]
    standalone, _, _ = validation_model(InferenceBackend(trainer.save_dir / "weights/best.pt"), 96)
    x = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    x = x.contiguous(memory_format=torch.channels_last)  # the layout the validator gives its batches on a CPU
    with torch.no_grad():
        ours, theirs = flatten_outputs(final(x))[0], flatten_outputs(standalone(x))[0]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def detect_source():
    from utils.files import ROOT

    return ROOT / "data" / "images"


class _Interrupt(BaseException):  # a callback's Exception is a warning (engine/callbacks.py); this stops
    pass


def _interrupt_after_first_epoch(event):
    if event.epoch == 1:
        raise _Interrupt


def test_resume_restores_exact_state(shapes_detect, tmp_path):
    opt = train.parse_opt(_train_args(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml", "--epochs", "3"))
    with pytest.raises(_Interrupt):
        run(DetectionTrainer, opt, callbacks={"on_fit_epoch_end": [_interrupt_after_first_epoch]})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    saved = torch.load(last, weights_only=True)
    assert saved["epoch"] == 0 and saved["optimizer"] is not None

    seen = {}

    def capture(trainer):
        seen["start_epoch"] = trainer.state.epoch
        seen["lrs"] = [g["lr"] for g in trainer.optim.optimizer.param_groups]
        seen["opt_state"] = trainer.optim.optimizer.state_dict()
        seen["ema_updates"] = trainer.optim.ema.updates
        seen["save_dir"] = trainer.save_dir
        seen["profile"] = trainer.profile.enabled
        raise _Interrupt  # stop right after set-up: the state is what we check

    resume = train.parse_opt(["--resume", str(last), "--device", "cpu", "--workers", "0", "--profile"])
    with pytest.raises(_Interrupt):
        run(probing(DetectionTrainer, {"on_train_start": [capture]}), resume)
    assert seen["start_epoch"] == 1
    assert seen["save_dir"] == last.parent.parent
    assert seen["profile"]  # profiling is this launch's choice, allowed with --resume
    assert seen["ema_updates"] == saved["updates"]
    assert seen["lrs"] == [g["lr"] for g in saved["optimizer"]["param_groups"]]
    state, ref = seen["opt_state"]["state"], saved["optimizer"]["state"]
    assert state.keys() == ref.keys()
    for k in ref:
        for name, v in ref[k].items():
            assert torch.equal(torch.as_tensor(state[k][name]), torch.as_tensor(v)), (k, name)


def test_a_new_class_layer_steps_faster_and_a_resume_rebuilds_its_groups(shapes_detect, tmp_path):
    """Fine-tuning a yolov8n of other classes under --optimizer auto: the class convolutions --weights could not give
    train at hyp.v8's lr_new_gain x the others' lr, in optimizer groups that --resume rebuilds from the run's record."""
    from models.checkpoints import model_to_ckpt
    from models.yolo import DetectionModel

    src = DetectionModel("yolov8n.yaml", nc=5)
    src.names = {i: f"other{i}" for i in range(5)}
    torch.save({"model": model_to_ckpt(src)}, tmp_path / "other.pt")
    opt = train.parse_opt(_train_args(shapes_detect, tmp_path, "--cfg", "yolov8n.yaml", "--weights",
                                      str(tmp_path / "other.pt"), "--epochs", "3"))
    seen = {}

    def first_epoch(trainer):
        seen.setdefault("lrs", [g["lr"] for g in trainer.optim.optimizer.param_groups])
        raise _Interrupt

    with pytest.raises(_Interrupt):
        run(probing(DetectionTrainer, {"on_fit_epoch_end": [first_epoch]}), opt)
    new = [f"model.22.cv3.{i}.2.{k}" for i in range(3) for k in ("bias", "weight")]
    run_dir = tmp_path / "runs" / "exp"
    assert yaml.safe_load((run_dir / "opt.yaml").read_text())["new_params"] == new
    lrs = seen["lrs"]
    assert len(lrs) == 6 and lrs[4] == pytest.approx(10 * lrs[1]) and lrs[1] > 0
    saved = torch.load(run_dir / "weights" / "last.pt", weights_only=True)

    def capture(trainer):
        seen["groups"] = trainer.optim.optimizer.state_dict()["param_groups"]
        raise _Interrupt

    resume = train.parse_opt(["--resume", str(run_dir / "weights" / "last.pt"), "--device", "cpu", "--workers", "0"])
    with pytest.raises(_Interrupt):
        run(probing(DetectionTrainer, {"on_train_start": [capture]}), resume)
    assert seen["groups"] == saved["optimizer"]["param_groups"]


def test_a_resume_that_extends_the_run_keeps_the_optimizer_auto_chose(shapes_detect, tmp_path):
    """--optimizer auto picks AdamW for a short run and SGD beyond 10k iterations; --resume --epochs that crosses the
    threshold continues with the optimizer whose state last.pt holds (SGD loaded with AdamW's groups has no momentum:
    a KeyError at its first step)."""
    opt = train.parse_opt(_train_args(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml"))
    with pytest.raises(_Interrupt):
        run(DetectionTrainer, opt, callbacks={"on_fit_epoch_end": [_interrupt_after_first_epoch]})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    saved = torch.load(last, weights_only=True)
    seen = {}

    def capture(trainer):
        optimizer = trainer.optim.optimizer
        seen["optimizer"], seen["groups"] = type(optimizer).__name__, optimizer.state_dict()
        raise _Interrupt

    resume = train.parse_opt(["--resume", str(last), "--epochs", "20000", "--device", "cpu", "--workers", "0"])
    with pytest.raises(_Interrupt):
        run(probing(DetectionTrainer, {"on_train_start": [capture]}), resume)
    assert seen["optimizer"] == "AdamW"
    assert [sorted(g) for g in seen["groups"]["param_groups"]] == [sorted(g) for g in
                                                                   saved["optimizer"]["param_groups"]]


def test_a_resume_trains_with_the_run_s_hyperparameters_not_the_file_s_new_ones(shapes_detect, tmp_path):
    """--resume continues with the hyperparameters last.pt records, as it does with the options: a --hyp file edited
    since (or a project default changed) does not change the run (with lr_new_gain, an optimizer of other groups
    than last.pt's would not even load)."""
    from engine.hyp import read_hyp

    hyp = tmp_path / "mine.yaml"
    hyp.write_text(yaml.safe_dump({**read_hyp("hyp.scratch-low.yaml"), "box": 0.05}))
    opt = train.parse_opt(_train_args(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml", "--hyp", str(hyp)))
    with pytest.raises(_Interrupt):
        run(DetectionTrainer, opt, callbacks={"on_fit_epoch_end": [_interrupt_after_first_epoch]})
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    saved = torch.load(last, weights_only=True)["hyp"]
    hyp.write_text(yaml.safe_dump({**saved, "box": 0.5}))  # edited for another run
    seen = {}

    def capture(trainer):
        seen["hyp"], seen["box_gain"] = trainer.hyp, trainer.criterion.box_gain
        raise _Interrupt

    resume = train.parse_opt(["--resume", str(last), "--device", "cpu", "--workers", "0"])
    with pytest.raises(_Interrupt):
        run(probing(DetectionTrainer, {"on_train_start": [capture]}), resume)
    assert seen["hyp"] == saved and seen["box_gain"] == pytest.approx(0.05)  # 0.05 x 3 / 3 levels


def test_interrupted_save_keeps_last_checkpoint(tmp_path, monkeypatch):
    from utils.files import atomic_save

    f = tmp_path / "last.pt"
    atomic_save({"epoch": 1, "w": torch.ones(3)}, f)

    def broken_save(obj, fh, *a, **k):
        fh.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        atomic_save({"epoch": 2, "w": torch.zeros(3)}, f)
    monkeypatch.undo()
    ckpt = torch.load(f)
    assert ckpt["epoch"] == 1 and torch.equal(ckpt["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temp file left behind


def test_batch_size_must_divide_world_size(shapes_detect, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    opt = train.parse_opt(_train_args(shapes_detect, tmp_path)).opt
    with pytest.raises(ValueError, match="multiple of WORLD_SIZE"):
        DetectionTrainer(opt, torch.device("cpu"))


def test_workers_default_is_resolved_for_the_device(shapes_detect, tmp_path):
    from data.loader import default_workers

    args = [a for a in _train_args(shapes_detect, tmp_path) if a not in ("--workers", "0")]
    trainer = DetectionTrainer(train.parse_opt(args).opt, torch.device("cpu"))
    assert trainer.opt.workers is None  # as given: the resolved count is a derived field
    assert trainer.opt.loader_workers == default_workers(torch.device("cpu"))
    with pytest.raises(dataclasses.FrozenInstanceError):  # the options are frozen once set up
        trainer.opt.workers = 4


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    """A dataset and hyp on which a few epochs from scratch must visibly learn: nbs 16 so that every batch of
    16 is an optimizer step, and no warmup (its 100-iteration floor would cover the whole run)."""
    import yaml

    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml
    from utils.files import ROOT

    root = tmp_path_factory.mktemp("learnable")
    generate_dataset(root, task="detect", n_train=256, n_val=24, seed=3, min_side=96, max_side=128, max_objects=4)
    hyp = yaml.safe_load((ROOT / "data" / "hyps" / "hyp.v8.yaml").read_text())
    hyp.update(nbs=16, warmup_epochs=0.0, close_mosaic=0, lr0=0.003)
    hyp_file = root / "hyp.yaml"
    hyp_file.write_text(yaml.safe_dump(hyp))
    return write_yaml(root, "detect"), hyp_file


@pytest.mark.slow
def test_yolov8_learns_in_a_few_epochs(learnable, tmp_path):
    """128 optimizer steps at 96 px: measured mAP50 0.00 after epoch 0 and 0.115 after epoch 7."""
    data, hyp = learnable
    args = _train_args(data, tmp_path, "--cfg", "yolov8n.yaml", "--hyp", str(hyp), "--epochs", "8",
                       "--batch-size", "16", "--optimizer", "AdamW")
    trainer, _ = train.main(train.parse_opt(args))
    rows = list(csv.DictReader(open(trainer.save_dir / "results.csv")))
    first, best = float(rows[0]["metrics/mAP50(B)"]), max(float(r["metrics/mAP50(B)"]) for r in rows)
    assert best > first + 0.05, f"mAP50 went from {first:.3f} to at best {best:.3f}"


def test_img_not_a_stride_multiple_is_rounded_up_with_one_warning(shapes_detect, tmp_path):
    import logging

    from utils.log import LOGGER

    seen = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    LOGGER.addHandler(handler)
    try:
        args = _train_args(shapes_detect, tmp_path, "--cfg", "yolov5n.yaml", "--imgsz", "100", "--epochs", "1")
        trainer, _ = train.main(train.parse_opt(args))
    finally:
        LOGGER.removeHandler(handler)
    assert [m for m in seen if "--img 100" in m] == ["WARNING: --img 100 is not a multiple of the model's largest "
                                                      "stride 32: using 128"]
    assert (trainer.opt.imgsz, trainer.opt.train_imgsz, trainer.train_set.imgsz) == (100, 128, 128)
    assert len(list(csv.DictReader(open(trainer.save_dir / "results.csv")))) == 1
    saved = yaml.safe_load((trainer.save_dir / "opt.yaml").read_text())
    assert (saved["imgsz"], saved["train_imgsz"]) == (100, 128)  # what was given, and what the run used


def test_weights_without_cfg_train_the_checkpoint_s_own_model(shapes_detect, tmp_path):
    """`train.py --weights v8.pt` with no --cfg trains that YOLOv8 with every tensor carried over (YOLOv5's and
    Ultralytics' rule), not the script's default yolov5n seeded with the few tensors whose shapes fit; the hyp an
    --evolve starts from is that model's; a --cfg given still picks the model."""
    from engine.evolve import _base_hyp
    from engine.options import DetectTrainOptions
    from engine.resume import weights_own_model
    from models.checkpoints import model_to_ckpt
    from models.heads import AnchorFreeDetect, Detect
    from models.yolo import DetectionModel

    torch.manual_seed(0)
    source = DetectionModel("yolov8n.yaml", nc=3)
    weights = tmp_path / "v8.pt"
    torch.save({"model": model_to_ckpt(source)}, weights)
    parsed = train.parse_opt(_train_args(shapes_detect, tmp_path, "--weights", str(weights), "--epochs", "1",
                                         "--imgsz", "64"))
    own = weights_own_model(DetectTrainOptions.from_values(parsed.opt), parsed.given)
    assert parsed.opt.cfg == "yolov5n.yaml" and own.cfg == str(weights) and own.train_checkpoint_model
    assert "dfl" in _base_hyp(own)  # hyp.v8.yaml, not scratch-low
    trainer, _ = train.main(parsed)
    assert isinstance(trainer.model.model[-1], AnchorFreeDetect) and trainer.opt.cfg == str(weights)
    assert trainer.opt.train_checkpoint_model
    assert {k: v.shape for k, v in trainer.model.state_dict().items()} == \
        {k: v.shape for k, v in source.state_dict().items()}
    saved = yaml.safe_load((trainer.save_dir / "opt.yaml").read_text())
    assert saved["cfg"] == str(weights) and saved["train_checkpoint_model"]

    parsed = train.parse_opt(_train_args(shapes_detect, tmp_path, "--weights", str(weights), "--cfg", "yolov5n.yaml",
                                         "--epochs", "1", "--imgsz", "64", "--name", "given"))
    typed = DetectTrainOptions.from_values(parsed.opt)
    assert weights_own_model(typed, parsed.given) is typed
    trainer, _ = train.main(parsed)
    assert type(trainer.model.model[-1]) is Detect and not trainer.opt.train_checkpoint_model


def test_epochs_loaded_ahead_train_as_loaded_at_their_start(shapes_detect, tmp_path, monkeypatch):
    """With workers, each epoch's loading starts before the listeners' start (epoch 0) or the previous epoch's
    validation (GroupedLoader.load_ahead), and the epoch goes on with it; the run trains as one without workers."""
    from data.loader import GroupedLoader

    started, dropped = [], []
    load_ahead, stop_loading = GroupedLoader.load_ahead, GroupedLoader.stop_loading
    monkeypatch.setattr(GroupedLoader, "load_ahead", lambda self: started.append(self.position) or load_ahead(self))
    monkeypatch.setattr(GroupedLoader, "stop_loading",
                        lambda self: dropped.append(self.ahead is not None) or stop_loading(self))
    args = ["--cfg", "yolov5n.yaml", "--seed", "3", "--deterministic", "--noplots"]
    ahead, _ = train.main(train.parse_opt(_train_args(shapes_detect, tmp_path / "w", *args, "--workers", "2")))
    assert ahead.data_plan.train_loader.num_workers == 2
    assert started == [(0, 0), (1, 0)] and not any(dropped)  # both epochs went on with what was started
    at_start, _ = train.main(train.parse_opt(_train_args(shapes_detect, tmp_path / "0", *args)))
    rows = [list(csv.DictReader(open(t.save_dir / "results.csv"))) for t in (ahead, at_start)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]


def test_colour_left_to_the_device_trains_as_in_the_worker(shapes_detect, tmp_path, monkeypatch):
    """Training on a GPU the loader leaves the HSV colour to the device (YOLODataset device_hsv); forced here on the
    CPU, a run goes through the same trainer path (the tables in the batch, preprocess_batch applying them, the
    training plots) and trains as the worker-coloured run of the same seed: the pixels differ only by OpenCV's own
    rounding, at most one grey level."""
    import engine.trainer as trainer_mod

    build, apply, calls = DetectionTrainer.build_dataset, trainer_mod.apply_hsv_batch, []

    def on_device(self, *args, **kwargs):
        dataset = build(self, *args, **kwargs)
        dataset.device_hsv = True
        return dataset

    def counted(img, tables):
        calls.append(tables.shape)
        return apply(img, tables)

    args = ["--cfg", "yolov5n.yaml", "--seed", "3"]
    worker, _ = train.main(train.parse_opt(_train_args(shapes_detect, tmp_path / "w", *args)))
    monkeypatch.setattr(DetectionTrainer, "build_dataset", on_device)
    monkeypatch.setattr(trainer_mod, "apply_hsv_batch", counted)
    device, _ = train.main(train.parse_opt(_train_args(shapes_detect, tmp_path / "d", *args)))
    assert calls and all(s[1:] == (3, 256) for s in calls)
    assert (device.save_dir / "train_batch0.jpg").is_file()
    rows = [list(csv.DictReader(open(t.save_dir / "results.csv"))) for t in (worker, device)]
    losses = [k for k in rows[0][0] if k.startswith("train/")]
    assert len(rows[0]) == len(rows[1]) == 2 and len(losses) == 3
    for a, b in zip(*rows):
        for key in losses:
            assert float(a[key]) == pytest.approx(float(b[key]), rel=0.02), key
