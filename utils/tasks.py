"""The names of the tasks: the one list of them. It imports nothing, so every floor reads it (models/heads.py, the
synthetic sets of data/, `yolo --help`); engine/tasks holds one record for each name."""

TASKS = ("detect", "segment", "pose", "obb", "classify")
# the suffix of a task's model names (yolov8n-seg.yaml, yolov8n-cls.pt, yolo11n-obb.yaml): the task's name unless
# Ultralytics shortens it; detection's models have none. A new task's suffix is its name, with no line here.
SHORT = {"segment": "seg", "classify": "cls"}
SUFFIX_TASKS = {SHORT.get(t, t): t for t in TASKS if t != "detect"}
