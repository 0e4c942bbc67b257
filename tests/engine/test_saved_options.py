"""Options read from a checkpoint (--resume) are typed and checked as the command line is, and nothing a
checkpoint names reaches the network: not its dataset's `download:`, not its `--weights` (engine/resume.py)."""

import functools
import http.server
import threading

import pytest
import torch
import yaml

import train
from engine.options import DetectTrainOptions
from engine.tasks import TASKS
from engine.trainer import run
from models.checkpoints import releases
from tests.probes import probing
from utils.errors import BadCheckpoint
from utils.run import run_cli

DetectionTrainer = TASKS["detect"].trainer


@pytest.fixture
def server(tmp_path):
    """(base URL, requested paths) of an http.server on 127.0.0.1 serving an empty folder, for this test only."""
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requested.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requested
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


def _saved(**changes):
    """The options a train.py run saves, with `changes`."""
    return {**DetectTrainOptions.from_values(train.parse_opt([]).opt).to_dict(), **changes}


@pytest.mark.parametrize("change,words", [
    ({"imgsz": "64"}, "imgsz is str '64', which --imgsz does not take"),
    ({"data": {"path": "x", "download": "http://127.0.0.1:9/ds.zip"}}, "data is dict"),
    ({"optimizer": "Evil"}, "optimizer is str 'Evil'"),
    ({"freeze": ["0"]}, "freeze is list"),
    ({"epochs": True}, "epochs is bool"),
    ({"batch_size": 0}, "--batch-size 0: must be in [1, inf)"),
    ({"name": "../../elsewhere"}, "--name '../../elsewhere': must name a folder inside --project"),
])
def test_saved_options_are_checked_as_the_command_line(change, words):
    DetectTrainOptions.check_saved(_saved(), "x.pt")  # what train.py saves passes
    with pytest.raises(BadCheckpoint, match=r"^x\.pt: its saved option"):
        DetectTrainOptions.check_saved(_saved(**change), "x.pt")
    try:
        DetectTrainOptions.check_saved(_saved(**change), "x.pt")
    except BadCheckpoint as e:
        assert words in str(e)


@pytest.fixture(scope="module")
def interrupted(shapes_detect, tmp_path_factory):
    """last.pt of a run stopped after its first epoch (resumable)."""
    tmp = tmp_path_factory.mktemp("interrupted")

    class Stop(BaseException):
        pass

    def stop(event):
        raise Stop

    opt = train.parse_opt(["--data", str(shapes_detect), "--imgsz", "64", "--batch-size", "8", "--epochs", "2",
                           "--workers", "0", "--project", str(tmp / "runs"), "--device", "cpu", "--cfg",
                           "yolov5n.yaml"])
    with pytest.raises(Stop):
        run(DetectionTrainer, opt, callbacks={"on_fit_epoch_end": [stop]})
    return tmp / "runs" / "exp" / "weights" / "last.pt"


def _edited(last, tmp_path, **opt):
    ckpt = torch.load(last, weights_only=True)
    ckpt["opt"] = {**ckpt["opt"], **opt}
    path = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    path.parent.mkdir(parents=True)
    torch.save(ckpt, path)
    return path


def test_a_resumed_dataset_download_is_one_line_and_never_fetched(interrupted, tmp_path, server, capsys):
    base, requested = server
    path = _edited(interrupted, tmp_path, data={"path": str(tmp_path / "ds"), "train": "images", "val": "images",
                                                "names": ["a"], "download": f"{base}/ds.zip"})
    with pytest.raises(SystemExit) as e:
        run_cli(train.main, lambda: train.parse_opt(["--resume", str(path), "--device", "cpu"]))
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert e.value.code == 2 and len(errors) == 1 and "its saved option data is dict" in errors[0], errors
    assert not requested


def test_a_resumed_run_fetches_none_of_the_weights_it_names(interrupted, tmp_path, server, monkeypatch):
    """Its saved --weights and --cfg name an official release that is not on disk: the resumed run builds the
    checkpoint's own model (yolov5n), and the release server is never asked."""
    base, requested = server
    monkeypatch.setattr(releases, "RELEASES", ((r"yolov8[nsmlx]\.pt", f"{base}/release/"),))
    monkeypatch.chdir(tmp_path)
    path = _edited(interrupted, tmp_path, weights="yolov8s.pt", cfg="yolov8s.pt")
    seen = {}

    class Stop(BaseException):
        pass

    def capture(trainer):
        seen["model"], seen["epoch"] = trainer.model.yaml["yaml_file"], trainer.state.epoch
        raise Stop

    with pytest.raises(Stop):
        run(probing(DetectionTrainer, {"on_train_start": [capture]}),
            train.parse_opt(["--resume", str(path), "--device", "cpu", "--workers", "0"]))
    assert seen["model"].endswith("yolov5n.yaml") and seen["epoch"] == 1 and not requested


