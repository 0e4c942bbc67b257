"""The names of the tasks: the one list of them. It imports nothing, so every floor reads it (models/heads.py, the
synthetic sets of data/, `yolo --help`); engine/tasks holds one record for each name."""

TASKS = ("detect", "segment", "pose", "obb", "classify")
