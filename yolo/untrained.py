"""A model YAML where weights are read (predict, val, track, export, and the API's names/info/fuse).

Ultralytics builds a YAML's model with its random initial weights and predicts, validates and exports it as it is;
so do the `YOLO` class and the `yolo` command, with one warning that the weights are untrained. The model is built
once and saved as a checkpoint of ours (models/checkpoints/ours.py) in a temporary folder that lives as long as its
`Untrained` object; the scripts then read it as any weights file. An export of it is moved to the working folder,
named after the YAML (yolov8n.yaml -> ./yolov8n.onnx), where Ultralytics writes it, not into that passing folder.
"""

import shutil
import tempfile
import weakref
from contextlib import contextmanager
from pathlib import Path

from utils.errors import UserError

YAML_SUFFIXES = (".yaml", ".yml")


def is_yaml(model):
    return Path(str(model)).suffix.lower() in YAML_SUFFIXES


class Untrained:
    """The model of `yaml` (for `task`), built on first use; `checkpoint()` is its weights file."""

    def __init__(self, yaml, task):
        self.yaml, self.task = str(yaml), task
        self._model = self._file = None
        self._folder = None

    @property
    def model(self):
        """The torch model, built once (the one `checkpoint()` holds)."""
        if self._model is None:
            from engine.tasks import TASKS

            self._model = TASKS[self.task].model(self.yaml)
        return self._model

    def checkpoint(self):
        """The path of `model`'s checkpoint, written once (before any fuse(): a fused model's weights rebuild no
        YAML)."""
        if self._file is None:
            from models.checkpoints.ours import model_to_ckpt, save_checkpoint
            from utils.log import LOGGER

            model = self.model
            self._folder = tempfile.mkdtemp(prefix="yolo-untrained-")
            weakref.finalize(self, shutil.rmtree, self._folder, True)
            self._file = Path(self._folder) / f"{Path(self.yaml).stem}.pt"
            save_checkpoint({"model": model_to_ckpt(model, half=False)}, self._file)
            LOGGER.warning(f"{self.yaml}: a model built from its YAML with untrained (random) weights; its boxes and "
                           "metrics mean nothing until it is trained (train it first, or give a .pt)")
        return str(self._file)

    def fuse(self):
        """Fold the BatchNorms of `model`, its checkpoint written first."""
        self.checkpoint()
        self.model.fuse()

    def publish(self, files):
        """`files` (an export's, in the temporary folder) moved to the working folder; their new paths."""
        from utils.log import LOGGER

        moved = []
        for f in files:
            target = Path.cwd() / Path(f).name
            if target.is_dir():
                shutil.rmtree(target)
            moved.append(str(Path(shutil.move(str(f), str(target))).resolve()))
            LOGGER.info(f"{Path(f).name} of the untrained {self.yaml}: moved to {moved[-1]}")
        return moved

    @contextmanager
    def named(self):
        """A UserError raised inside names the YAML where it would name the passing checkpoint file."""
        try:
            yield
        except UserError as e:
            if self._file is not None:
                e.args = tuple(a.replace(str(self._file), f"{self.yaml} (untrained)") if isinstance(a, str) else a
                               for a in e.args)
            raise
