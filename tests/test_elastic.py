"""Fault tolerance: a SIGKILLed worker under torchrun --max-restarts 1 costs a restart, not the run.

Every killed run must finish in its own folder, with each epoch once in results.csv, after resuming from the
checkpoint that was on disk when the worker died, and (with --deterministic) end with exactly the weights of an
uninterrupted run: augmentations, sample order and worker seeds are functions of (seed, epoch, rank, index), and
every rank's RNG states travel in the checkpoint.
"""

import contextlib
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.options import TrainOptions
from tests.ddp_utils import descendants, free_port
from utils.files import ROOT

DRIVER = Path(__file__).with_name("elastic_driver.py")
EPOCHS, NB = 2, 4  # 16 images, 2 per rank and step: 4 batches per epoch


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _train_args(data, project, name, workers):
    return ["--data", str(data), "--imgsz", "64", "--batch-size", "4", "--epochs", str(EPOCHS), "--workers",
            str(workers), "--device", "cpu", "--cfg", "yolov5n.yaml", "--deterministic", "--noval",
            "--save-interval", "1it", "--project", str(project), "--name", name]


def _launch(launcher, args, env, timeout=400):
    cmd = [sys.executable, "-m", *launcher, str(DRIVER), *args]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_hung([p])
            out, err = p.communicate()
            pytest.fail(f"{' '.join(launcher)} hung for {timeout} s:\n{out[-4000:]}\n{err[-8000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _stop_hung(launchers):
    """Every worker under the launchers prints its threads' stacks (the driver's SIGUSR2 handler), then all die."""
    for pid in [pid for p in launchers for pid in descendants(p.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR2)
    time.sleep(2)
    for pid in [pid for p in launchers for pid in [*descendants(p.pid), p.pid]]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _max_diff(a, b):
    return max((a[k][n] - b[k][n]).abs().max().item() for k in a for n in a[k])


def _check_run(run_dir, reference, expected_starts):
    """One folder, each epoch once, the restart began where the last checkpoint was, the reference's weights."""
    assert not run_dir.with_name(f"{run_dir.name}2").exists(), "the restart opened a new run folder"
    epochs = [int(r["epoch"]) for r in csv.DictReader(open(run_dir / "results.csv"))]
    assert epochs == list(range(1, EPOCHS + 1))
    for rank in (0, 1):
        # "restart epoch batch"; with c10d, a machine whose own worker did not fail may restart without counting
        lines = (run_dir / f"starts_rank{rank}.txt").read_text().splitlines()
        starts = [" ".join(line.split()[1:3]) for line in lines]
        assert starts == ["0 0", expected_starts], (rank, starts)
    assert not list(run_dir.rglob("*.tmp")), "a temp file survived the next save"
    assert torch.load(run_dir / "weights" / "last.pt", weights_only=True)["optimizer"] is None  # finished
    diff = _max_diff(torch.load(run_dir / "final_weights.pt"), reference)
    assert diff <= 1e-6, f"resumed run ends {diff:.3g} away from the uninterrupted one"


@pytest.fixture(scope="module")
def elastic_setup(tmp_path_factory):
    """The data, and the uninterrupted reference run, launched with the older torch.distributed.launch (which
    passes --local-rank to the script)."""
    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml

    root = tmp_path_factory.mktemp("elastic")
    generate_dataset(root / "data", task="detect", n_train=16, n_val=4, seed=0, min_side=64, max_side=96)
    data = write_yaml(root / "data", "detect")
    project = root / "runs"
    r = _launch(["torch.distributed.launch", "--nproc_per_node", "2", "--master_port", str(free_port())],
                _train_args(data, project, "ref", 0), _env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader(open(project / "ref" / "results.csv")))
    assert [int(row["epoch"]) for row in rows] == list(range(1, EPOCHS + 1))
    return data, project, torch.load(project / "ref" / "final_weights.pt")


@pytest.mark.parametrize("rdzv,kill,workers,expected", [
    # rank 1 dies before batch 2 of epoch 1: the checkpoint after batch 1 is the one to continue from
    ("static", {"KILL_RANK": "1", "KILL_AT": "1:2"}, 2, "1 2"),
    # rank 0 dies inside the first checkpoint write at or after batch 1 of epoch 1, leaving a partial temp file:
    # the last good checkpoint is the end of epoch 0
    ("c10d", {"KILL_RANK": "0", "KILL_AT": "1:1", "KILL_IN_SAVE": "1"}, 0, "1 0"),
])
@pytest.mark.ddp
def test_killed_worker_restarts_where_the_run_was(elastic_setup, rdzv, kill, workers, expected):
    data, project, reference = elastic_setup
    port = free_port()
    launcher = ["torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1"]
    launcher += ["--master_port", str(port)] if rdzv == "static" else ["--rdzv-backend", "c10d", "--rdzv-endpoint",
                                                                        f"127.0.0.1:{port}"]
    name = f"{rdzv}{kill['KILL_RANK']}"
    t0 = time.time()
    r = _launch(launcher, _train_args(data, project, name, workers), _env(**kill))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"{name}: {time.time() - t0:.1f} s with one restart")
    batch = int(expected.split()[1])  # the epoch is the second, 1 counted from 0
    at = f"at epoch 2/{EPOCHS} batch {batch}/{NB}" if batch else f"after epoch 1/{EPOCHS}"
    assert f"Resuming training from {project / name / 'weights' / 'last.pt'} {at}" in r.stdout
    _check_run(project / name, reference, expected)


@pytest.mark.ddp
def test_multi_node_loopback_recovers_a_killed_worker(elastic_setup):
    """Two launchers on one machine (one process each, c10d rendezvous); the worker of global rank 1 dies."""
    data, project, reference = elastic_setup
    port = free_port()
    args = _train_args(data, project, "nodes", 0)
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--node_rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--max-restarts", "1", str(DRIVER), *args]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(KILL_RANK="1", KILL_AT="0:2"),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=400)[0] for p in procs]
    except subprocess.TimeoutExpired:
        _stop_hung(procs)
        pytest.fail("the two launchers hung for 400 s:\n" + "\n".join(p.communicate()[0][-6000:] for p in procs))
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    _check_run(project / "nodes", reference, "0 2")


@pytest.mark.ddp
def test_a_restarted_group_continues_its_tracker_runs(shapes_detect, tmp_path):
    """Rank 1 dies in epoch 2 under torchrun --max-restarts 1, with W&B (offline), MLflow (local store), ClearML and
    Comet (offline) logging: the restart continues the same tracker runs, each epoch is logged once, and only rank 0
    imported a tracker. Comet writes its offline zip when the experiment ends, so the first start's <key>.zip holds
    what rank 0 ended with, which is a race: its empty probe when the agent's SIGTERM ends it first, the first epoch
    when its collective fails first and it ends through the exception, a file cut short when the SIGTERM comes while
    it archives. The restart's zip, <key>-<suffix>.zip, holds the second epoch under the same key in every case."""
    import zipfile

    from tests.engine.test_trackers import metric_steps, mlflow_runs, read_wandb
    from tests.engine.test_trackers_offline import comet_metrics, read_clearml, read_comet

    project = tmp_path / "runs"
    args = ["--data", str(shapes_detect), "--imgsz", "64", "--batch-size", "4", "--epochs", "2", "--workers", "0",
            "--device", "cpu", "--cfg", "yolov5n.yaml", "--noplots", "--project", str(project), "--name", "exp",
            "--loggers", "csv", "wandb", "mlflow", "clearml", "comet"]
    env = {k: v for k, v in _env().items() if k != "MLFLOW_TRACKING_URI"}
    # wandb-core writes the offline run file every 15 s and drops what it holds when its process dies: at 0.2 s the
    # first epoch's row is on disk before rank 1 dies, 3 batches into the second epoch
    env.update(KILL_RANK="1", KILL_AT="1:3", WANDB_MODE="offline", WANDB_SILENT="true",
               WANDB__TRANSACTION_LOG_FLUSH_INTERVAL="0.2", CLEARML_OFFLINE_MODE="1",
               CLEARML_CACHE_DIR=str(tmp_path / "clearml-cache"), COMET_START_ONLINE="false",
               **{k: str(tmp_path / k.lower()) for k in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")})
    launcher = ["torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1", "--master_port",
                str(free_port())]
    r = _launch(launcher, args, env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_dir = project / "exp"
    assert (run_dir / "killed_at.txt").is_file() and "torchrun restart 1" in r.stdout
    client, runs = mlflow_runs(project)
    assert len(runs) == 1, "one MLflow run: rank 1 opened none, the restart opened none"
    assert runs[0].info.status == "FINISHED"
    assert metric_steps(client, runs[0], "train/box_loss") == [1, 2]
    assert metric_steps(client, runs[0], "metrics/mAP50_B") == [1, 2]
    wandb_runs = read_wandb(run_dir)
    assert len(wandb_runs) == 2 and len({run_id for run_id, *_ in wandb_runs}) == 1, "one W&B run id, two starts"
    logged = [step for _, _, history, _ in wandb_runs for step, row in history.items() if "train/box_loss" in row]
    assert logged == [1, 2]
    [session] = [p for p in (tmp_path / "clearml-cache" / "offline").iterdir() if p.is_dir()]
    _, scalars, _, _ = read_clearml(tmp_path / "clearml-cache", session.name)
    assert sorted(scalars[("train", "box_loss")]) == [1, 2] and sorted(scalars[("metrics", "mAP50(B)")]) == [1, 2]
    [restart] = (run_dir / "comet").glob("*-*.zip")
    key = restart.stem.split("-")[0]
    first = run_dir / "comet" / f"{key}.zip"
    assert sorted((run_dir / "comet").glob("*.zip")) == sorted([first, restart])
    [(meta, messages)] = read_comet(run_dir / "comet", [restart])
    assert meta["offline_id"] == key and sorted(comet_metrics(messages)["train/box_loss"]) == [2]
    if zipfile.is_zipfile(first) and zipfile.ZipFile(first).namelist():
        [(meta, messages)] = read_comet(run_dir / "comet", [first])
        assert meta["offline_id"] == key and sorted(comet_metrics(messages)["train/box_loss"]) == [1]
    assert (run_dir / "trackers_rank0.txt").read_text().split() == ["wandb", "mlflow", "clearml", "comet_ml"]
    assert (run_dir / "trackers_rank1.txt").read_text() == "", "rank 1 imported a tracker package"


@pytest.mark.ddp
def test_a_lost_peer_is_one_line_and_the_launcher_names_the_one_that_died(shapes_detect, tmp_path):
    """Rank 1 is SIGKILLed in epoch 1 with no restarts left. Rank 0's gradient all-reduce fails first (the agent
    looks every 5 s): it says so in one line, on a line of its own, not in a traceback, and waits for the agent, so
    that torchrun's summary names rank 1 as the root cause rather than the rank that only met the failure."""
    args = ["--data", str(shapes_detect), "--imgsz", "64", "--batch-size", "4", "--epochs", "1", "--workers", "0",
            "--device", "cpu", "--cfg", "yolov5n.yaml", "--noval", "--noplots", "--project", str(tmp_path)]
    launcher = ["torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "0", "--monitor-interval", "5",
                "--master_port", str(free_port())]
    r = _launch(launcher, args, _env(KILL_RANK="1", KILL_AT="0:2"))
    assert r.returncode == 1, r.stderr[-3000:]
    said = [line for line in r.stderr.split("\n") if "error:" in line]  # "\r" (the progress bar's) is no new line
    # which end of the pair notices first decides between gloo's two wordings
    lost = (r"^error: rank 0 lost contact with another process of this run \((Read error \S+: )?"
            r"Connection (closed|reset)")
    assert len(said) == 1 and re.match(lost, said[0]), said
    assert r.stderr.count("Traceback") == 1, "a worker printed a traceback (the one is torchrun's own)"
    root = r.stderr.split("Root Cause")[1]
    assert "rank      : 1 (local_rank: 1)" in root and "SIGKILL" in root, root


@pytest.mark.slow
def test_single_process_exact_resume_between_and_inside_epochs(elastic_setup, tmp_path):
    """An interrupted run resumed by hand with --resume ends with the weights of an uninterrupted one: between
    epochs with 0 workers, inside an epoch with 2."""
    import train
    from engine.tasks import TASKS
    DetectionTrainer = TASKS["detect"].trainer
    from engine.trainer import run
    from tests.probes import probing

    data = elastic_setup[0]
    weights = {}

    def keep(trainer):
        weights[trainer.save_dir.name] = {"model": {k: v.clone() for k, v in trainer.model.state_dict().items()}}

    class Stop(Exception):
        pass

    def stop_at(epoch, batch):
        def arm(trainer):
            preprocess, seen = trainer.preprocess_batch, {"n": 0}

            def counting(b):
                if seen["n"] == epoch * trainer.data_plan.batches_per_epoch + batch:
                    raise Stop
                seen["n"] += 1
                return preprocess(b)

            trainer.preprocess_batch = counting
        return arm

    single = ["--batch-size", "2"]  # 8 batches per epoch in one process
    keeping = probing(DetectionTrainer, {"on_train_end": [keep]})
    run(keeping, train.parse_opt(_train_args(data, tmp_path, "ref", 0) + single))
    for name, workers, (epoch, batch) in (("between", 0, (1, 0)), ("inside", 2, (1, 3))):
        with pytest.raises(Stop):
            run(probing(DetectionTrainer, {"on_train_start": [stop_at(epoch, batch)]}),
                train.parse_opt(_train_args(data, tmp_path, name, workers) + single))
        last = tmp_path / name / "weights" / "last.pt"
        ckpt = torch.load(last, weights_only=True)
        # the last checkpoint: the end of epoch 0, or one inside epoch 1 (--save-interval 1it saves after each
        # optimizer step, and accumulation spaces the steps)
        assert ckpt["epoch"] + 1 == epoch and (0 < ckpt["batch"] <= batch if batch else ckpt["batch"] == 0)
        opt = train.parse_opt(["--resume", str(last), "--workers", str(workers), "--device", "cpu"])
        run(keeping, opt)
        assert _max_diff(weights[name], weights["ref"]) <= 1e-6, name
        epochs = [int(r["epoch"]) for r in csv.DictReader(open(tmp_path / name / "results.csv"))]
        assert epochs == list(range(1, EPOCHS + 1))


def _fake_run(project, name, finished, epochs=5, mtime=None):
    """A run folder whose last.pt holds the parts --resume reads (an unfinished one keeps its optimizer)."""
    last = project / name / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    opt = {"epochs": epochs, "batch_size": 8, "imgsz": 64, "device": "", "workers": 2, "resume": False}
    torch.save({"epoch": 1, "batch": 0, "optimizer": None if finished else {"state": {}}, "opt": opt}, last)
    if mtime:
        os.utime(last, (mtime, mtime))
    return last


def _typed(argv):
    """train.py's options for `argv`, typed as engine/trainer.run types them before resume reads them."""
    import train

    return TrainOptions.from_values(train.parse_opt(argv).opt)


def test_bare_resume_picks_the_newest_unfinished_run(tmp_path):
    from engine.resume import resume_opt
    from utils.errors import BadCheckpoint, BadOption

    project = tmp_path / "runs"
    old = _fake_run(project, "exp", finished=False, mtime=time.time() - 100)
    _fake_run(project, "exp2", finished=True)  # newer, but finished
    opt, path = resume_opt(_typed(["--resume", "--project", str(project)]), "runs/train")
    assert path == old and opt.epochs == 5 and opt.resume is False
    _fake_run(project, "exp3", finished=False, mtime=time.time() - 200)
    assert resume_opt(_typed(["--resume", "--project", str(project)]), "runs/train")[1] == old
    done = tmp_path / "done"
    _fake_run(done, "exp", finished=True)
    with pytest.raises(BadOption, match="every run under .* has finished"):
        resume_opt(_typed(["--resume", "--project", str(done)]), "runs/train")
    finished = done / "exp" / "weights" / "last.pt"
    with pytest.raises(BadCheckpoint, match=f"has finished .* start a new run with --weights {finished} --epochs N"):
        resume_opt(_typed(["--resume", str(finished)]), "runs/train")


def test_resume_auto_starts_a_run_continues_it_and_refuses_what_cannot_continue(tmp_path):
    """--resume auto: a new run in --project/--name, then the same command continues it (the options it repeats are
    no change, --device is this launch's), another value is refused, and so is a finished run or a folder holding a
    run without last.pt."""
    import train
    from engine.resume import plan_run
    from utils.errors import BadOption

    project = tmp_path / "runs"
    cmd = ["--resume", "auto", "--project", str(project), "--name", "job7", "--epochs", "5", "--batch-size", "8",
           "--imgsz", "64", "--device", "cpu"]

    def plan(argv):
        return plan_run(_typed(argv), "runs/train", train.parse_opt(argv).given)

    opt, resume_from, run_dir = plan(cmd)
    assert (resume_from, run_dir, opt.resume, opt.name) == (None, project / "job7", "auto", "job7")
    last = _fake_run(project, "job7", finished=False)
    opt, resume_from, run_dir = plan(cmd)
    assert (resume_from, run_dir, opt.resume, opt.device, opt.batch_size) == (last, project / "job7", "auto", "cpu", 8)
    with pytest.raises(BadOption, match="--imgsz would change it"):
        plan([*cmd, "--imgsz", "96"])
    assert plan([*cmd, "--epochs", "9"])[0].epochs == 9  # extends it, as with --resume PATH
    _fake_run(project, "done", finished=True)
    with pytest.raises(BadOption, match=r"--resume auto: .*done holds a finished run"):
        plan([*cmd, "--name", "done"])
    (project / "csv-only").mkdir()
    (project / "csv-only" / "results.csv").write_text("epoch\n1\n")
    with pytest.raises(BadOption, match=r"csv-only holds a run that cannot continue \(results.csv"):
        plan([*cmd, "--name", "csv-only"])


def test_resume_refuses_options_that_change_the_run_and_extends_epochs(tmp_path, capsys):
    import train
    from engine.resume import resume_opt
    from utils.errors import BadOption

    last = _fake_run(tmp_path, "exp", finished=False)
    opt, given = train.parse_opt(["--resume", str(last), "--batch-size", "16", "--img=128", "--workers", "0"])
    with pytest.raises(BadOption) as e:
        resume_opt(TrainOptions.from_values(opt), "runs/train", given)
    assert "--batch-size, --imgsz would change it" in str(e.value)
    opt, given = train.parse_opt(["--resume", str(last), "--epoch", "9", "--device", "cpu"])  # an abbreviation too
    saved, _ = resume_opt(TrainOptions.from_values(opt), "runs/train", given)
    assert (saved.epochs, saved.batch_size, saved.device) == (9, 8, "cpu")
    # options the checkpoint predates (the fake run saved only six) come from the defaults
    defaults = vars(train.parse_opt([]).opt)
    assert saved.hyp == defaults["hyp"] and saved.optimizer == defaults["optimizer"] and saved.seed == defaults["seed"]
    with pytest.raises(BadOption, match="already trained 2 epochs"):
        opt, given = train.parse_opt(["--resume", str(last), "--epochs", "2"])
        resume_opt(TrainOptions.from_values(opt), "runs/train", given)
    # the user's view: one line and exit status 2
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--resume", str(last), "--batch-size", "16",
                        "--device", "cpu"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --resume continues a run")
    assert "Traceback" not in r.stderr


def test_results_csv_rows_are_keyed_by_epoch(tmp_path):
    from engine.loggers import CSVLogger

    log = CSVLogger(tmp_path / "results.csv")
    log.log(1, {"a": 1.0})
    log.log(2, {"a": 2.0})
    log.log(2, {"a": 3.0, "b": 4.0})  # epoch 2 again after a resume: replaces its row
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [(r["epoch"], r["a"], r["b"]) for r in rows] == [("1", "1", ""), ("2", "3", "4")]
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_save_leaves_no_temp_files_of_killed_saves(tmp_path):
    from utils.files import atomic_save

    killed = tmp_path / ".last.pt.abc123.tmp"  # what a SIGKILL during torch.save leaves
    killed.write_bytes(b"partial")
    atomic_save({"epoch": 3}, tmp_path / "last.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert torch.load(tmp_path / "last.pt")["epoch"] == 3


def test_save_interval_values():
    from engine.checkpointer import parse_save_interval
    from utils.errors import BadOption

    assert parse_save_interval("10m") == ("s", 600.0) and parse_save_interval("90s") == ("s", 90.0)
    assert parse_save_interval("2h") == ("s", 7200.0) and parse_save_interval("500it") == ("it", 500.0)
    assert parse_save_interval("0") == ("off", 0) and parse_save_interval("0m") == ("off", 0)
    for bad in ("10", "m", "5 minutes", "-3it"):
        with pytest.raises(BadOption, match="--save-interval"):
            parse_save_interval(bad)


@pytest.mark.parametrize("script", ["train", "val", "detect", "segment.predict", "classify.val"])
def test_older_launcher_local_rank_spellings(script, monkeypatch):
    import importlib

    parse = importlib.import_module(script).parse_opt
    extra = ["--weights", "x.pt"] if "val" in script else []
    # parse_opt sets LOCAL_RANK itself; recording it first makes monkeypatch restore it (an unset one is not recorded
    # by delenv, and a leaked LOCAL_RANK=1 turns later tests' processes into non-zero local ranks)
    monkeypatch.setenv("LOCAL_RANK", "recorded")
    for argv, env, expected in ((["--local-rank=1"], None, "1"), (["--local_rank", "1"], None, "1"),
                                (["--local-rank=1"], "0", "0")):  # LOCAL_RANK, when set, wins
        if env is None:
            monkeypatch.delenv("LOCAL_RANK", raising=False)
        else:
            monkeypatch.setenv("LOCAL_RANK", env)
        parsed = parse(argv + extra)
        assert (parsed.opt if script == "train" else parsed).local_rank == 1  # a train script's: utils/cli.Parsed
        assert os.environ["LOCAL_RANK"] == expected
