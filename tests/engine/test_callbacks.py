"""Declared events: names are checked when a callback is added, a failing callback is a warning, the default
listeners (results.csv, TensorBoard) hang off the same events a user's callback does."""

import csv

import pytest

import train
from engine.callbacks import EVENTS, EVERY_RANK, Callbacks


def test_a_misspelled_event_is_refused():
    callbacks = Callbacks()
    with pytest.raises(ValueError, match="unknown event 'on_epoch_end'"):
        callbacks.add("on_epoch_end", print)

    class Listener:
        def on_fit_epoch_end(self, trainer):
            pass

        def on_fit_epoch_ends(self, trainer):  # a typo in an object's method name is refused too
            pass

    with pytest.raises(ValueError, match="on_fit_epoch_ends"):
        callbacks.attach(Listener())


def test_rank_zero_events_are_skipped_elsewhere_and_a_failure_is_one_warning(yolo_log):
    fired = []
    callbacks = Callbacks()

    def broken(trainer):
        raise RuntimeError("tracker offline")

    for event in EVENTS:
        callbacks.add(event, broken)
        callbacks.add(event, lambda t, e=event: fired.append(e))
    for event in EVENTS:
        callbacks.fire(event, None, main=False)
    assert fired == [e for e in EVENTS if e in EVERY_RANK]
    warnings = [m for m in yolo_log if "broken" in m]
    assert len(warnings) == len(EVERY_RANK)
    assert "failed on on_train_start" in warnings[0] and "RuntimeError: tracker offline" in warnings[0]
    with pytest.raises(KeyboardInterrupt):  # a stop passes through
        callbacks.add("on_train_end", lambda t: (_ for _ in ()).throw(KeyboardInterrupt()))
        callbacks.fire("on_train_end", None)


class Recorder:
    """A user's listener: records the events in order and the epoch rows it is shown."""

    def __init__(self):
        self.events, self.rows = [], []

    def on_pretrain_routine_end(self, trainer):
        self.events.append("on_pretrain_routine_end")
        assert trainer.save_dir.is_dir()

    def on_train_batch_end(self, trainer):
        self.events.append("on_train_batch_end")

    def on_val_end(self, trainer):
        self.events.append("on_val_end")

    def on_model_save(self, trainer):
        self.events.append("on_model_save")
        assert trainer.checkpointer.last.is_file()

    def on_fit_epoch_end(self, trainer):
        self.events.append("on_fit_epoch_end")
        self.rows.append(dict(trainer.epoch_row))

    def on_train_end(self, trainer):
        self.events.append("on_train_end")
        raise RuntimeError("a failing logger")  # reported, and the run still returns its metrics


class Keeper:
    """A listener keeping its state in a checkpoint entry, as a tracker keeps its run id."""

    checkpoint_entry = "tracker_runs"

    def __init__(self, name, run_id=None):
        self.name, self.run_id, self.resumed = name, run_id, None

    def on_train_end(self, trainer):
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
    assert not callbacks.has("on_train_end")


def test_a_run_fires_the_declared_events_and_survives_a_failing_callback(shapes_detect, tmp_path, yolo_log):
    recorder = Recorder()
    trainer, metrics = train.run(
        callbacks=[recorder], data=str(shapes_detect), cfg="yolov5n.yaml", imgsz=64, batch_size=8, epochs=1,
        workers=0, device="cpu", project=str(tmp_path), noplots=True,
    )
    assert "fitness" in metrics
    n = trainer.batches_per_epoch
    assert recorder.events == (["on_pretrain_routine_end"] + ["on_train_batch_end"] * n
                               + ["on_val_end", "on_model_save", "on_fit_epoch_end", "on_val_end", "on_train_end"])
    assert any("Recorder.on_train_end failed on on_train_end" in m for m in yolo_log)
    rows = list(csv.DictReader(open(trainer.save_dir / "results.csv")))  # written by the default listener
    assert len(rows) == 1 and float(rows[0]["train/box_loss"]) == pytest.approx(recorder.rows[0]["train/box_loss"],
                                                                                rel=1e-5)
    assert list(trainer.save_dir.glob("events.out.tfevents*"))
