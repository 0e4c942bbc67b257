"""The Checkpointer: a checkpoint holds the state of the components it is given, each written and read by the
component itself (the loop state by LoopState), and a restore gives back the state it was saved at."""

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch

import train
from engine.callbacks import Callbacks
from engine.checkpointer import Checkpointer, LoopState
from engine.options import TrainOptions
from engine.parts import Optimisation
from engine.trainer import BaseTrainer
from models.checkpoints import load_checkpoint
from models.yolo import DetectionModel
from utils.torch_utils import ModelEMA, build_optimizer


def _trainer(seed, epochs=10):
    torch.manual_seed(seed)
    model = DetectionModel("yolov5n.yaml", nc=2)
    optimizer = build_optimizer(model, "SGD", 0.01, 0.9, 0.0005)
    optim = Optimisation(model, model, None, optimizer=optimizer, ema=ModelEMA(model),
                         scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: 1 - e / epochs),
                         scaler=torch.amp.GradScaler("cpu", enabled=False))
    return SimpleNamespace(optim=optim, state=LoopState(), callbacks=Callbacks(),
                           opt=TrainOptions.from_values(train.parse_opt([]).opt), hyp={"lr0": 0.01})


def _save(checkpointer, trainer, state):
    """What BaseTrainer.save_position writes, from the components the trainer names."""
    ranks = [Checkpointer.rank_state(state)]
    checkpointer.save_last(checkpointer.checkpoint(BaseTrainer.components(trainer, state), ranks))


def _restore(checkpointer, trainer, epochs=10):
    """What BaseTrainer._setup does with --resume: the trainer's components load last.pt (7 batches an epoch)."""
    return checkpointer.restore(checkpointer.last, BaseTrainer.components(trainer), epochs, 7)


def test_loop_state_round_trips_through_a_checkpoint(tmp_path):
    checkpointer = Checkpointer(tmp_path, save_interval="3it")
    saved = LoopState(epoch=3, batch=5, last_opt_step=25, best_fitness=0.25, best_epoch=2,
                      metrics={"fitness": 0.25, "metrics/mAP50(B)": 0.5}, mean_losses=torch.tensor([0.5, 0.25, 1.0]))
    source = _trainer(0)
    source.optim.ema.updates = 9
    source.callbacks.states["tracker_runs"].loaded = {"wandb": "abc123", "mlflow": "0f9e"}  # as a resumed run's
    ckpt = checkpointer.checkpoint(BaseTrainer.components(source, saved), ranks=[Checkpointer.rank_state(saved)])
    checkpointer.save(ckpt, epoch=2, improved=True)
    on_disk = load_checkpoint(checkpointer.last)
    assert (on_disk["epoch"], on_disk["batch"]) == (2, 5)  # "epoch" is the last finished one
    assert load_checkpoint(checkpointer.best)["last_opt_step"] == 25

    target = _trainer(1)
    restored = _restore(checkpointer, target)
    assert restored is target.state and restored == dataclasses.replace(saved, mean_losses=restored.mean_losses)
    assert torch.equal(restored.mean_losses, saved.mean_losses)
    assert target.optim.ema.updates == 9
    assert target.callbacks.components()["tracker_runs"].state_dict() == {"wandb": "abc123", "mlflow": "0f9e"}
    assert all(torch.equal(a, b) for a, b in zip(source.optim.model.state_dict().values(),
                                                  target.optim.model.state_dict().values()))
    assert checkpointer.last_save[1] == 3 * 7 + 5 - 1  # --save-interval counts from the restored position
    assert checkpointer.due(3 * 7 + 5 + 2, False, True) == (False, True)


def test_a_run_whose_epochs_are_done_is_restored_to_finish(tmp_path, yolo_log):
    """Killed after its last epoch's checkpoint (in the final validation): --resume finishes it (state.done), as
    it does a run stopped early, whose checkpoint says so."""
    checkpointer = Checkpointer(tmp_path)
    for state in (LoopState(epoch=10, mean_losses=torch.zeros(3)), LoopState(epoch=4, done=True,
                                                                            mean_losses=torch.zeros(3))):
        _save(checkpointer, _trainer(0), state)
        restored = _restore(checkpointer, _trainer(0))
        assert restored.done and restored.epoch == state.epoch
        assert yolo_log[-1] == f"Finishing {checkpointer.last}: its training is done; the final validation and the " \
                               "strip are left"
    state = LoopState(epoch=4, mean_losses=torch.zeros(3))
    _save(checkpointer, _trainer(0), state)
    assert not _restore(checkpointer, _trainer(0)).done


def test_a_checkpoint_older_than_tracker_runs_restores_with_none(tmp_path):
    older = {"epoch": 1, "batch": 0, "last_opt_step": 7, "best_fitness": 0.1, "best_epoch": 1, "metrics": {},
             "ranks": [], "model": None}
    torch.save(older, tmp_path / "older.pt")
    callbacks = Callbacks()
    state = Checkpointer(tmp_path).restore(tmp_path / "older.pt", {"loop": LoopState(), **callbacks.components()}, 10,
                                           7)
    assert state.epoch == 2 and not state.done
    assert callbacks.components()["tracker_runs"].state_dict() == {}


