"""A task is one record (engine/tasks/__init__.py): every list of tasks is its names, every script runs its record's
classes with its record's options and run folders, and no task's class subclasses another task's."""

import ast
import importlib
import itertools

import pytest

import data.dataset_yaml
import data.synthetic
import models.backend
import models.yolo
import utils.cli
import yolo.scripts
from engine.messages import SCRIPTS
from engine.tasks import TASKS
from engine.tasks.boxes import BoxPredictor, BoxTrainer, BoxValidator
from utils.files import ROOT
from utils.tasks import TASKS as NAMES

ROLES = ("trainer", "validator", "predictor")


def test_every_list_of_tasks_is_the_one_tuple_of_names():
    """The floors below the engine read utils.tasks.TASKS itself; the engine's records and scripts are its names."""
    for module in (yolo.scripts, data.synthetic, data.dataset_yaml, models.backend):
        assert module.TASKS is NAMES, module.__name__
    assert list(SCRIPTS) == list(NAMES)
    assert sorted(models.yolo.BOX_TASKS + models.yolo.CLASSIFY_TASKS) == sorted(NAMES)  # each head, one model class
    assert list(NAMES) == list(TASKS)


def test_the_scripts_of_every_task_are_files_and_suffixes_name_the_head_s_task():
    """SCRIPTS and the `-seg/-cls/-pose/-obb` rule are made from the names, not listed: each script they give is a
    file of this clone, and every model YAML here whose name carries a suffix ends in a head of that suffix's task."""
    for task, scripts in SCRIPTS.items():
        for role, rel in scripts.items():
            assert (ROOT / rel).is_file(), (task, role, rel)
    suffixed = 0
    for path in sorted((ROOT / "models").glob("*.yaml")):
        named = yolo.scripts.model_task(path.name)  # the name alone: no file of that name in the working folder
        assert named == models.yolo.head_task(models.yolo.yaml_model_load(path)), path.name
        suffixed += named != "detect"
    assert suffixed >= len(NAMES) - 1  # every task but detect has models named with its suffix


def test_no_task_s_class_subclasses_another_task_s():
    for a, b in itertools.permutations(TASKS.values(), 2):
        for role in ROLES:
            assert getattr(b, role) not in getattr(a, role).__mro__, (a.name, b.name, role)
    for task in TASKS.values():  # each binds its family's class, which no task owns
        for role in ROLES:
            cls = getattr(task, role)
            assert cls.record is task and cls.__mro__[1].record is None


def test_the_box_tasks_share_one_trainer_validator_and_predictor():
    for name in ("detect", "segment", "pose"):
        assert TASKS[name].engine == (BoxTrainer, BoxValidator, BoxPredictor)
    assert TASKS["segment"].validator is TASKS["segment"].validator  # bound once: a patch on it holds


def _holds_a_task(node):
    """`task`, `opt.task`, `meta["task"]` (or any name or attribute with "task" in it): an expression that holds one."""
    if isinstance(node, ast.Name):
        return "task" in node.id
    if isinstance(node, ast.Attribute):
        return "task" in node.attr
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "task"


def _task_names_in(node):
    """The task names that a string constant, or a tuple, list or set of them, holds."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in items if isinstance(e, ast.Constant) and e.value in NAMES}


def task_comparisons(source):
    """`(line, code)` of each comparison in `source` of a task with a task's name (`task == "pose"`,
    `opt.task in ("detect", "obb")`): code that branches on which task it runs."""
    found = []
    for node in ast.walk(ast.parse(source)):
        sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(map(_holds_a_task, sides)) and any(map(_task_names_in, sides)):
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [(line, code) for line, _, code in sorted(found)]  # in reading order: ast.walk goes breadth first


def test_no_engine_code_names_the_task_it_runs():
    """What differs between tasks is in their records (and the heads' declarations): engine/ never compares a task
    with a task's name (issue 58)."""
    assert [c for _, c in task_comparisons('d = a if task == "classify" else b(keypoints=opt.task == "pose")\n'
                                           'x = meta["task"] in ("obb", "segment") or fmt == "openvino"')] == \
        ["task == 'classify'", "opt.task == 'pose'", "meta['task'] in ('obb', 'segment')"]
    found = {f"{f.relative_to(ROOT)}:{line}: {code}" for f in sorted((ROOT / "engine").rglob("*.py"))
             for line, code in task_comparisons(f.read_text())}
    assert not found, "engine code branches on the task; say it in its record instead:\n" + "\n".join(sorted(found))


@pytest.mark.parametrize("task", list(TASKS))
def test_each_script_parses_its_record_s_options_and_folders(task, monkeypatch):
    """The scripts' parsers are made without torch (for a quick --help), so they name their options class and run
    folder themselves: the record's, checked here."""
    record, made = TASKS[task], []
    real = utils.cli.add_option_fields

    def keep(p, options, defaults, *args, **kwargs):
        made.append((options, kwargs.get("project") or defaults["project"]))
        return real(p, options, defaults, *args, **kwargs)

    monkeypatch.setattr(utils.cli, "add_option_fields", keep)
    for role, options in (("train", record.train), ("val", record.val), ("predict", record.predict)):
        assert (ROOT / record.scripts[role]).is_file()
        script = importlib.import_module(record.scripts[role].removesuffix(".py").replace("/", "."))
        made.clear()
        script.parse_opt(["--weights", "x.pt"] if role != "train" else [])
        assert made == [(options, record.projects[role])], (task, role)
