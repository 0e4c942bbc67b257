"""How a run ends (engine/trainer.py train, final_eval; engine/checkpointer.py finish_best, finish_last): last.pt keeps
the run's whole state until the final validation is done, so a process killed there (SIGTERM, or SIGKILL, which
nothing can hear) is finished by --resume: the final validation, the strip, the tracker run closed as finished with
best.pt. A run that stops on a signal or fails closes its tracker run as killed or failed, best.pt sent where it
exists, never left running. Checked with MLflow's local store (its statuses are FINISHED, KILLED, FAILED)."""

import signal
import subprocess
import sys

import pytest

import train
from models.checkpoints import load_checkpoint
from tests.engine.test_trackers import SMALL, mlflow_runs, results_rows

# the final validation is the run's second on_val_end with one epoch; the process then ends by `signum`
KILLED_IN_FINAL_VALIDATION = """
import os, sys
import train
from tests.engine.test_trackers import SMALL
from utils.cli import options_from_kwargs
from utils.run import run_cli
calls = []
def kill(event):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), int(sys.argv[3]))
options = dict(data=sys.argv[1], epochs=1, project=sys.argv[2], loggers="mlflow", noplots=True, **SMALL)
run_cli(lambda opt: train.main(opt, {"on_val_end": [kill]}), lambda: options_from_kwargs(train.parse_opt, options))
"""


def _artifacts(client, run):
    return [a.path for a in client.list_artifacts(run.info.run_id, "weights")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_run_killed_in_its_final_validation_is_finished_by_resume(shapes_detect, tmp_path, signum):
    project = tmp_path / "runs"
    r = subprocess.run(["timeout", "600", sys.executable, "-c", KILLED_IN_FINAL_VALIDATION, str(shapes_detect),
                        str(project), str(int(signum))], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == (143 if signum == signal.SIGTERM else -signal.SIGKILL), r.stderr[-3000:]
    weights = project / "exp" / "weights"
    assert load_checkpoint(weights / "last.pt")["optimizer"] is not None, "last.pt still holds the run"
    assert load_checkpoint(weights / "best.pt")["optimizer"] is None, "best.pt was stripped for its validation"
    client, [run] = mlflow_runs(project)
    if signum == signal.SIGTERM:  # heard: closed as killed, with best.pt
        assert run.info.status == "KILLED" and _artifacts(client, run) == ["weights/best.pt"]
    else:  # SIGKILL leaves nothing to say it: the run is open until --resume finishes it
        assert run.info.status == "RUNNING"

    trainer, metrics = train.run(resume=str(weights / "last.pt"))
    assert trainer.save_dir == project / "exp" and metrics == trainer.state.metrics and "fitness" in metrics
    assert load_checkpoint(weights / "last.pt")["optimizer"] is None, "finished: --resume refuses it now"
    assert sorted(results_rows(trainer.save_dir)) == [1], "no epoch trained again"
    client, [again] = mlflow_runs(project)
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert "weights/best.pt" in _artifacts(client, again)


def test_a_run_that_fails_closes_its_tracker_run_as_failed_with_best_pt(shapes_detect, tmp_path, monkeypatch):
    """A bug in the final validation (here: loading best.pt raises): the error keeps its traceback, the MLflow run
    is FAILED and holds best.pt, and last.pt still holds the run, for --resume to finish."""
    project = tmp_path / "runs"

    def broken(*args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr("engine.trainer.attempt_load", broken)
    with pytest.raises(RuntimeError, match="a bug of ours"):
        train.run(data=str(shapes_detect), epochs=1, project=str(project), loggers="mlflow", noplots=True, **SMALL)
    client, [run] = mlflow_runs(project)
    assert run.info.status == "FAILED" and _artifacts(client, run) == ["weights/best.pt"]
    assert load_checkpoint(project / "exp" / "weights" / "last.pt")["optimizer"] is not None
