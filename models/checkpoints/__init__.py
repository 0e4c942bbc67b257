"""Checkpoints, one module per concern; the names callers use are importable from here.

- safe.py      the one loader for every `.pt` file the project reads (`load_checkpoint`): nothing a file holds may
               run code; the allow-list and the stand-ins for official classes
- ours.py      our own format: `model_to_ckpt` / `model_from_ckpt`, `save_checkpoint`, `to_safe` / `from_safe`
- official.py  official YOLOv5/v7/v8/11 module trees (read as stand-ins) converted to our models
- releases.py  official weights by name: release URLs and the download
- load.py      a model from a weights argument (`attempt_load`; `load_model` adds what the checkpoint says of its
               training run), the model a `.pt` names (`model_yaml`)
- transfer.py  fine-tuning from another model (`transfer_weights`, `load_pretrained`): the tensors that fit, and the
               head's slices of the classes both models name alike

A test that replaces a module global patches the module that reads it (`releases.RELEASES`, `safe.TORCH_SAFE_GLOBALS`):
the names here are the same objects, and replacing one here changes nothing the modules call.
"""

from models.checkpoints.load import attempt_load, load_model, model_yaml, run_record
from models.checkpoints.ours import (
    check_class_ids,
    from_safe,
    model_from_ckpt,
    model_to_ckpt,
    save_checkpoint,
    to_safe,
)
from models.checkpoints.releases import official_url
from models.checkpoints.safe import BadCheckpoint, UnsafeCheckpoint, allowed_global, load_checkpoint
from models.checkpoints.transfer import load_pretrained, transfer_weights

__all__ = [
    "BadCheckpoint", "UnsafeCheckpoint", "allowed_global", "attempt_load", "check_class_ids", "from_safe",
    "load_checkpoint", "load_model", "load_pretrained", "model_from_ckpt", "model_to_ckpt", "model_yaml",
    "official_url", "run_record", "save_checkpoint", "to_safe", "transfer_weights",
]
