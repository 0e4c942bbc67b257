"""Experiment trackers (engine/loggers/wandb.py, mlflow.py) with their real packages, offline: W&B's offline run read
back with wandb's own transaction-log reader, MLflow's local sqlite store read back with MlflowClient. A run resumed
by hand continues the same tracker run; a tracker that fails in any way is one warning and the run goes on. The
torchrun restart and the 2-rank case are in tests/test_elastic.py."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import train
from engine.loggers.tracker import Tracker
from utils.cli import options_from_kwargs
from utils.errors import BadOption, Interrupted
from utils.files import ROOT

SMALL = dict(cfg="yolov5n.yaml", imgsz=64, batch_size=8, workers=0, device="cpu")  # 2 batches of 8 per epoch


def tracker_runs(trainer):
    """{tracker name: run id} as the run's checkpoints hold it: each tracker keeps its own (engine/callbacks.py)."""
    return trainer.callbacks.components()["tracker_runs"].state_dict()


@pytest.fixture
def tracker_env(monkeypatch, tmp_path):
    """W&B offline, its caches in the test's folder; MLflow's default store (the --project folder)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def read_wandb(run_folder):
    """[(run id, config, {step: history row}, [(artifact type, [files])])] of every offline W&B run under
    `run_folder`, read by wandb's own reader of the run's transaction log (`wandb leet inspect --json`)."""
    runs = []
    for d in sorted((run_folder / "wandb").glob("offline-run-*")):
        r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(d)], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        run_id, config, history, artifacts = None, {}, {}, []
        for record in map(json.loads, r.stdout.splitlines()):
            kind = record.get("type")
            if kind == "run":
                run_id, config = record["run"]["run_id"], record["run"]["config"]["update"]
            elif kind == "history":
                step = int(record["history"]["step"].get("num", 0))
                assert step not in history, f"step {step} written twice"
                history[step] = record["history"]["item"]
            elif kind == "artifact":
                files = [c["path"] for c in record["artifact"]["manifest"]["contents"]]
                artifacts.append((record["artifact"]["type"], files))
        runs.append((run_id, config, history, artifacts))
    return runs


def mlflow_runs(project):
    """(client, runs) of the default MLflow store of `project` (engine/loggers/mlflow.py), every experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project.resolve() / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    return client, client.search_runs(ids)


def metric_steps(client, run, key):
    return [m.step for m in client.get_metric_history(run.info.run_id, key)]


def results_rows(run_folder):
    return {int(r["epoch"]): r for r in csv.DictReader(open(run_folder / "results.csv"))}


@pytest.fixture(scope="module")
def tracked_run(shapes_detect, tmp_path_factory):
    """A 2-epoch run logged to W&B (offline) and MLflow (local store) at once."""
    tmp = tmp_path_factory.mktemp("trackers")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DATA_DIR": str(tmp / "wandb-data"),
           "WANDB_CACHE_DIR": str(tmp / "wandb-cache"), "WANDB_CONFIG_DIR": str(tmp / "wandb-config")}
    with pytest.MonkeyPatch.context() as mp:  # module scope: the function-scoped monkeypatch is not available
        for k, v in env.items():
            mp.setenv(k, v)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        trainer, _ = train.run(data=str(shapes_detect), epochs=2, project=str(tmp / "runs"),
                               loggers="csv,tensorboard,wandb,mlflow", **SMALL)
    return trainer


def test_wandb_offline_run_holds_every_results_column_for_both_epochs(tracked_run):
    rows = results_rows(tracked_run.save_dir)
    [(run_id, config, history, artifacts)] = read_wandb(tracked_run.save_dir)
    assert run_id == tracker_runs(tracked_run)["wandb"]
    assert config["epochs"] == 2 and config["imgsz"] == 64 and "lr0" in config["hyp"]
    for epoch, row in rows.items():
        for column, value in row.items():
            if column != "epoch":
                assert history[epoch][column] == pytest.approx(float(value), rel=1e-4), (epoch, column)
    sent = {k.split(".")[0] for item in history.values() for k in item if k.endswith("._type")}
    assert {"labels", "train_batch0", "val_batch0_pred", "confusion_matrix", "PR_curve", "results"} <= sent
    assert ("model", ["best.pt"]) in artifacts
    assert any(files == ["per_class.table.json"] for _, files in artifacts), "the final per-class table"


