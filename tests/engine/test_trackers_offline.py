"""ClearML and Comet (engine/loggers/clearml.py, comet.py) with their real packages in their offline modes, no network.
ClearML's offline session zip is read back as ClearML writes it (task.json and the metrics.jsonl event batches);
Comet's offline zip is read back message by message, each checked by comet_ml's own schema of that message (the
validators its `comet upload` applies). A --resume continues the same task / experiment key; a package raising, a
missing package and missing credentials are each one warning and the run goes on."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import train
from engine.loggers.clearml import scalar_name
from engine.loggers.tracker import service_project_name
from tests.engine.test_trackers import SMALL, results_rows, tracker_runs
from utils.errors import Interrupted
from utils.files import ROOT


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    """ClearML offline, its cache in the test's folder; Comet offline (zips under <run>/comet)."""
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml-cache"))
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.delenv("COMET_OFFLINE_DIRECTORY", raising=False)
    return tmp_path


def read_clearml(cache_dir, task_id):
    """(task.json, {(title, series): {iteration: value}}, {title: [iterations]} of debug images whose file is in the
    zip, [table plots]) of the offline session zip of `task_id`, as Task.import_offline_session reads it."""
    path = cache_dir / "offline" / f"{task_id}.zip"
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        task = json.loads(zf.read("task.json"))
        batches = [json.loads(line) for line in zf.read("metrics.jsonl").decode().splitlines() if line.strip()]
    scalars, images, tables = {}, {}, []
    folder = task["offline_folder"]
    for event in (e for batch in batches for e in batch):
        assert event["task"] == task_id
        if event["type"] == "training_stats_scalar":
            series = scalars.setdefault((event["metric"], event["variant"]), {})
            assert event["iter"] not in series, f"{event['metric']}/{event['variant']} at {event['iter']} twice"
            series[event["iter"]] = event["value"]
        elif event["type"] == "training_debug_image":
            assert os.path.relpath(event["url"], folder).replace(os.sep, "/") in names, event["url"]
            images.setdefault(event["metric"], []).append(event["iter"])
        elif event["type"] == "plot":
            tables.append(json.loads(event["plot_str"])["data"][0])
    return task, scalars, images, tables


def read_comet(folder, archives=None):
    """[(experiment.json, [(type, payload)])] of every offline Comet zip in `folder` (or of `archives`), oldest first,
    each message checked against comet_ml's schema for its type."""
    from comet_ml import schemas

    check = {"metric_msg": schemas.get_metric_msg_validator(), "parameter_msg": schemas.get_parameter_msg_validator(),
             "file_upload": schemas.get_upload_msg_validator(), "log_other": schemas.get_log_other_msg_validator()}
    read = []
    for path in sorted(archives or folder.glob("*.zip"), key=lambda p: p.stat().st_mtime_ns):
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("experiment.json"))
            schemas.get_experiment_file_validator().validate(meta)
            messages = [json.loads(line) for line in zf.read("messages.json").decode().splitlines() if line.strip()]
            files = set(zf.namelist())
        for m in messages:
            if m["type"] in check:
                check[m["type"]].validate(m["payload"])
            if m["type"] == "file_upload":
                assert m["payload"]["file_path"] in files, "the uploaded file is in the zip"
        read.append((meta, [(m["type"], m["payload"]) for m in messages]))
    return read


def comet_metrics(messages):
    """{name: {step: value}}, a step sent twice failing."""
    metrics = {}
    for kind, payload in messages:
        if kind == "metric_msg" and payload["metric"]["metricName"] != "process duration":  # comet_ml's own
            m = payload["metric"]
            assert m["step"] not in metrics.setdefault(m["metricName"], {}), (m["metricName"], m["step"])
            metrics[m["metricName"]][m["step"]] = m["metricValue"]
    return metrics


def comet_uploads(messages):
    return [(p["upload_type"], p["additional_params"]) for kind, p in messages if kind == "file_upload"]


