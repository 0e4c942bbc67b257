"""Where a run continues: --resume by hand and torchrun's automatic restarts (engine/checkpointer.py restores it).

Rules (docs/distributed.md, "Stopping and resuming"):
- A bare `--resume` continues the newest *unfinished* run (its last.pt still holds an optimizer) under the runs
  folder this command writes to (--project, else the task's default).
- Options given with `--resume` that would change the run are refused, naming them; `--epochs` extends the run.
- `--resume auto` continues the run in --project/--name when it is unfinished and starts it there when the folder
  holds no run, so one command serves the first start, a requeued SLURM job and a spot machine's restart; options
  with the values the run was started with are the same command, others are refused as with `--resume PATH`.
- The saved options are checked as a command line is (`TrainOptions.check_saved`), and nothing named in the file is
  fetched: the run's model is the checkpoint's own (its `--weights` and `--cfg` are not read again) and its dataset
  must be there already (a `download:` is not followed), so a resumed file reaches neither the network nor a file
  of its choosing. The experiment trackers it names (W&B, MLflow, ClearML, Comet: the network, and files of their
  own) start only for a run folder inside the runs folder this command writes to or in the run's own --project, or
  when --loggers names them (`saved_loggers`).
- Under torchrun, global rank 0 records the run folder it chose in a file in the system's temp folder, named for
  the torchrun agent that started it (host, agent pid and its start time). When the agent restarts the worker group
  (TORCHELASTIC_RESTART_COUNT > 0), rank 0 reads the record back: the group continues in the same folder, from its
  last.pt if one was written, with no flag from the user. The record is removed when the run ends.
"""

import dataclasses
import os
import socket
import tempfile
from pathlib import Path

from engine.loggers import TRACKERS
from engine.messages import check_task
from engine.options import TrainOptions
from models.checkpoints import attempt_load, check_class_ids, load_checkpoint
from models.yolo import head_task, yaml_model_load
from utils import dist as du
from utils.cli import LOGGERS
from utils.errors import BadCheckpoint, BadFile, BadOption
from utils.files import increment_path
from utils.log import LOGGER

AUTO = "auto"  # --resume auto
RUN_FILES = ("results.csv", "weights/last.pt", "weights/best.pt")  # a folder holding any of these is a run


def run_model_yaml(path, names, data):
    """The YAML of the model a resumed run trains: its checkpoint's own. Refused where the dataset (`names`, read
    from --data `data`) counts other classes, or names the run's under other ids: its labels are class ids."""
    model = attempt_load(path, device="cpu", fuse=False)
    if model.nc != len(names):
        raise BadCheckpoint(f"--resume {path} trains {model.nc} classes, --data {data} has {len(names)}: resume on "
                            f"the run's dataset, or start a new run with --weights {path}")
    check_class_ids(model.names, names, f"--resume {path}", f"--data {data}", "resume on data")
    return model.yaml


def is_unfinished(ckpt):
    """A run that can continue: final_eval strips the optimizer from last.pt when training ends."""
    return isinstance(ckpt, dict) and ckpt.get("optimizer") is not None


