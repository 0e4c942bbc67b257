"""Per-task hooks (detect, segment, pose, classify), and where each task's scripts are, so that a model given to
the wrong script is sent to the right one in one line."""

from utils.errors import BadOption

SCRIPTS = {
    "detect": {"train": "train.py", "val": "val.py", "predict": "detect.py"},
    "segment": {"train": "segment/train.py", "val": "segment/val.py", "predict": "segment/predict.py"},
    "pose": {"train": "pose/train.py", "val": "pose/val.py", "predict": "pose/predict.py"},
    "classify": {"train": "classify/train.py", "val": "classify/val.py", "predict": "classify/predict.py"},
}


def check_task(task, accepted, what, role):
    """Refuse a model serving `task` where only `accepted` tasks fit: `what` names it (`--weights best.pt`), `role`
    is the script's ('train', 'val' or 'predict')."""
    if task not in accepted:
        where = SCRIPTS[task][role] if task in SCRIPTS else "none of this project's scripts"
        takes = " or ".join([", ".join(accepted[:-1]), accepted[-1]] if len(accepted) > 1 else accepted)
        raise BadOption(f"{what}: a {task or 'headless'} model; this script takes {takes} models (use {where})")