@pytest.mark.parametrize("names,words", [
    (["triangle", "circle", "rectangle"], "--resume .*last.pt predicts 'circle' as class 0, --data .* labels it 1 "
                                          r"\(3 classes in another order\)"),
    (["circle", "rectangle", "triangle", "star"], r"--resume .*last.pt trains 3 classes, --data .* has 4"),
])
def test_a_resume_on_data_naming_the_runs_classes_otherwise_is_refused(interrupted, tmp_path, names, words):
    """The run's labels are class ids: a dataset that now names the run's classes in another order (a reader that
    changed, a names list edited) or counts others would train every moved class on another's boxes."""
    ckpt = torch.load(interrupted, weights_only=True)
    data = tmp_path / "reordered.yaml"
    spec = yaml.safe_load(open(ckpt["opt"]["data"]))
    data.write_text(yaml.safe_dump({**spec, "names": names}))
    last = _edited(interrupted, tmp_path, data=str(data))
    with pytest.raises(BadCheckpoint, match=words):
        run(DetectionTrainer, train.parse_opt(["--resume", str(last), "--device", "cpu"]))


TRACKED = ["csv", "tensorboard", "wandb", "mlflow", "clearml", "comet"]


def _loggers_of_resume(argv, monkeypatch):
    """The loggers a resumed run builds (engine.trainer.build_loggers' names), stopped there."""
    import engine.trainer

    built = []

    class Stop(BaseException):
        pass

    def capture(names, *args, **kwargs):
        built.extend(names)
        raise Stop

    monkeypatch.setattr(engine.trainer, "build_loggers", capture)
    with pytest.raises(Stop):
        run(DetectionTrainer, train.parse_opt(argv))
    return built


def test_a_checkpoint_resumed_from_elsewhere_starts_no_tracker(interrupted, tmp_path, monkeypatch, yolo_log):
    """Issue 61: a --resume'd last.pt whose options named trackers started W&B, ClearML, Comet and MLflow (DNS
    lookups, an mlflow.db). From outside the runs folder the command writes to and its own --project (here another
    folder's: it was copied), its trackers are left out with one warning naming them; results.csv and TensorBoard
    stay."""
    path = _edited(interrupted, tmp_path, loggers=TRACKED)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the default runs folder, runs/train, is here
    assert _loggers_of_resume(["--resume", str(path), "--device", "cpu", "--workers", "0"], monkeypatch) == [
        "csv", "tensorboard"]
    assert [m for m in yolo_log if m.startswith("WARNING: --resume")] == [
        f"WARNING: --resume {path}: its run logged to wandb, mlflow, clearml, comet, which start only for a run in "
        "its own --project or under runs/train, or when named: give --loggers wandb mlflow clearml comet to continue "
        "there"]
    assert not list((tmp_path / "work").iterdir())  # no mlflow.db, no wandb/ folder


@pytest.mark.parametrize("argv, own", [(["--project", "{runs}"], False), ([], True),
                                       (["--loggers", "wandb", "mlflow", "clearml", "comet"], False)])
def test_a_run_resumed_in_its_project_or_naming_them_keeps_its_trackers(interrupted, tmp_path, monkeypatch, argv,
                                                                         own):
    """Under the runs folder this command writes to, in the run's own --project (a run resumed by its path, as made),
    or with --loggers naming them."""
    path = _edited(interrupted, tmp_path, loggers=TRACKED, **({"project": str(tmp_path / "runs")} if own else {}))
    argv = [a.format(runs=tmp_path / "runs") for a in argv]
    assert _loggers_of_resume(["--resume", str(path), "--device", "cpu", "--workers", "0", *argv], monkeypatch) == \
        TRACKED


def test_a_resumed_logger_name_the_project_does_not_know_is_refused(interrupted, tmp_path):
    """It was a KeyError traceback where the loggers were built."""
    path = _edited(interrupted, tmp_path, loggers=["csv", "evil"])
    with pytest.raises(BadCheckpoint, match=r"its saved option loggers names 'evil', which --loggers does not take"):
        run(DetectionTrainer, train.parse_opt(["--resume", str(path), "--device", "cpu", "--project",
                                               str(tmp_path / "runs")]))
