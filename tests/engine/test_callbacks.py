"""Declared events: names are checked when a callback is added, a failing callback is a warning, the default
listeners (results.csv, TensorBoard) hang off the same events a user's callback does."""

import ast
import csv
from pathlib import Path

import pytest

import train
from engine.callbacks import EVENTS, EVERY_RANK, Callbacks, Event


def test_a_misspelled_event_is_refused():
    callbacks = Callbacks()
    with pytest.raises(ValueError, match="unknown event 'on_epoch_end'"):
        callbacks.add("on_epoch_end", print)

    class Listener:
        def on_fit_epoch_end(self, event):
            pass

        def on_fit_epoch_ends(self, event):  # a typo in an object's method name is refused too
            pass

    with pytest.raises(ValueError, match="on_fit_epoch_ends"):
        callbacks.attach(Listener())


def test_rank_zero_events_are_skipped_elsewhere_and_a_failure_is_one_warning(yolo_log):
    fired = []
    callbacks = Callbacks()

    def broken(event):
        raise RuntimeError("tracker offline")

    for event in EVENTS:
        callbacks.add(event, broken)
        callbacks.add(event, lambda ev: fired.append(ev.name))
    for event in EVENTS:
        if callbacks.fires(event, main=False):
            callbacks.fire(Event(event, Path("run"), main=False, epoch=0))
    assert fired == [e for e in EVENTS if e in EVERY_RANK]
    warnings = [m for m in yolo_log if "broken" in m]
    assert len(warnings) == len(EVERY_RANK)
    assert "failed on on_train_start" in warnings[0] and "RuntimeError: tracker offline" in warnings[0]
    with pytest.raises(KeyboardInterrupt):  # a stop passes through
        callbacks.add("on_train_end", lambda ev: (_ for _ in ()).throw(KeyboardInterrupt()))
        callbacks.fire(Event("on_train_end", Path("run"), main=True, epoch=1))


class Recorder:
    """A user's listener: records the events in order and the epoch rows it is shown."""

    def __init__(self):
        self.events, self.rows = [], []

    def on_pretrain_routine_end(self, event):
        self.events.append("on_pretrain_routine_end")
        assert event.save_dir.is_dir() and event.names and event.config["hyp"] and event.model is not None

    def on_train_batch_end(self, event):
        self.events.append("on_train_batch_end")

    def on_val_end(self, event):
        self.events.append("on_val_end")
        assert "fitness" in event.metrics

    def on_model_save(self, event):
        self.events.append("on_model_save")
        assert event.last.is_file() and event.improved == event.best.is_file()

    def on_fit_epoch_end(self, event):
        self.events.append("on_fit_epoch_end")
        self.rows.append(dict(event.row))
        assert event.epoch == 1 and event.best_epoch == 0

    def on_train_end(self, event):
        self.events.append("on_train_end")
        raise RuntimeError("a failing logger")  # reported, and the run still returns its metrics


class Keeper:
    """A listener keeping its state in a checkpoint entry, as a tracker keeps its run id."""

    checkpoint_entry = "tracker_runs"

    def __init__(self, name, run_id=None):
        self.name, self.run_id, self.resumed = name, run_id, None

    def on_train_end(self, event):
        pass

    def state_dict(self):
        return {self.name: self.run_id} if self.run_id else {}

    def load_state_dict(self, entry):
        self.resumed = entry.get(self.name)


def test_listeners_keep_their_own_state_in_a_checkpoint_entry_and_keys_none_claims_stay():
    """Each listener gives its keys of the entry and reads them back; a key no listener of this run claims (a tracker
    a resume dropped) stays as loaded, where it was; an older checkpoint without the entry gives an empty one."""
    callbacks = Callbacks()
    assert callbacks.components()["tracker_runs"].state_dict() == {}  # written even with no listener keeping state
    a, b = callbacks.attach(Keeper("a", "run-a")), callbacks.attach(Keeper("b"))
    entry = callbacks.components()["tracker_runs"]
    assert entry.state_dict() == {"a": "run-a"}
    entry.load_state_dict({"gone": "run-x", "b": "old-b", "a": "old-a"})
    assert (a.resumed, b.resumed) == ("old-a", "old-b")
    b.run_id = "old-b"  # b continues its run, a opened another
    assert list(entry.state_dict().items()) == [("gone", "run-x"), ("b", "old-b"), ("a", "run-a")]
    older, kept = Callbacks(), Keeper("a")
    older.attach(kept).resumed = "stale"
    older.components()["tracker_runs"].load_state_dict(None)
    assert older.components()["tracker_runs"].state_dict() == {} and kept.resumed is None