@pytest.fixture(scope="module")
def offline_run(shapes_detect, tmp_path_factory):
    """A 2-epoch run logged to ClearML and Comet offline at once."""
    tmp = tmp_path_factory.mktemp("offline-trackers")
    env = {"CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(tmp / "clearml-cache"), "COMET_START_ONLINE": "false"}
    with pytest.MonkeyPatch.context() as mp:  # module scope: the function-scoped monkeypatch is not available
        for k, v in env.items():
            mp.setenv(k, v)
        trainer, _ = train.run(data=str(shapes_detect), epochs=2, project=str(tmp / "runs"),
                               loggers="csv,clearml,comet", **SMALL)
    return trainer, tmp / "clearml-cache"


def test_clearml_offline_session_holds_every_results_column_for_both_epochs(offline_run):
    trainer, cache = offline_run
    task_id = tracker_runs(trainer)["clearml"]
    task, scalars, images, tables = read_clearml(cache, task_id)
    assert task["id"] == task_id and task["name"] == trainer.save_dir.name
    assert task["project_name"] == str(trainer.save_dir.parent)
    args, hyp = task["hyperparams"]["Args"], task["hyperparams"]["Hyperparameters"]
    assert args["epochs"]["value"] == "2" and args["imgsz"]["value"] == "64" and "lr0" in hyp
    assert "script" not in task or not task["script"].get("diff"), "no repository detection, no diff stored"
    rows = results_rows(trainer.save_dir)
    for epoch, row in rows.items():
        for column, value in row.items():
            if column != "epoch":
                assert scalars[scalar_name(column)][epoch] == pytest.approx(float(value), rel=1e-4), (epoch, column)
    assert {"labels", "train_batch0", "val_batch0_pred", "confusion_matrix", "PR_curve", "results"} <= set(images)
    [table] = tables
    assert table["type"] == "table" and table["header"]["values"][:3] == ["class", "images", "instances"]
    columns, rows = trainer.validator.class_table()
    assert table["header"]["values"] == columns and table["cells"]["values"][0] == [r[0] for r in rows]
    [artifact] = task["execution"]["artifacts"]
    assert artifact["key"] == "best.pt" and artifact["uri"].endswith("/best.pt")
    assert artifact["content_size"] == (trainer.save_dir / "weights" / "best.pt").stat().st_size


def test_comet_offline_zip_holds_every_results_column_for_both_epochs(offline_run):
    trainer, _ = offline_run
    [(meta, messages)] = read_comet(trainer.save_dir / "comet")
    assert meta["offline_id"] == tracker_runs(trainer)["comet"]
    assert meta["project_name"] == service_project_name(str(trainer.save_dir.parent), 100)
    others = {p["key"]: p["value"] for kind, p in messages if kind == "log_other"}
    assert others["Name"] == trainer.save_dir.name
    sent = [p.get("param") or p["params"] for kind, p in messages if kind == "parameter_msg"]  # params: a list value
    params = {p["paramName"]: p["paramValue"] for p in sent}
    assert params["epochs"] == 2 and params["imgsz"] == 64 and "hyp|lr0" in params
    metrics = comet_metrics(messages)
    for epoch, row in results_rows(trainer.save_dir).items():
        for column, value in row.items():
            if column != "epoch":
                assert metrics[column][epoch] == pytest.approx(float(value), rel=1e-4), (epoch, column)
    uploads = comet_uploads(messages)
    names = {a.get("figName") for kind, a in uploads if kind == "visualization"}
    assert {"labels", "train_batch0", "val_batch0_pred", "confusion_matrix", "PR_curve", "results"} <= names
    assert ("model-element", "best.pt") in [(kind, a.get("fileName")) for kind, a in uploads]
    assert "per_class.csv" in [a.get("fileName") for kind, a in uploads if kind == "asset"]


def test_a_resume_by_hand_continues_the_same_task_and_experiment(shapes_detect, offline_env):
    """Ctrl-C after epoch 1, then --resume with --no-log-model kept: ClearML continues the one offline session (its
    zip holds both epochs, each once); Comet writes a second zip under the same key, holding epoch 2 only."""
    project = offline_env / "runs"

    def ctrl_c_after_first_epoch(event):
        if event.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train.run(data=str(shapes_detect), epochs=2, project=str(project), loggers="clearml,comet", noplots=True,
                  log_model=False, callbacks={"on_fit_epoch_end": [ctrl_c_after_first_epoch]}, **SMALL)
    trainer, _ = train.run(resume=str(project / "exp" / "weights" / "last.pt"))
    task_id = tracker_runs(trainer)["clearml"]
    assert [p.name for p in (offline_env / "clearml-cache" / "offline").iterdir()] in (
        [task_id, f"{task_id}.zip"], [f"{task_id}.zip", task_id])
    task, scalars, _, _ = read_clearml(offline_env / "clearml-cache", task_id)
    assert sorted(scalars[("train", "box_loss")]) == [1, 2] and sorted(scalars[("metrics", "mAP50(B)")]) == [1, 2]
    assert task["execution"]["artifacts"] == []
    archives = read_comet(trainer.save_dir / "comet")
    assert [meta["offline_id"] for meta, _ in archives] == [tracker_runs(trainer)["comet"]] * 2
    assert [meta["resume_strategy"] for meta, _ in archives] == ["create", "get"]
    steps = [sorted(comet_metrics(messages)["train/box_loss"]) for _, messages in archives]
    assert steps == [[1], [2]]
    first = {p["key"]: p["value"] for kind, p in archives[0][1] if kind == "log_other"}
    assert first.get("ended") == "killed"
    assert not [a for _, messages in archives for kind, a in comet_uploads(messages) if kind == "model-element"]


def test_a_clearml_session_gone_from_the_cache_goes_on_in_a_new_one_under_the_same_id(shapes_detect, offline_env):
    """Resumed where the first session's folder is not (another machine, a cleared cache): a new session under the
    same task id, holding what follows only, for import_offline_session(previous_task_id=...)."""
    import shutil

    project = offline_env / "runs"

    def ctrl_c_after_first_epoch(event):
        if event.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train.run(data=str(shapes_detect), epochs=2, project=str(project), loggers="clearml", noplots=True,
                  callbacks={"on_fit_epoch_end": [ctrl_c_after_first_epoch]}, **SMALL)
    first = offline_env / "clearml-cache"
    shutil.move(first, offline_env / "first-session")
    trainer, _ = train.run(resume=str(project / "exp" / "weights" / "last.pt"))
    task_id = tracker_runs(trainer)["clearml"]
    _, before, _, _ = read_clearml(offline_env / "first-session", task_id)
    _, after, _, _ = read_clearml(first, task_id)
    assert sorted(before[("train", "box_loss")]) == [1] and sorted(after[("train", "box_loss")]) == [2]


KILLED_AFTER_FIRST_EPOCH = """
import os, signal, sys
import train
from tests.engine.test_trackers import SMALL

def die(event):  # after the trackers' on_fit_epoch_end and last.pt: the loggers are attached first
    if event.epoch == 1:
        os.kill(os.getpid(), signal.SIGKILL)

train.run(data=sys.argv[1], epochs=2, project=sys.argv[2], loggers="clearml,comet", noplots=True,
          callbacks={"on_fit_epoch_end": [die]}, **SMALL)
"""


def test_a_run_killed_outright_then_resumed(shapes_detect, offline_env):
    """SIGKILL after epoch 1 (as a torchrun worker dies) of a run started by a process that had a ClearML task, then
    --resume: ClearML's session had epoch 1 on disk (flushed
    at the epoch's end) and the continued session's zip holds epochs 1 and 2 once each. Comet's killed session left no
    zip (comet_ml builds it at the end; the empty one is its probe of the folder at the start): only the resumed
    session's, under the same key, with epoch 2."""
    project = offline_env / "runs"
    # as a process that had a ClearML task leaves it to its children: without its own task, the run would get a stub
    env = {**os.environ, "CLEARML_PROC_MASTER_ID": f"{os.getpid()}:"}
    r = subprocess.run([sys.executable, "-c", KILLED_AFTER_FIRST_EPOCH, str(shapes_detect), str(project)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    cache = offline_env / "clearml-cache" / "offline"
    [folder] = [p for p in cache.iterdir() if p.is_dir()]
    assert not list(cache.glob("*.zip")), "the killed process never closed its session"
    trainer, _ = train.run(resume=str(project / "exp" / "weights" / "last.pt"))
    assert tracker_runs(trainer)["clearml"] == folder.name
    _, scalars, _, _ = read_clearml(offline_env / "clearml-cache", folder.name)
    assert sorted(scalars[("train", "box_loss")]) == [1, 2] and sorted(scalars[("metrics", "mAP50(B)")]) == [1, 2]
    zips = {z: zipfile.ZipFile(z).namelist() for z in (trainer.save_dir / "comet").glob("*.zip")}
    readable = [z for z, names in zips.items() if "experiment.json" in names]
    assert len(readable) == 1 and [names for names in zips.values() if "experiment.json" not in names] == [[]]
    [(meta, messages)] = read_comet(trainer.save_dir / "comet", readable)
    assert meta["offline_id"] == tracker_runs(trainer)["comet"] and meta["resume_strategy"] == "get"
    assert sorted(comet_metrics(messages)["train/box_loss"]) == [2]


def _warnings_naming(log, name):
    return [m for m in log if m.startswith(f"WARNING: {name}:")]


def test_a_package_raising_on_log_is_one_warning_and_the_run_goes_on(shapes_detect, offline_env, monkeypatch,
                                                                      yolo_log):
    from clearml import Logger
    from comet_ml.experiment import CometExperiment

    def refused(*args, **kwargs):
        raise RuntimeError("upload refused")

    monkeypatch.setattr(Logger, "report_scalar", refused)
    monkeypatch.setattr(CometExperiment, "log_metrics", refused)
    trainer, metrics = train.run(data=str(shapes_detect), epochs=2, project=str(offline_env / "runs"), noplots=True,
                                 loggers="csv,clearml,comet", **SMALL)
    assert "fitness" in metrics and sorted(results_rows(trainer.save_dir)) == [1, 2]
    for name in ("clearml", "comet"):
        [w] = _warnings_naming(yolo_log, name)
        assert "logging the epoch failed" in w and "RuntimeError: upload refused" in w


def _train_online(shapes_detect, tmp_path, **env):
    """train.py in a new process (ClearML reads its offline mode once per process), online, without any ClearML
    configuration or Comet key, stdin closed: neither package may ask on the terminal or wait on a server."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CLEARML_", "TRAINS_", "COMET_"))}
    clean.update(HOME=str(tmp_path / "home"), CLEARML_CACHE_DIR=str(tmp_path / "clearml-cache"), **env)
    r = subprocess.run([sys.executable, "train.py", "--data", str(shapes_detect), "--epochs", "1", "--imgsz", "64",
                        "--batch-size", "8", "--workers", "0", "--device", "cpu", "--noplots", "--noval",
                        "--cfg", "yolov5n.yaml", "--project", str(tmp_path / "runs"), "--loggers", "csv,clearml,comet"],
                       cwd=ROOT, env=clean, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def test_missing_credentials_are_one_warning_each(shapes_detect, tmp_path):
    lines = _train_online(shapes_detect, tmp_path)
    [c] = _warnings_naming(lines, "clearml")
    assert "not configured" in c
    [k] = _warnings_naming(lines, "comet")
    assert "no API key" in k
    assert (tmp_path / "runs" / "exp" / "results.csv").is_file()


def test_a_clearml_server_that_does_not_answer_is_one_warning(shapes_detect, tmp_path):
    from tests.ddp_utils import free_port

    lines = _train_online(shapes_detect, tmp_path, CLEARML_API_HOST=f"http://127.0.0.1:{free_port()}",
                          CLEARML_API_ACCESS_KEY="key", CLEARML_API_SECRET_KEY="secret")
    [c] = _warnings_naming(lines, "clearml")
    assert "does not answer" in c


def test_a_missing_package_is_one_warning(shapes_detect, offline_env, monkeypatch, yolo_log):
    monkeypatch.setitem(sys.modules, "comet_ml", None)  # `import comet_ml` raises ImportError
    monkeypatch.setitem(sys.modules, "clearml", None)
    trainer, metrics = train.run(data=str(shapes_detect), epochs=1, project=str(offline_env / "runs"), noplots=True,
                                 noval=True, loggers="csv,clearml,comet", **SMALL)
    assert "fitness" in metrics and tracker_runs(trainer) == {}
    for name, package in (("clearml", "clearml"), ("comet", "comet_ml")):
        [w] = _warnings_naming(yolo_log, name)
        assert f"pip install {package}" in w


def _tracker_and_event(name, tmp_path):
    """The tracker `name` and a set-up event of a run in tmp_path/exp."""
    from engine.callbacks import Event
    from engine.loggers import TRACKERS, build_loggers

    [_, tracker] = build_loggers([name], tmp_path)  # results.csv first, always
    assert type(tracker).__name__ == TRACKERS[name][1]
    event = Event("on_pretrain_routine_end", tmp_path / "exp", main=True, epoch=0, project=str(tmp_path),
                  config={"epochs": 1, "hyp": {"lr0": 0.01}})
    event.save_dir.mkdir(parents=True)
    return tracker, event


def test_a_start_failing_after_the_task_opened_closes_it(tmp_path, offline_env, monkeypatch, yolo_log):
    """ClearML's Task.init done, then the config refused: one warning, the task closed (no ClearML hooks or main task
    left in the process); Comet's experiment started, then its parameters refused: one warning, the zip written."""
    from clearml import Task
    from comet_ml.experiment import CometExperiment

    def refused(*args, **kwargs):
        raise RuntimeError("config refused")

    monkeypatch.setattr(Task, "connect", refused)
    monkeypatch.setattr(CometExperiment, "log_parameters", refused)
    for name in ("clearml", "comet"):
        tracker, event = _tracker_and_event(name, tmp_path / name)
        tracker.on_pretrain_routine_end(event)
        [w] = _warnings_naming(yolo_log, name)
        assert "starting failed" in w and "RuntimeError: config refused" in w and not tracker.active
    assert Task.current_task() is None
    assert [z.name for z in (tmp_path / "comet" / "exp" / "comet").glob("*.zip")]


@pytest.mark.parametrize("name", ["clearml", "comet"])
def test_starting_a_tracker_leaves_the_process_as_it_was(tmp_path, offline_env, name):
    """The random streams, the signal handlers, sys.excepthook and sys.exit after a tracker's start are those before
    it, and a forked child (a DataLoader worker) starts no ClearML of its own."""
    tracker, event = _tracker_and_event(name, tmp_path)
    handler = signal.signal(signal.SIGINT, lambda *a: None)
    before = (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist(),
              signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook, sys.exit)
    try:
        tracker.on_pretrain_routine_end(event)
        assert tracker.active and tracker.state_dict()[name]
        after = (random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist(),
                 signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.excepthook, sys.exit)
        assert after == before
        if name == "clearml":
            from clearml.binding.environ_bind import PatchOsFork

            assert PatchOsFork._current_task is None, "a forked worker would start ClearML's reporting"
    finally:
        tracker.on_train_interrupted(dataclasses.replace(event, name="on_train_interrupted"))
        signal.signal(signal.SIGINT, handler)


def test_a_run_id_that_is_not_text_is_one_warning_and_never_reaches_the_checkpoint(tmp_path, yolo_log):
    """A package handing back an object for an id (ClearML's stub task does): the checkpoint, which stores the id,
    could not be saved with it; the tracker is off instead."""
    from tests.engine.test_trackers import Flaky, _drive, _run_events

    class Odd(Flaky):
        def open(self, event, run_id):
            super().open(event, run_id)
            return object()

    tracker = Odd()
    _drive(tracker, _run_events(tmp_path), [0, 1])
    [w] = _warnings_naming(yolo_log, "flaky")
    assert "starting failed" in w and "gave no run id" in w
    assert tracker.state_dict() == {} and [c[0] for c in tracker.calls] == ["open", "close"]


def test_the_offline_view_reads_both_zips_as_results_csv(offline_run):
    """engine/loggers/offline.py reads the ClearML session and the Comet experiment zips back as results.csv."""
    from engine.loggers.offline import read

    trainer, cache = offline_run
    rows = results_rows(trainer.save_dir)
    [comet_zip] = (trainer.save_dir / "comet").glob("*.zip")
    for path in (cache / "offline" / f"{tracker_runs(trainer)['clearml']}.zip", comet_zip):
        metrics = read(path)
        for epoch, row in rows.items():
            for column, value in row.items():
                if column != "epoch":
                    assert metrics[column][epoch] == pytest.approx(float(value), rel=1e-4), (path.name, column)