# The entries of a resumable checkpoint, in the order every checkpoint of this project has written them: older
# checkpoints resume and official tools read ours only while this holds
FORMAT = ["epoch", "batch", "last_opt_step", "best_fitness", "best_epoch", "metrics", "tracker_runs", "done", "ranks",
          "model", "ema", "updates", "optimizer", "scheduler", "scaler", "opt", "hyp", "date", "version"]


class Counter:
    """A component the Checkpointer knows nothing of, as a listener's state would be."""

    def __init__(self, n=0):
        self.n = n

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, entry):
        self.n = entry["n"]


def test_a_checkpoint_holds_each_component_under_its_name_in_the_format_of_every_checkpoint(tmp_path):
    """The trainer's components lay out the checkpoint every earlier version wrote (the loop's and the EMA's entries
    at the top level); another component is one entry under its name, loaded back by itself; a record (a value
    without state_dict) is written and never loaded."""
    checkpointer, state = Checkpointer(tmp_path), LoopState(epoch=2, batch=3, mean_losses=torch.zeros(3))
    source = _trainer(0)
    source.optim.ema.updates = 5
    ckpt = checkpointer.checkpoint(BaseTrainer.components(source, state), [Checkpointer.rank_state(state)])
    assert list(ckpt) == FORMAT
    assert (ckpt["epoch"], ckpt["batch"], ckpt["updates"], ckpt["hyp"]) == (1, 3, 5, {"lr0": 0.01})
    assert ckpt["model"].keys() == ckpt["ema"].keys() == {"class", "yaml", "state_dict", "names"}
    assert ckpt["opt"] == source.opt.to_dict() and ckpt["scheduler"] == source.optim.scheduler.state_dict()

    record = {"kept": 1}
    checkpointer.save_last(checkpointer.checkpoint({"loop": state, "counter": Counter(7), "note": record},
                                                   ckpt["ranks"]))
    saved = load_checkpoint(checkpointer.last)
    assert (saved["counter"], saved["note"], saved["epoch"]) == ({"n": 7}, record, 1)
    counter, note = Counter(), {"kept": 2}
    restored = checkpointer.restore(checkpointer.last, {"loop": LoopState(), "counter": counter, "note": note}, 10, 7)
    assert counter.n == 7 and note == {"kept": 2} and (restored.epoch, restored.batch) == (2, 3)


def _ckpt(checkpointer, epoch, seed):
    state = LoopState(epoch=epoch + 1, mean_losses=torch.zeros(3))  # stored as "epoch": the last finished one
    ranks = [Checkpointer.rank_state(state)]
    return checkpointer.checkpoint(BaseTrainer.components(_trainer(seed), state), ranks)


def _ema_weights(path):
    """The first EMA tensor in fp16: where a stripped checkpoint keeps it (as its model), else in its "ema"."""
    ckpt = load_checkpoint(path)
    return next(iter((ckpt["ema"] or ckpt["model"])["state_dict"].values())).half()


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "copy"])
def test_best_and_period_files_keep_their_epoch_after_last_moves_on(tmp_path, monkeypatch, links):
    """best.pt and epochN.pt are copies of last.pt's file (a hard link where possible): a later last.pt must not
    change them, and finish_best() then finish_last() strip each, best.pt first as a file of its own."""
    if not links:
        monkeypatch.setattr("os.link", lambda *a: (_ for _ in ()).throw(OSError("no hard links here")))
    checkpointer = Checkpointer(tmp_path, save_period=1)
    checkpointer.save(_ckpt(checkpointer, 0, seed=0), epoch=0, improved=True)
    assert load_checkpoint(checkpointer.best)["epoch"] == 0
    assert os.path.samefile(checkpointer.last, checkpointer.best) == links
    checkpointer.save(_ckpt(checkpointer, 1, seed=1), epoch=1, improved=False)
    assert [load_checkpoint(p)["epoch"] for p in (checkpointer.last, checkpointer.best)] == [1, 0]
    assert load_checkpoint(tmp_path / "weights" / "epoch1.pt")["epoch"] == 0
    assert load_checkpoint(tmp_path / "weights" / "epoch2.pt")["optimizer"] is not None
    first_best = _ema_weights(checkpointer.best)
    checkpointer.finish_best()
    assert load_checkpoint(checkpointer.last)["optimizer"] is not None  # the run's state until the end
    checkpointer.finish_last()
    for p in (checkpointer.last, checkpointer.best):
        assert load_checkpoint(p)["optimizer"] is None
    assert torch.equal(_ema_weights(checkpointer.best), first_best)
    assert not torch.equal(_ema_weights(checkpointer.last), first_best)
    assert load_checkpoint(tmp_path / "weights" / "epoch2.pt")["optimizer"] is not None  # kept whole
    assert not list((tmp_path / "weights").glob(".*.tmp*"))