def test_a_listener_keeping_state_outside_the_declared_entries_is_refused():
    """An entry of a listener's choosing could overwrite one of the checkpoint's own ("model")."""
    keeper = Keeper("a", "run-a")
    keeper.checkpoint_entry = "model"
    callbacks = Callbacks()
    with pytest.raises(ValueError, match="checkpoint entry 'model'; entries: tracker_runs"):
        callbacks.attach(keeper)
    assert not callbacks.fires("on_train_end")


def test_a_run_fires_the_declared_events_and_survives_a_failing_callback(shapes_detect, tmp_path, yolo_log):
    recorder = Recorder()
    trainer, metrics = train.run(
        callbacks=[recorder], data=str(shapes_detect), cfg="yolov5n.yaml", imgsz=64, batch_size=8, epochs=1,
        workers=0, device="cpu", project=str(tmp_path), noplots=True,
    )
    assert "fitness" in metrics
    n = trainer.data_plan.batches_per_epoch
    assert recorder.events == (["on_pretrain_routine_end"] + ["on_train_batch_end"] * n
                               + ["on_val_end", "on_model_save", "on_fit_epoch_end", "on_val_end", "on_train_end"])
    assert any("Recorder.on_train_end failed on on_train_end" in m for m in yolo_log)
    rows = list(csv.DictReader(open(trainer.save_dir / "results.csv")))  # written by the default listener
    assert len(rows) == 1 and float(rows[0]["train/box_loss"]) == pytest.approx(recorder.rows[0]["train/box_loss"],
                                                                                rel=1e-5)
    assert list(trainer.save_dir.glob("events.out.tfevents*"))


def test_no_listener_reads_the_trainer():
    """The project's listeners (engine/loggers/, evaluation/charts.py) read what an event carries: no name `trainer`
    in their code, and every `on_*` method takes the event alone."""
    root = Path(__file__).resolve().parents[2]
    files = [*sorted((root / "engine" / "loggers").glob("*.py")), root / "evaluation" / "charts.py"]
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
        assert "trainer" not in names, f"{path.relative_to(root)} reads a trainer"
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in EVENTS):
            assert [a.arg for a in fn.args.args] == ["self", "event"], f"{path.name}: {fn.name}"


def test_the_default_listeners_run_on_events_alone(tmp_path):
    """results.csv, TensorBoard and the run's pictures from events alone, with no trainer anywhere: what a listener
    needs is in the event."""
    from engine.loggers import build_loggers
    from evaluation.charts import RunPlots

    callbacks = Callbacks()
    for listener in [RunPlots(), *build_loggers(["csv", "tensorboard"], tmp_path)]:
        callbacks.attach(listener)
    common = dict(save_dir=tmp_path, main=True, best=tmp_path / "weights" / "best.pt")
    labels = ([0, 1], [[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.1]])
    callbacks.fire(Event("on_pretrain_routine_end", epoch=0, names={0: "a", 1: "b"}, labels=labels, **common))
    for epoch in (1, 2):
        row = {"train/box_loss": 1.0 / epoch, "metrics/mAP50(B)": 0.1 * epoch, "lr/pg0": 0.01}
        callbacks.fire(Event("on_fit_epoch_end", epoch=epoch, row=row, **common))
    callbacks.fire(Event("on_train_end", epoch=2, **common))
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [r["epoch"] for r in rows] == ["1", "2"] and rows[1]["train/box_loss"] == "0.5"
    assert (tmp_path / "labels.jpg").is_file() and (tmp_path / "results.png").is_file()
