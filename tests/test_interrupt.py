"""Ctrl-C during training (engine/interrupt.py): the run stops after an optimizer step, writes last.pt, prints one
line saying how to resume and exits 130 without a traceback; running that line ends with the weights of an
uninterrupted --deterministic run. Single process and 2-process torchrun (gloo), from the command line."""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from engine.interrupt import StopRequests
from engine.messages import position
from tests.ddp_utils import free_port
from utils.errors import Interrupted
from utils.files import ROOT

EPOCHS = 2
RESUME_LINE = re.compile(r"^interrupted (at epoch 1/2 batch [1-7]/8|after epoch 1/2): resume with (.+)$", re.M)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """32 images of 64-96 px; nbs 4 makes every batch of 4 an optimizer step, so a stop can land inside an epoch
    (8 batches of 4 images in one process, of 2 per rank in two)."""
    from data.synthetic import generate_dataset
    from tests.conftest import write_yaml

    root = tmp_path_factory.mktemp("interrupt")
    generate_dataset(root / "data", task="detect", n_train=32, n_val=4, seed=0, min_side=64, max_side=96)
    hyp = root / "hyp.yaml"
    hyp.write_text("nbs: 4\n")
    return write_yaml(root / "data", "detect"), hyp, root / "runs"


def _args(setup, name):
    data, hyp, project = setup
    return ["train.py", "--data", str(data), "--hyp", str(hyp), "--imgsz", "64", "--batch-size", "4", "--epochs",
            str(EPOCHS), "--workers", "0", "--device", "cpu", "--cfg", "yolov5n.yaml", "--deterministic", "--noval",
            "--noplots", "--project", str(project), "--name", name]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _torchrun(port):
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]


def _run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _interrupt(cmd, signum=signal.SIGINT):
    """Start `cmd` in a session of its own, and send `signum` to the whole session, as a terminal sends Ctrl-C to
    its foreground processes, once training is a few batches into epoch 1. Returns (exit status, stdout, stderr)."""
    p = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    err = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: p.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    try:
        while not re.search(rb"\| [2-7]/8 \[", b"".join(err)) and time.monotonic() < deadline:
            assert p.poll() is None, b"".join(err)[-3000:].decode()
            time.sleep(0.05)
        os.killpg(p.pid, signum)
        out = p.stdout.read()
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    reader.join(timeout=10)
    return p.returncode, out.decode(), b"".join(err).decode()


def _weights(run_dir):
    return torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]["state_dict"]


def _assert_same_weights(run_dir, ref_dir):
    got, ref = _weights(run_dir), _weights(ref_dir)
    assert got.keys() == ref.keys()
    diff = max((got[k].float() - ref[k].float()).abs().max().item() for k in ref)
    assert diff == 0, f"the resumed run ends {diff:.3g} away from the uninterrupted one"


def _no_traceback_of_ours(stderr):
    """torchrun's agent reports the signal with a traceback of its own; none may come from this project."""
    assert "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert not re.search(r'File ".*(/engine/|/utils/|/models/|train\.py)', stderr), stderr[-3000:]


@pytest.fixture(scope="module")
def reference(setup):
    """The uninterrupted single-process run."""
    _run([sys.executable, *_args(setup, "ref")])
    return setup[2] / "ref"


def test_ctrl_c_saves_says_how_to_resume_and_resumes_exactly(setup, reference):
    project = setup[2]
    code, out, err = _interrupt([sys.executable, *_args(setup, "int")])
    assert code == 130, out[-2000:] + err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    lines = RESUME_LINE.findall(out)
    assert len(lines) == 1, out[-2000:]
    cmd = shlex.split(lines[0][1])
    assert cmd[:3] == ["python", "train.py", "--resume"], cmd
    assert torch.load(cmd[3], weights_only=True)["optimizer"] is not None  # a resumable checkpoint
    _run([sys.executable, *cmd[1:]])
    _assert_same_weights(project / "int", reference)


def test_a_spot_machines_sigterm_then_the_same_command_continues_exactly(setup, reference):
    """A spot VM's shutdown sends SIGTERM: the run saves and exits 143; its replacement runs the same command, whose
    --resume auto continues the run in its folder."""
    project = setup[2]
    cmd = [sys.executable, *_args(setup, "spot"), "--resume", "auto"]
    code, out, err = _interrupt(cmd, signal.SIGTERM)
    assert code == 143 and "Traceback" not in err, out[-2000:] + err[-3000:]
    [(_, how)] = RESUME_LINE.findall(out)
    assert how == f"the same command (--resume auto continues {project / 'spot'})"
    r = _run(cmd)
    assert f"--resume auto: continuing the unfinished run in {project / 'spot'}" in r.stdout + r.stderr
    _assert_same_weights(project / "spot", reference)
    assert [p.name for p in project.iterdir() if p.name.startswith("spot")] == ["spot"]


@pytest.mark.ddp
def test_ctrl_c_under_torchrun_stops_every_rank_and_resumes_exactly(setup):
    project = setup[2]
    _run([*_torchrun(free_port()), *_args(setup, "ddp-ref")])
    code, out, err = _interrupt([*_torchrun(free_port()), *_args(setup, "ddp-int")])
    assert code != 0, "torchrun reports the signal"
    _no_traceback_of_ours(err)
    lines = RESUME_LINE.findall(out)
    assert len(lines) == 1, out[-2000:] + err[-3000:]  # rank 0 alone says it
    cmd = shlex.split(lines[0][1])
    assert cmd[:6] == ["python", "-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"], cmd
    _run([*_torchrun(free_port()), *cmd[5:]])
    _assert_same_weights(project / "ddp-int", project / "ddp-ref")


