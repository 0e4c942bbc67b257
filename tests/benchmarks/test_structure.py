"""benchmarks/structure.py on a small tree written here, whose figures are counted by hand."""

from benchmarks.structure import ROOT, measure


def _tree(root):
    files = {
        "train.py": "import engine.trainer\n",
        "engine/__init__.py": "",
        "engine/tasks/__init__.py": "import yolo.api\nTASKS = 1\n",
        "yolo/api.py": "import train\n",  # the top floor, as the scripts
        "engine/trainer.py": ("from engine.tasks import TASKS\n"
                              "class BaseTrainer:\n"
                              "    def __init__(self):\n"
                              "        self.a, (self.b, self.c) = 1, (2, 3)\n"
                              "        self.d: int = 4\n"
                              "        self.a += 1\n"
                              "    def step(self):\n"
                              "        from utils import ops  # a lazy import from the floor below\n"
                              "        self.e = [x for x in range(3)]\n"
                              "        y = self.e\n"
                              "        return ops, y\n"
                              "    def hook(self):\n"
                              "        pass\n"),
        "engine/tasks/detect.py": ("from engine.trainer import BaseTrainer\n"
                                   "class DetectionTrainer(BaseTrainer):\n"
                                   "    def hook(self):\n"
                                   "        pass\n"
                                   "    def extra(self):\n"
                                   "        pass\n"
                                   "class PoseTrainer(DetectionTrainer):\n"
                                   "    def step(self):\n"
                                   "        pass\n"
                                   "    def extra(self):\n"
                                   "        pass\n"
                                   "    def own(self):\n"
                                   "        pass\n"),
        "utils/__init__.py": "",
        "utils/ops.py": "import models.yolo\n",
        "models/__init__.py": "",
        "models/yolo.py": "import torch\n" + "x = 1\n" * 420,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_structure_figures(tmp_path):
    _tree(tmp_path)
    m = measure(tmp_path, big=400, top=2)
    assert m["files over 400 lines"] == [(421, "models/yolo.py")]
    assert m["longest functions"] == [(5, "engine/trainer.py:7 step"), (4, "engine/trainer.py:3 __init__")]
    assert m["engine class attributes"] == {"BaseTrainer": ["a", "b", "c", "d", "e"]}
    # inherited through two generations; a method no parent has is not an override
    assert m["task class overrides"] == {"DetectionTrainer": ["hook"], "PoseTrainer": ["extra", "step"]}
    assert m["files"] == 10
    assert m["imports between project files"] == 7  # torch is not the project's; a lazy import counts
    # train -> engine/trainer -> engine/tasks -> yolo/api -> train: one loop of four files
    assert m["files that import each other"] == ["engine/tasks/__init__.py <-> engine/trainer.py <-> train.py <-> "
                                                 "yolo/api.py"]
    assert m["lines per room"] == {"models": "421 (93 %)", "engine": "28 (6 %)", "scripts": "1 (0 %)",
                                   "utils": "1 (0 %)", "yolo": "1 (0 %)"}
    assert sorted(m["arrows that climb"]) == ["engine/tasks/__init__.py:1 -> yolo/api.py",
                                              "engine/trainer.py:1 -> engine/tasks/__init__.py",
                                              "utils/ops.py:1 -> models/yolo.py"]


def test_no_import_climbs_the_floors_here():
    """docs/design.md's floors hold in this checkout: the engine's bases name the task scripts through
    engine/messages.py, never engine/tasks, and nothing below the engine imports it; no two files import each other
    (utils/errors.py and utils/versions.py did, through run_cli, now utils/run.py)."""
    m = measure(ROOT)
    assert m["arrows that climb"] == [] and m["files that import each other"] == []
