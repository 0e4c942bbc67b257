"""What a val, predict or export command takes from the run that made its weights, as Ultralytics and YOLOv5 do: the
image size it trained at and, where that file still exists, its dataset. An option given on the command line (or
by a Python caller) wins; one that neither gives (None) falls back to the task's own value: its field's metadata
`run_default` in the options class (engine/options.py), which the script's --help names too. One log line says what
was taken and from where.

What is known of a run is read with the weights, once: a checkpoint's by models/checkpoints.training_run (ours, an
official YOLOv5 or Ultralytics one), an export's from its metadata (`imgsz`, `data`), as InferenceBackend.run. A file
is input like a command line (docs/safety.md): its image size is checked as --img is (models/checkpoints.run_record),
and the dataset it names is read where it is, never downloaded (data/dataset_yaml.NamedByFile).
"""

import copy
import dataclasses
from pathlib import Path

from data.dataset_yaml import NamedByFile
from utils.log import LOGGER

FLAGS = {"imgsz": "--img", "data": "--data"}  # the options a run may fill, in the order the log line names them


def dataset_file(data, given):
    """What a training run records as its dataset (`TrainOptions.data_path`): the dataset YAML that --data `given`
    named, or the folder it named (classification), absolute; None for a dataset dict."""
    found = data.get("yaml_file") or (data.get("path") if isinstance(given, (str, Path)) and Path(given).is_dir()
                                      else None)
    return str(Path(found).resolve()) if found else None


def run_values(opt, known):
    """{option: value} for each option of `opt` (an options object: engine/options.py) whose field has a
    `run_default` and that is None: the weights' run's (`known`: an InferenceBackend's `run`, or
    models/checkpoints.load_model's), else that default. Says in one line what came from the run, and which dataset
    no longer exists."""
    inherited = {f.name: f.metadata["run_default"] for f in dataclasses.fields(opt) if "run_default" in f.metadata}
    assert set(inherited) <= set(FLAGS), f"no flag for {set(inherited) - set(FLAGS)}"  # a field marked in error
    fallbacks = {k: inherited[k] for k in FLAGS if k in inherited}
    wanted = [k for k in fallbacks if getattr(opt, k) is None]
    values, taken, gone = {}, [], None
    for k in wanted:
        value = known.get(k)
        if k == "data" and value is not None and not Path(value).exists():
            value, gone = None, value
        if value is None:
            value = copy.copy(fallbacks[k])  # a list of its own, not the class's
        else:
            taken.append(f"{FLAGS[k]} {value}")
            if k == "data":  # read where it is, never fetched (its download: could name any URL)
                value = NamedByFile(value, f"the run record of {opt.weights}")
        values[k] = value
    said = []
    if taken:
        said.append(f"{' and '.join(taken)} from the run that made {opt.weights}")
    if gone:
        instead = f", so --data {values['data']}" if values["data"] is not None else ""
        said.append(f"its run's dataset {gone} no longer exists{instead}")
    if said:
        LOGGER.info("; ".join(said) + " (give the option to choose another)")
    return values