def test_a_second_ctrl_c_exits_at_once(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # a process started by hand, not a SLURM job's
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest runs as a shell's background job
    with StopRequests(announce=False) as requests:
        os.kill(os.getpid(), signal.SIGINT)
        assert requests.signum == signal.SIGINT and requests.agreed()
        with pytest.raises(Interrupted, match="exiting at once") as e:
            os.kill(os.getpid(), signal.SIGINT)
    assert e.value.code == 130
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_under_torchrun_a_repeated_sigint_is_the_launcher_passing_it_on(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    before = signal.getsignal(signal.SIGTERM)
    with StopRequests(announce=False) as requests:
        assert signal.getsignal(signal.SIGTERM) is before  # the launcher's, to restart a group
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert requests.signum == signal.SIGINT


def test_in_a_slurm_job_a_signal_that_comes_twice_is_one_request(monkeypatch):
    """SLURM may signal a task directly (a preemption's SIGTERM) and through the batch script (its Ctrl-C to every
    step): the second is not a request to exit at once. SIGUSR1 (`--signal=USR1@T`) is a request under torchrun too."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with StopRequests(announce=False) as requests:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert requests.signum == signal.SIGTERM
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequests(announce=False) as requests:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.signum == signal.SIGUSR1 and requests.agreed()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_the_resume_command_names_how_the_run_was_launched(monkeypatch, tmp_path):
    from engine.messages import resume_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py")])
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(k, raising=False)
    last = tmp_path / "runs" / "exp" / "weights" / "last.pt"
    assert resume_command(last) == "python train.py --resume runs/exp/weights/last.pt"
    assert resume_command(last, auto=True) == "the same command (--resume auto continues runs/exp)"
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # one srun task of 4
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n1")
    assert resume_command(last) == ("srun python train.py --resume runs/exp/weights/last.pt (in an allocation of 4 "
                                    "tasks)")


def test_positions_are_numbered_from_1():
    assert position(1, 5, 3, 16) == "at epoch 2/3 batch 5/16"
    assert position(2, 0, 3, 16) == "after epoch 2/3"
    assert position(0, 0, 3, 16) == "at the start of epoch 1/3"


def test_classifier_stops_on_ctrl_c_too(shapes_classify, tmp_path, monkeypatch):
    """The stop lives in the shared loop: a classifier interrupted at its third batch writes last.pt there."""
    from classify import train as cls_train

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    opt = cls_train.parse_opt(["--data", str(shapes_classify), "--imgsz", "32", "--batch-size", "2", "--epochs",
                               "2", "--workers", "0", "--device", "cpu", "--noplots", "--project", str(tmp_path),
                               "--hyp", str(_hyp(tmp_path, "nbs: 2\n"))])
    seen = []

    def ctrl_c_at_third_batch(trainer):
        preprocess = trainer.preprocess_batch

        def counting(batch):
            seen.append(1)
            if len(seen) == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return preprocess(batch)

        trainer.preprocess_batch = counting

    from engine.tasks import TASKS
    ClassificationTrainer = TASKS["classify"].trainer
    from engine.trainer import run
    from tests.probes import probing

    with pytest.raises(Interrupted) as e:
        run(probing(ClassificationTrainer, {"on_train_start": [ctrl_c_at_third_batch]}), opt)
    assert e.value.code == 130 and len(seen) == 3
    ckpt = torch.load(tmp_path / "exp" / "weights" / "last.pt", weights_only=True)
    assert (ckpt["epoch"], ckpt["batch"]) == (-1, 3) and ckpt["optimizer"] is not None


def _hyp(tmp_path, text):
    f = tmp_path / "hyp.yaml"
    f.write_text(text)
    return f


def test_an_interrupted_evolution_says_what_it_keeps(shapes_detect, tmp_path):
    """The generation's trainer says how to resume its own training; the evolution adds that it does not resume."""
    import train
    from engine.evolve import evolve
    from engine.tasks import TASKS
    DetectionTrainer = TASKS["detect"].trainer

    def run(trainer_cls, opt, given):
        if opt.name == "gen1":
            raise Interrupted(signal.SIGINT)
        return None, {"fitness": 0.5}

    opt = train.parse_opt(["--data", str(shapes_detect), "--project", str(tmp_path), "--evolve", "3"])
    with pytest.raises(Interrupted, match=r"generation 2/3; .*evolve.csv holds the 1 finished") as e:
        evolve(DetectionTrainer, opt, run)
    assert e.value.code == 130


def test_an_evolution_does_not_take_resume(shapes_detect, tmp_path):
    """--resume auto in a scheduler's command line would reach every generation: refused before any folder is made."""
    import train
    from engine.evolve import evolve
    from engine.tasks import TASKS
    DetectionTrainer = TASKS["detect"].trainer
    from utils.errors import BadOption

    opt = train.parse_opt(["--data", str(shapes_detect), "--project", str(tmp_path), "--evolve", "3", "--resume",
                           "auto"])
    with pytest.raises(BadOption, match="does not take --resume"):
        evolve(DetectionTrainer, opt, lambda *a: pytest.fail("a generation ran"))
    assert not list(tmp_path.iterdir())
