"""results.csv numbers epochs from 1; a file numbered from 0 by an earlier version still takes a resumed run's rows.
TensorBoard traces the model's graph only when asked."""

import csv
from types import SimpleNamespace

import pytest
import torch

from engine.callbacks import Event
from engine.loggers import CSVLogger
from utils.cli import check_loggers


def _epochs(path):
    return [int(r["epoch"]) for r in csv.DictReader(open(path))]


def test_rows_are_keyed_by_epoch_from_1(tmp_path):
    log = CSVLogger(tmp_path / "results.csv")
    log.log(1, {"a": 0.5})
    log.log(2, {"a": 0.25})
    log.log(2, {"a": 0.125})  # an epoch done twice (killed after its row) keeps one row, the last
    assert _epochs(log.path) == [1, 2]
    assert [r["a"] for r in csv.DictReader(open(log.path))] == ["0.5", "0.125"]


def test_a_file_numbered_from_0_is_renumbered_when_a_resumed_run_writes(tmp_path):
    f = tmp_path / "results.csv"
    f.write_text("epoch,a\n0,0.5\n1,0.25\n")  # two epochs done by an earlier version
    CSVLogger(f).log(3, {"a": 0.125})  # the third epoch, as this version numbers it
    assert _epochs(f) == [1, 2, 3]
    assert [r["a"] for r in csv.DictReader(open(f))] == ["0.5", "0.25", "0.125"]


def test_log_lines_go_to_the_stdout_of_the_moment():
    """The handler wrote to the sys.stdout of its set-up: after an in-process run under one test's capture, every
    later line was a 'Logging error' traceback on a closed stream."""
    import contextlib
    import io

    from utils.log import LOGGER, set_logging

    set_logging()
    first, second = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(first):
        LOGGER.info("one")
    first.close()
    with contextlib.redirect_stdout(second):
        LOGGER.info("two")
    assert second.getvalue() == "two\n"


def test_tensorboard_traces_the_model_graph_only_when_asked(tmp_path, monkeypatch):
    """The graph trace costs seconds of every run (6.2 s at 640 px here): `tensorboard-graph` asks for it, the
    default `tensorboard` does not; naming both makes one TensorBoard listener."""
    pytest.importorskip("tensorboard")
    import engine.loggers as loggers

    traced = []
    monkeypatch.setattr(loggers, "_add_graph", lambda writer, model, stride: traced.append(model))
    event = Event("on_pretrain_routine_end", tmp_path, main=True, epoch=0,
                  model=SimpleNamespace(stride=torch.tensor([8.0, 16.0, 32.0])))
    for names, graphs in ((["csv", "tensorboard"], 0), (["tensorboard-graph"], 1),
                          (["tensorboard", "csv", "tensorboard-graph"], 1)):
        traced.clear()
        listeners = loggers.build_loggers(check_loggers(names), tmp_path / "_".join(names))
        boards = [x for x in listeners if isinstance(x, loggers.TensorBoardLogger)]
        assert len(boards) == 1
        boards[0].on_pretrain_routine_end(event)
        boards[0].close()
        assert len(traced) == graphs, names


def test_a_name_cannot_start_a_line_of_its_own(tmp_path):
    """The line predict prints for an image named 'a<newline>All checks passed<newline>b.jpg' printed a forged line of
    its own: every control character inside a message is escaped; the blank lines a message starts or ends with
    stay."""
    import contextlib
    import io

    import cv2
    import numpy as np

    from data.sources import LoadImages
    from utils.log import LOGGER, set_logging

    cv2.imwrite(str(tmp_path / "a\nAll checks passed\x1b[2J\rb.jpg"), np.zeros((8, 8, 3), np.uint8))
    _, _, _, desc = next(iter(LoadImages(str(tmp_path), imgsz=32)))
    set_logging()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        LOGGER.info(f"{desc}(no detections)")
        LOGGER.info("\nValidating best.pt...\n")
    assert out.getvalue().splitlines() == [
        f"image 1/1 {tmp_path}/a\\nAll checks passed\\x1b[2J\\rb.jpg: (no detections)", "", "Validating best.pt...", ""]