def test_finishing_a_best_that_is_still_last_leaves_last_whole(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(_ckpt(checkpointer, 0, seed=0), epoch=0, improved=True)
    checkpointer.finish_best()
    assert load_checkpoint(checkpointer.best)["optimizer"] is None
    assert load_checkpoint(checkpointer.last)["optimizer"] is not None
    assert not os.path.samefile(checkpointer.last, checkpointer.best)
    assert torch.equal(_ema_weights(checkpointer.best), _ema_weights(checkpointer.last))


# Where a run trained, as far as a CPU can stand in for it: the GradScaler is enabled for fp16 (CUDA's default; a CPU
# GradScaler behaves the same), the optimizer fused on CUDA whatever the precision, neither on a CPU (fp32 or bf16).
RUNS = {"cpu": (False, False), "cuda-fp16": (True, True), "cuda-bf16": (False, True)}


def _run_like(where, seed):
    scaler_on, fused = RUNS[where]
    t = _trainer(seed)
    t.optim.optimizer = build_optimizer(t.optim.model, "AdamW", 0.01, 0.9, 0.0005, fused=fused)
    t.optim.scheduler = torch.optim.lr_scheduler.LambdaLR(t.optim.optimizer, lambda e: 1.0)
    t.optim.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10 if seed == 0 else 2.0**16, enabled=scaler_on)
    return t


def _step(t):
    for p in t.optim.model.parameters():
        p.grad = torch.full_like(p, 0.01)
    t.optim.scaler.scale(torch.ones(()))  # an enabled scaler has a state once it scaled a loss
    t.optim.optimizer.step()


@pytest.mark.parametrize("target", RUNS)
@pytest.mark.parametrize("source", RUNS)
def test_resume_across_devices_and_precisions(tmp_path, source, target, yolo_log):
    """A checkpoint continues on any device in any precision: a CPU run's empty GradScaler state is not loaded into
    an fp16 run's scaler (torch refuses it); a CUDA run's fused optimizer is not carried to a CPU, nor a CPU run's
    unfused one to CUDA; the optimizer's state and the scale, where both runs have one, are what was saved."""
    checkpointer = Checkpointer(tmp_path)
    src = _run_like(source, seed=0)
    _step(src)
    state = LoopState(epoch=1, mean_losses=torch.zeros(3))
    _save(checkpointer, src, state)

    dst = _run_like(target, seed=1)
    _restore(checkpointer, dst)
    fused = RUNS[target][1] or None
    assert [g["fused"] for g in dst.optim.optimizer.param_groups] == [fused] * 3
    saved, loaded = src.optim.optimizer.state_dict()["state"], dst.optim.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys() and saved
    for k in saved:
        assert float(loaded[k]["step"]) == 1.0
        assert torch.equal(loaded[k]["exp_avg"], saved[k]["exp_avg"])
    if RUNS[target][0]:  # the saved scale where there is one, else the initial one
        assert dst.optim.scaler.get_scale() == (2.0**10 if RUNS[source][0] else 2.0**16)
        assert any("starts at its initial scale" in m for m in yolo_log) == (not RUNS[source][0])
    _step(dst)  # and it trains on
    assert all(float(s["step"]) == 2.0 for s in dst.optim.optimizer.state_dict()["state"].values())


@pytest.mark.parametrize("ranks", [1, 2])
def test_ranks_agree_on_stops_and_timed_saves_every_agree_every_steps_under_ddp(tmp_path, monkeypatch, ranks):
    """Under DDP the collective that shares a stop request and rank 0's --save-interval clock runs every
    AGREE_EVERY optimizer steps, not at each (on CUDA its answer makes the host wait for the GPU); counted
    intervals ('3it') need no collective and keep their steps; a single process decides at every step."""
    from engine.checkpointer import AGREE_EVERY
    from utils import dist as du

    asked = []
    monkeypatch.setattr(du, "is_distributed", lambda: ranks > 1)
    monkeypatch.setattr(du, "any_ranks", lambda *flags: (asked.append(flags), flags)[1])
    counted, timed = Checkpointer(tmp_path, save_interval="3it"), Checkpointer(tmp_path, save_interval="1s")
    timed.last_save = (timed.last_save[0] - 10, -1)  # its second is up
    decisions = []
    for step in range(2 * AGREE_EVERY + 5):
        stop_asked = step >= 12  # a Ctrl-C on this rank after step 12
        saves = counted.due(step, False, True)[1]
        if saves:
            counted.saved(step)
        decisions.append((saves, *timed.due(step, stop_asked, True)))
    agreed = [s for s in range(len(decisions)) if ranks == 1 or (s + 1) % AGREE_EVERY == 0]
    assert [s for s, d in enumerate(decisions) if d[2]] == agreed  # timed saves at the checks only
    assert [s for s, d in enumerate(decisions) if d[1]] == [s for s in agreed if s >= 12]  # the stop too
    assert [s for s, d in enumerate(decisions) if d[0]] == list(range(2, len(decisions), 3))
    assert len(asked) == 2 * len(agreed)  # one collective per check of each checkpointer
