"""A task is one record (engine/tasks/__init__.py): every list of tasks is its names, every script runs its record's
classes with its record's options and run folders, and no task's class subclasses another task's."""

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