def test_mlflow_run_holds_params_every_metric_per_epoch_and_best_pt(tracked_run):
    from engine.loggers.mlflow import mlflow_name

    client, runs = mlflow_runs(tracked_run.save_dir.parent)
    [run] = runs
    assert run.info.run_id == tracker_runs(tracked_run)["mlflow"] and run.info.status == "FINISHED"
    assert run.info.run_name == tracked_run.save_dir.name
    assert run.data.params["epochs"] == "2" and "hyp/lr0" in run.data.params
    rows = results_rows(tracked_run.save_dir)
    for column in rows[1]:
        if column != "epoch":
            history = client.get_metric_history(run.info.run_id, mlflow_name(column))
            assert [(m.step, m.value) for m in history] == [(e, pytest.approx(float(rows[e][column]), rel=1e-4))
                                                             for e in (1, 2)], column
    weights = [a.path for a in client.list_artifacts(run.info.run_id, "weights")]
    assert weights == ["weights/best.pt"]
    local = client.download_artifacts(run.info.run_id, "weights/best.pt", str(tracked_run.save_dir / "dl"))
    assert open(local, "rb").read() == (tracked_run.save_dir / "weights" / "best.pt").read_bytes()
    pictures = {os.path.basename(a.path) for a in client.list_artifacts(run.info.run_id, "pictures")}
    assert {"labels.jpg", "results.png", "confusion_matrix.png"} <= pictures
    table = json.loads(open(client.download_artifacts(run.info.run_id, "per_class.json",
                                                      str(tracked_run.save_dir / "dl"))).read())
    assert table["columns"][:3] == ["class", "images", "instances"] and len(table["data"]) >= 1