def find_unfinished_run(search_dir):
    """The most recently written last.pt under `search_dir` whose run has not finished (for a bare --resume)."""
    candidates = sorted(Path(search_dir).rglob("last.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in candidates:
        if is_unfinished(load_checkpoint(p)):
            return p
    where = Path(search_dir).resolve()
    if candidates:
        raise BadOption(f"--resume: every run under {where} has finished ({len(candidates)} found); to train one "
                        f"further, start a new run with --weights <its last.pt> --epochs N")
    raise BadOption(f"--resume: no last.pt found under {where}")


def resume_opt(opt, default_project, given=(), options=TrainOptions, task=None):
    """For --resume [path]: (the run's saved options with this launch's device/workers and any --epochs, path).

    `opt`: this launch's options (an `options` object, the task's class); `given` names the options on the command
    line, and any that `options` does not let --resume change is refused. `task`, when given, is the only task whose
    runs this script continues.
    """
    rules = options.resume_rules()
    path = Path(opt.resume) if isinstance(opt.resume, str) else find_unfinished_run(opt.project or default_project)
    if not path.is_file():
        raise BadFile(f"--resume {path}: file not found")
    ckpt = load_checkpoint(path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("opt"), dict):
        raise BadCheckpoint(f"--resume {path}: not a checkpoint of a training run of this project (no options)")
    if not is_unfinished(ckpt):
        raise BadCheckpoint(f"--resume {path}: the run has finished (no optimizer state): nothing to resume; to "
                            f"train it further, start a new run with --weights {path} --epochs N")
    options.check_saved(ckpt["opt"], f"--resume {path}")  # typed and checked as the command line is
    refused = sorted(set(given) - set(rules))
    if refused:
        flags = ", ".join("--" + k.replace("_", "-") for k in refused)
        raise BadOption(f"--resume continues a run with its own options; {flags} would change it (start a new run "
                        f"with --weights PATH to train with other options)")
    if task is not None:
        check_task(run_task(ckpt, path), (task,), f"--resume {path}", "train")
    # options added to the project after this checkpoint was written take this launch's values, which are their
    # defaults (any other given option was refused above)
    saved = {**opt.to_dict(), **ckpt["opt"]}
    if "epochs" in given and opt.epochs != saved["epochs"]:
        done = ckpt["epoch"] + 1
        if opt.epochs <= done:
            raise BadOption(f"--epochs {opt.epochs}: {path} has already trained {done} epochs")
        change = "extending" if opt.epochs > saved["epochs"] else "shortening"
        LOGGER.info(f"--epochs {opt.epochs}: {change} the run from {saved['epochs']} epochs")
        saved["epochs"] = opt.epochs
    for k, rule in rules.items():
        if rule == "launch" or (rule == "given" and k in given):
            saved[k] = getattr(opt, k)
    if "loggers" not in given:
        saved["loggers"] = saved_loggers(saved["loggers"], path, Path(opt.project or default_project),
                                         ckpt["opt"].get("project"))
    saved["resume"] = False
    return options.from_values(saved), path


def saved_loggers(names, path, project, own_project=None):
    """The loggers a resumed run keeps of those its checkpoint `path` names: every one it names must be a logger
    (BadCheckpoint otherwise); an experiment tracker among them starts only where the run is where a run is made:
    its folder inside the runs folder `project` this command writes to (a bare --resume, --resume auto, a torchrun
    restart, --resume runs/train/exp/weights/last.pt), or a folder of the run's own --project (`own_project`, as
    saved), as the run made it. Elsewhere (a checkpoint downloaded, or handed over) a tracker would reach the
    network and write its files on the word of a file: it is left out, and one line says how to name it (--loggers,
    given with --resume, starts it)."""
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise BadCheckpoint(f"--resume {path}: its saved option loggers names {unknown[0]!r:.60}, which --loggers "
                            f"does not take (known: {', '.join(LOGGERS)})")
    trackers = [n for n in names if n in TRACKERS]
    folder = path.resolve().parent.parent
    own = isinstance(own_project, str) and own_project and Path(own_project).expanduser().resolve() == folder.parent
    if not trackers or own or Path(project).resolve() in folder.parents or Path(project).resolve() == folder:
        return names
    LOGGER.warning(f"WARNING: --resume {path}: its run logged to {', '.join(trackers)}, which start only for a run "
                   f"in its own --project or under {project}, or when named: give --loggers {' '.join(trackers)} to "
                   "continue there")
    return [n for n in names if n not in TRACKERS]


def saved_hyp(path):
    """The hyperparameters the run's checkpoint `path` records (the whole dict it trained with), which --resume and a
    torchrun restart continue with."""
    hyp = load_checkpoint(path).get("hyp")
    if not isinstance(hyp, dict):
        raise BadCheckpoint(f"--resume {path}: it records no hyperparameters")
    return hyp


def _launch_record():
    """`<tmp>/yolo-elastic/<host>-<agent pid>-<agent start>`, or None outside torchrun."""
    if du.launcher() != "torchrun":
        return None
    agent = os.getppid()
    try:  # the start time tells this agent from an earlier process that had the same pid
        start = Path(f"/proc/{agent}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "0"
    return Path(tempfile.gettempdir()) / "yolo-elastic" / f"{socket.gethostname()}-{agent}-{start}"


def elastic_run_dir():
    """Rank 0, after a torchrun restart: the run folder this launch recorded, or None."""
    record = _launch_record()
    # not keyed on TORCHELASTIC_RESTART_COUNT: with c10d a healthy machine restarts for a new peer without counting
    if record is None or not record.is_file():
        return None
    return Path(record.read_text().strip())


def record_run_dir(save_dir):
    record = _launch_record()
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(str(Path(save_dir).resolve()))


def run_dir(path, exist_ok, save_dir, is_main):
    """The run's folder on every rank: `save_dir` where the run is known (a resume, a torchrun restart), else
    `path` numbered on (`--exist-ok`: as it is, refused where it holds another run). Only rank 0 looks at the disk
    and records a new folder for a restart; every rank agrees on the folder, and on refusing it."""
    found = []
    if is_main:
        path = save_dir or increment_path(path, exist_ok=exist_ok)
        found = [] if save_dir else [f for f in RUN_FILES if (path / f).exists()]
        if not found:
            record_run_dir(path)
    path, found = du.broadcast_object((str(path), found) if is_main else None)
    if found:  # appending to its results.csv or replacing its weights would mix two runs
        raise BadOption(f"--exist-ok: {path} holds another run ({', '.join(found)}); choose a new --name, "
                        f"or continue that run with --resume {Path(path) / 'weights' / 'last.pt'}")
    return Path(path)


def forget_run_dir():
    record = _launch_record()
    if record is not None:
        record.unlink(missing_ok=True)


def weights_own_model(opt, given):
    """A new run with --weights and no --cfg trains the checkpoint's own model (`cfg` becomes the .pt), as YOLOv5
    (`cfg or the checkpoint's YAML`) and Ultralytics (`model=x.pt`) do; not the script's default YAML seeded with
    whichever tensors of another model happen to fit it. The options say so (`train_checkpoint_model`), for the
    trainers and the run's opt.yaml."""
    if not opt.weights or "cfg" in given:
        return opt
    LOGGER.info(f"--weights {opt.weights} without --cfg: training its own model (as --cfg {opt.weights})")
    return dataclasses.replace(opt, cfg=opt.weights, train_checkpoint_model=True)


def run_task(ckpt, path):
    """The task of the model a training checkpoint holds."""
    model = ckpt.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("yaml"), dict):
        raise BadCheckpoint(f"--resume {path}: not a checkpoint of a training run of this project (no model YAML)")
    return head_task(yaml_model_load(model["yaml"]))


def plan_run(opt, default_project, given=(), options=TrainOptions, task=None):
    """Rank 0: (options, checkpoint to resume from or None, run folder or None for a new one); `opt`: this launch's
    options, an `options` object (the task's options class), `task` the task it trains."""
    run_dir = elastic_run_dir()
    if run_dir is not None:
        last = run_dir / "weights" / "last.pt"
        if last.is_file() and is_unfinished(load_checkpoint(last)):
            LOGGER.info(f"torchrun restart {du.get_restart_count()}: resuming {last}")
            saved, _ = resume_opt(dataclasses.replace(opt, resume=str(last)), default_project, (), options, task)
            return saved, last, run_dir
        LOGGER.info(f"torchrun restart {du.get_restart_count()}: no checkpoint yet, starting over in {run_dir}")
        return weights_own_model(opt, given), None, run_dir
    if opt.resume == AUTO:
        return auto_run(opt, default_project, given, options, task)
    if opt.resume:
        saved, path = resume_opt(opt, default_project, given, options, task)
        return saved, path, path.parent.parent
    return weights_own_model(opt, given), None, None


def auto_run(opt, default_project, given, options, task):
    """--resume auto: (options, last.pt to continue or None, the run folder --project/--name)."""
    run_dir = Path(opt.project or default_project) / opt.name
    last = run_dir / "weights" / "last.pt"
    if last.is_file():
        ckpt = load_checkpoint(last)
        if not is_unfinished(ckpt) or not isinstance(ckpt.get("opt"), dict):
            raise BadOption(f"--resume auto: {run_dir} holds a finished run (or not one of this project's): "
                            f"nothing to continue; choose another --name to train anew")
        # what the command line repeats is not a change; what it changes is refused (or ruled) by resume_opt. --name
        # found the folder (which may differ from the name the run was started with, numbered by increment_path)
        rules = options.resume_rules()
        changed = [k for k in given if k in rules or (k != "name" and ckpt["opt"].get(k) != getattr(opt, k))]
        saved, _ = resume_opt(dataclasses.replace(opt, resume=str(last)), default_project, changed, options, task)
        LOGGER.info(f"--resume auto: continuing the unfinished run in {run_dir}")
        return dataclasses.replace(saved, resume=AUTO), last, run_dir
    found = [f for f in RUN_FILES if (run_dir / f).exists()]
    if found:
        raise BadOption(f"--resume auto: {run_dir} holds a run that cannot continue ({', '.join(found)}, no "
                        f"weights/last.pt); choose another --name")
    LOGGER.info(f"--resume auto: no run in {run_dir} yet, starting one there")
    return weights_own_model(opt, given), None, run_dir
