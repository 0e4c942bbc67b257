"""Not a script: what `from yolo import YOLO` finds when the working folder holds this clone under the name `yolo`.
Python then takes the clone's folder for the package `yolo` (a folder without __init__.py is a namespace package,
found before the installed one) and looks for `YOLO` inside it, here; without this file the error would say only
"cannot import name 'YOLO' from 'yolo' (unknown location)"."""

from pathlib import Path

raise ImportError(f"from yolo import YOLO: the folder {Path(__file__).resolve().parent} (this project's clone, named "
                  "'yolo') in the working folder hides the installed package `yolo`; run Python from another folder, "
                  "or from inside the clone, or rename the clone's folder")