@pytest.fixture
def mlflow_server(tmp_path):
    """A real `mlflow server` on 127.0.0.1 (sqlite store, artifacts served through it), stopped with the test."""
    import urllib.request

    from tests.ddp_utils import free_port

    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(["timeout", "600", sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1",
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                               "--artifacts-destination", str(tmp_path / "served")],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),
                              start_new_session=True)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                time.sleep(0.25)
        else:
            pytest.fail("mlflow server did not answer in 60 s")
        yield uri
    finally:
        # the whole group: `timeout`, the server and its worker; a busy CPU can make a graceful stop outlast 30 s
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def test_mlflow_server_receives_params_metrics_and_best_pt_over_http(shapes_detect, tracker_env, monkeypatch,
                                                                     mlflow_server):
    """MLFLOW_TRACKING_URI at a running server: the run, each epoch's metrics and best.pt (uploaded through the
    server's artifact proxy) are read back from the server by MlflowClient; no local store is written."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    trainer, _ = train.run(data=str(shapes_detect), epochs=2, project=str(tracker_env / "runs"), noplots=True,
                           loggers="mlflow", **SMALL)
    client = MlflowClient(tracking_uri=mlflow_server)
    [experiment] = [e for e in client.search_experiments() if e.name == str(tracker_env / "runs")]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == tracker_runs(trainer)["mlflow"] and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "2" and run.data.params["hyp/lr0"] == str(trainer.hyp["lr0"])
    assert metric_steps(client, run, "train/box_loss") == [1, 2]
    assert metric_steps(client, run, "metrics/mAP50-95_B") == [1, 2]
    local = client.download_artifacts(run.info.run_id, "weights/best.pt", str(tracker_env / "dl"))
    assert open(local, "rb").read() == (trainer.save_dir / "weights" / "best.pt").read_bytes()
    assert not (tracker_env / "runs" / "mlflow.db").exists()


def test_a_resume_by_hand_continues_the_same_tracker_runs(shapes_detect, tracker_env):
    """Ctrl-C after epoch 1, then --resume: one W&B run id and one MLflow run, each epoch logged once. The trackers
    add to results.csv, always written, and TensorBoard unless dropped (no-tensorboard, kept by the resumed run);
    --no-log-model, kept too, sends no best.pt."""
    project = tracker_env / "runs"

    def ctrl_c_after_first_epoch(event):
        if event.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C: the loop stops at the epoch's end

    with pytest.raises(Interrupted):
        train.run(data=str(shapes_detect), epochs=2, project=str(project),
                  loggers=["wandb", "mlflow", "no-tensorboard"], noplots=True, log_model=False,
                  callbacks={"on_fit_epoch_end": [ctrl_c_after_first_epoch]}, **SMALL)
    client, [run] = mlflow_runs(project)
    assert run.info.status == "KILLED" and metric_steps(client, run, "train/box_loss") == [1]
    trainer, _ = train.run(resume=str(project / "exp" / "weights" / "last.pt"))
    client, [run] = mlflow_runs(project)
    assert run.info.status == "FINISHED" and run.info.run_id == tracker_runs(trainer)["mlflow"]
    assert metric_steps(client, run, "train/box_loss") == [1, 2]
    assert metric_steps(client, run, "metrics/mAP50_B") == [1, 2]
    wandb_runs = read_wandb(trainer.save_dir)
    assert len(wandb_runs) == 2 and {r[0] for r in wandb_runs} == {tracker_runs(trainer)["wandb"]}
    logged = [step for _, _, history, _ in wandb_runs for step, row in history.items() if "train/box_loss" in row]
    assert logged == [1, 2]
    assert sorted(results_rows(trainer.save_dir)) == [1, 2]
    assert not list(trainer.save_dir.glob("events.out.*"))
    assert client.list_artifacts(run.info.run_id, "weights") == []
    assert not [kind for _, _, _, artifacts in wandb_runs for kind, _ in artifacts if kind == "model"]


def _warnings_naming(log, name):
    return [m for m in log if m.startswith(f"WARNING: {name}:")]


def test_a_failing_tracker_is_one_warning_and_the_run_goes_on(shapes_detect, tracker_env, monkeypatch, yolo_log):
    """W&B's package raises on every log call; MLflow's server does not answer (a closed port): each is one warning
    naming it, the run finishes, and results.csv has both epochs."""
    import wandb
    from wandb.sdk.wandb_run import Run

    from tests.ddp_utils import free_port

    def broken_log(self, *args, **kwargs):
        raise RuntimeError("upload refused")

    monkeypatch.setattr(Run, "log", broken_log)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    trainer, metrics = train.run(data=str(shapes_detect), epochs=2, project=str(tracker_env / "runs"), noplots=True,
                                 loggers="csv,wandb,mlflow", **SMALL)
    assert "fitness" in metrics and sorted(results_rows(trainer.save_dir)) == [1, 2]
    [w] = _warnings_naming(yolo_log, "wandb")
    assert "logging the epoch failed" in w and "RuntimeError: upload refused" in w
    [m] = _warnings_naming(yolo_log, "mlflow")
    assert "starting failed" in m
    assert wandb.run is None, "the failed tracker's run is closed"


def test_a_missing_package_or_login_is_one_warning(shapes_detect, tracker_env, monkeypatch, yolo_log):
    """mlflow not importable; W&B online without an API key (it would otherwise ask on the terminal)."""
    import wandb

    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tracker_env / "no-netrc"))
    wandb.teardown()  # wandb reads its settings from the environment once per process, as a new process would here
    try:
        trainer, metrics = train.run(data=str(shapes_detect), epochs=1, project=str(tracker_env / "runs"),
                                     noplots=True, noval=True, loggers="csv,wandb,mlflow", **SMALL)
    finally:
        wandb.teardown()
    assert "fitness" in metrics
    [m] = _warnings_naming(yolo_log, "mlflow")
    assert "pip install mlflow" in m
    [w] = _warnings_naming(yolo_log, "wandb")
    assert "not logged in" in w
    assert tracker_runs(trainer) == {}


def test_loggers_is_checked_before_any_work(tmp_path):
    with pytest.raises(BadOption, match="--loggers nope: unknown logger"):
        train.run(data="nowhere.yaml", loggers="wandb,nope")
    assert train.parse_opt(["--loggers", "wandb", "mlflow", "--loggers", "csv,wandb"]).opt.loggers == \
        ["csv", "tensorboard", "wandb", "mlflow"]
    assert train.parse_opt([]).opt.loggers == ["csv", "tensorboard"]
    assert train.parse_opt(["--loggers", "wandb,no-tensorboard"]).opt.loggers == ["csv", "wandb"]
    assert train.parse_opt(["--loggers", "none", "mlflow"]).opt.loggers == ["csv", "mlflow"]
    assert options_from_kwargs(train.parse_opt, {"loggers": "none"}).opt.loggers == ["csv"]
    with pytest.raises(BadOption, match="results.csv is the run's record and is always written"):
        train.parse_opt(["--loggers", "no-csv"])
    r = subprocess.run([sys.executable, "train.py", "--loggers", "csv,comet-typo", "--project", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --loggers comet-typo: unknown logger; choose from csv, tensorboard, tensorboard-graph, wandb, mlflow, "
        "clearml, comet (no-NAME drops one, none keeps results.csv alone) (see --help)"]
    assert not list(tmp_path.iterdir()), "no work before the check"


class Flaky(Tracker):
    """A tracker on the shared rules (engine/loggers/tracker.py) whose calls fail where told, recording them all."""

    name = "flaky"

    def __init__(self, fail_on=()):
        super().__init__()
        self.fail_on, self.calls = fail_on, []

    def _call(self, what, *args):
        self.calls.append((what, *args))
        if what in self.fail_on:
            raise ConnectionError(f"{what} refused")

    def open(self, event, run_id):
        self._call("open", run_id)
        return run_id or "run1"

    def log_step(self, metrics, pictures, step):
        self._call("log_step", sorted(metrics), [p.name for p in pictures], step)

    def log_final(self, pictures, table, step):
        self._call("log_final", [p.name for p in pictures], step)

    def log_weights(self, path, step):
        self._call("log_weights", path.name, step)

    def close(self, status="finished"):
        self._call("close", status)


def _run_events(tmp_path):
    """event(name, epoch): what a run in `tmp_path` tells its listeners after `epoch` epochs (weights/best.pt and
    labels.jpg written; every epoch's row {"a": 1.0})."""
    from engine.callbacks import Event

    (tmp_path / "weights").mkdir(exist_ok=True)
    (tmp_path / "weights" / "best.pt").write_bytes(b"w")
    (tmp_path / "labels.jpg").write_bytes(b"j")
    return lambda name, epoch: Event(name, tmp_path, main=True, epoch=epoch, best=tmp_path / "weights" / "best.pt",
                                     row={"a": 1.0}, class_table=(["class"], [["x"]]))


def _drive(tracker, event, epochs):
    """Set-up after `epochs[0]` epochs, then each epoch of `epochs` (numbered from 0), then the end."""
    tracker.on_pretrain_routine_end(event("on_pretrain_routine_end", epochs[0]))
    for e in epochs:
        tracker.on_fit_epoch_end(event("on_fit_epoch_end", e + 1))
    tracker.on_train_end(event("on_train_end", epochs[-1] + 1))


@pytest.mark.parametrize("fail_on", ["open", "log_step", "log_final", "log_weights", "close"])
def test_a_tracker_failing_anywhere_warns_once_and_stops_calling(tmp_path, yolo_log, fail_on):
    tracker = Flaky(fail_on=(fail_on,))
    _drive(tracker, _run_events(tmp_path), [0, 1])
    warnings = [m for m in yolo_log if m.startswith("WARNING: flaky:")]
    assert len(warnings) == 1 and f"ConnectionError: {fail_on} refused" in warnings[0]
    failed_at = next(i for i, c in enumerate(tracker.calls) if c[0] == fail_on)
    after = [c[0] for c in tracker.calls[failed_at + 1:]]
    assert after in ([], ["close"]), after  # at most a closing attempt, never another log
    assert (tracker.state_dict() == {}) == (fail_on == "open")


def test_a_continued_tracker_run_opens_the_recorded_id_and_sends_no_step_twice(tmp_path, yolo_log):
    first = Flaky()
    event = _run_events(tmp_path)
    first.on_pretrain_routine_end(event("on_pretrain_routine_end", 0))
    first.on_fit_epoch_end(event("on_fit_epoch_end", 1))
    first.on_train_interrupted(event("on_train_interrupted", 0))
    assert first.calls == [("open", None), ("log_step", [], ["labels.jpg"], 0), ("log_step", ["a"], [], 1),
                           ("log_weights", "best.pt", 0), ("close", "killed")]
    assert first.state_dict() == {"flaky": "run1"}
    resumed = Flaky()  # a new process: the run id comes from the checkpoint
    resumed.load_state_dict(first.state_dict())
    _drive(resumed, event, [1])
    assert resumed.calls == [("open", "run1"), ("log_step", ["a"], [], 2), ("log_final", [], 2),
                             ("log_weights", "best.pt", 2), ("close", "finished")]
    assert any("flaky: continuing run run1" in m for m in yolo_log)


def test_the_offline_view_shows_every_epoch_with_no_login(tracked_run, tmp_path):
    """engine/loggers/offline.py, as README.md shows it: the W&B offline run and the MLflow store as tables of every
    results.csv column by epoch, in a process with no W&B login, no settings and no network."""
    from engine.loggers.mlflow import mlflow_name

    rows = results_rows(tracked_run.save_dir)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ["PYTHONPATH"], "HOME": str(tmp_path),
           "WANDB_MODE": "offline"}
    [folder] = (tracked_run.save_dir / "wandb").glob("offline-run-*")
    db = tracked_run.save_dir.parent / "mlflow.db"
    r = subprocess.run(["timeout", "300", sys.executable, "-m", "engine.loggers.offline", str(folder), str(db)],
                       env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    shown = [block.splitlines() for block in r.stdout.split("# ")[1:]]
    columns = set(next(iter(rows.values()))) - {"epoch"}
    for lines, name in zip(shown, (str, lambda c: f"{tracked_run.save_dir.name}/{mlflow_name(c)}")):
        header = lines[1].split(",")
        by_step = {line.split(",")[0]: dict(zip(header, line.split(","))) for line in lines[2:]}
        if name is str:  # W&B: the pictures' sizes and the per-class table's shape are no columns, nor their steps
            assert set(header[1:]) == columns and set(by_step) == {str(e) for e in rows}, (header, list(by_step))
        for epoch, row in rows.items():
            values = by_step[str(epoch)]
            for column, value in row.items():
                if column != "epoch":
                    assert float(values[name(column)]) == pytest.approx(float(value), rel=1e-4), (column, epoch)


def test_an_offline_wandb_run_is_named_by_its_folder_without_asking_its_url(tmp_path):
    """wandb warns "URL not available in offline run" when an offline run's url is read: where() must not read it."""
    from engine.loggers.wandb import WandbTracker

    class OfflineRun:
        offline = True
        dir = str(tmp_path / "offline-run-x" / "files")

        @property
        def url(self):
            raise AssertionError("an offline run's url was read")

    tracker = WandbTracker()
    tracker.run = OfflineRun()
    assert tracker.where() == f" offline in {tmp_path / 'offline-run-x'} (wandb sync it to upload)"
