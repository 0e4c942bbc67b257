"""What a val, predict or export command takes from the run that made its weights, as Ultralytics and YOLOv5 do: the
image size it trained at and, where that file still exists, its dataset. An option given on the command line (or
by a Python caller) wins; one that neither gives falls back to the script's own default (`run_defaults`, which the
parsers in utils/cli.py set). One log line says what was taken and from where.

Known runs: a checkpoint of ours (`opt`: `train_imgsz`, and `data_path`, the dataset file or folder the run read,
absolute), an official YOLOv5 one (`opt`: `imgsz`) or Ultralytics one (`train_args`: `imgsz`), and an export of ours
(its metadata: `imgsz`, `data`). Only our own runs give a dataset: the official ones name COCO, which a val script
would download.
"""

from pathlib import Path

from utils.loggers import LOGGER

FLAGS = {"imgsz": "--img", "data": "--data"}


def _size(value):
    """An image size as the options hold it: an int (a [h, w] pair: its long side)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return max(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def dataset_file(data, given):
    """What a training run records as its dataset (`TrainOptions.data_path`): the dataset YAML that --data `given`
    named, or the folder it named (classification), absolute; None for a dataset dict."""
    found = data.get("yaml_file") or (data.get("path") if isinstance(given, (str, Path)) and Path(given).is_dir()
                                      else None)
    return str(Path(found).resolve()) if found else None


def checkpoint_settings(ckpt):
    """{'imgsz', 'data'} a checkpoint dict says of its training run, where it says it."""
    opt = ckpt.get("opt") if isinstance(ckpt.get("opt"), dict) else ckpt.get("train_args")
    if not isinstance(opt, dict):
        return {}
    found = {"imgsz": _size(opt.get("train_imgsz")) or _size(opt.get("imgsz")), "data": opt.get("data_path")}
    return {k: v for k, v in found.items() if v}


def export_settings(metadata):
    """{'imgsz', 'data'} an export's metadata (models/backend.export_metadata) says of the run it came from."""
    found = {"imgsz": _size(metadata.get("imgsz")), "data": metadata.get("data")}
    return {k: v for k, v in found.items() if v}


def run_settings(weights, backend=None):
    """What is known of the run that made `weights`: a `.pt` file is read (models/checkpoints.load_checkpoint, the one
    loader), an export's metadata read from `backend` (an InferenceBackend of it) or from a backend made here. {} for
    a file that is not there (an official name not downloaded yet: the loader that follows fetches it)."""
    if backend is not None and backend.format != "pytorch":
        return export_settings(backend.metadata)
    path = Path(weights)
    if not path.is_file():
        return {}
    if path.suffix.lower() == ".pt":
        from models.checkpoints import load_checkpoint

        ckpt = load_checkpoint(path)
        return checkpoint_settings(ckpt) if isinstance(ckpt, dict) else {}
    from models.backend import InferenceBackend

    return export_settings(InferenceBackend(path).metadata)


def run_values(opt, backend=None, known=None):
    """{option: value} for each option of `opt.run_defaults` (a parsed namespace, or ExportOptions) that is None: the
    weights' run's (`known`, else read by run_settings), else that default. Says in one line what came from the run,
    and which dataset no longer exists."""
    given = vars(opt)
    wanted = [k for k in opt.run_defaults if given[k] is None]
    if not wanted:
        return {}
    known = run_settings(opt.weights, backend) if known is None else known
    values, taken, gone = {}, [], None
    for k in wanted:
        value = known.get(k)
        if k == "data" and value is not None and not Path(value).exists():
            value, gone = None, value
        if value is None:
            value = opt.run_defaults[k]
        else:
            taken.append(f"{FLAGS[k]} {value}")
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
