import logging
import os
import re
import tempfile
from pathlib import Path

# Spinning OpenMP threads stall badly when the two cores are shared (tests that start subprocesses, other jobs):
# let idle threads sleep. Set before torch is imported, which is when OpenMP reads it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# label caches are signed with a key kept in the user's configuration folder (data/label_cache.py): the tests
# make and use one of their own, never the user's
os.environ.setdefault("YOLO_ENGINE_CONFIG_DIR", tempfile.mkdtemp(prefix="yolo-engine-config-"))

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Scripts the tests launch (train.py, segment/train.py, torchrun workers) import this checkout's packages, not
# whichever checkout `pip install -e .` last pointed at.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
PARITY = (ROOT / ".." / "shared" / "reference" / "parity").resolve()

# Two cores: one intra-op thread per test process keeps the 2-process DDP tests from oversubscribing.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def shapes_detect(tmp_path_factory):
    """A tiny synthetic detection dataset (YAML path), generated once per test session."""
    from data.synthetic import generate_dataset

    root = tmp_path_factory.mktemp("shapes")
    generate_dataset(root, task="detect", n_train=16, n_val=8, seed=0, min_side=96, max_side=160)
    return write_yaml(root, "detect")


@pytest.fixture(scope="session")
def shapes_segment(tmp_path_factory):
    from data.synthetic import generate_dataset

    root = tmp_path_factory.mktemp("shapes-seg")
    generate_dataset(root, task="segment", n_train=16, n_val=8, seed=0, min_side=96, max_side=160)
    return write_yaml(root, "segment")


@pytest.fixture(scope="session")
def shapes_classify(tmp_path_factory):
    from data.synthetic import generate_dataset

    root = tmp_path_factory.mktemp("shapes-cls")
    generate_dataset(root, task="classify", n_train=12, n_val=6, seed=0, min_side=64, max_side=64)
    return root


def write_yaml(root, task):
    import yaml

    names = {0: "circle", 1: "rectangle", 2: "triangle"}
    f = root / f"{task}.yaml"
    f.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/val", "names": names}))
    return f


# markers of tests that run only when a -m expression names them: their minutes are not in the whole suite, whose
# time CI bounds
OPT_IN = {
    "slurm": "starts a SLURM cluster (installing Debian's slurm packages when absent) and takes minutes "
             "(docs/distributed.md, \"Schedulers\")",
    "accuracy": "trains three 25-epoch runs, about 6 minutes (docs/recipes.md, \"The accuracy guard\")",
}


def pytest_collection_modifyitems(config, items):
    """A process-group test is also slow; a network test is skipped unless YOLO_TEST_NETWORK=1 (offline by default);
    an OPT_IN test runs only when a -m expression asks for its marker (`-m slurm`, `-m accuracy`)."""
    offline = pytest.mark.skip(reason="needs the internet: set YOLO_TEST_NETWORK=1 to run it")
    markexpr = config.getoption("markexpr") or ""
    not_asked = {name: pytest.mark.skip(reason=f"{why}: run it with -m {name}") for name, why in OPT_IN.items()
                 if not re.search(rf"(?<!not )\b{name}\b", markexpr)}
    for item in items:
        if item.get_closest_marker("ddp"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("network") and os.environ.get("YOLO_TEST_NETWORK") != "1":
            item.add_marker(offline)
        for name, skip in not_asked.items():
            if item.get_closest_marker(name):
                item.add_marker(skip)


_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")


@pytest.fixture(autouse=True)
def no_leaked_launcher_env():
    """A test that leaves torchrun's variables set makes every later test (and the processes it starts) run as some
    rank of a group that does not exist: fail the leaking test, and restore, so the damage stays with it."""
    before = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    yield
    after = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    leaked = {k: v for k, v in after.items() if v != before[k]}
    assert not leaked, f"test left launcher environment variables changed: {leaked}"


_IMPORT = __import__("builtins").__import__


@pytest.fixture(autouse=True)
def builtin_import_restored():
    """ClearML, once imported, wraps builtins.__import__ for the rest of the process (its import hooks, set up as
    early as a module fixture): a later test that pickles a payload naming builtins.__import__ then fails to pickle
    it. After each test the process's own import is back."""
    import builtins

    yield
    builtins.__import__ = _IMPORT


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def yolo_log():
    """Messages sent to the project's 'yolo' logger (attached directly: the app may turn off propagation)."""
    logger = logging.getLogger("yolo")
    handler, level = LogLines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.messages
    logger.removeHandler(handler)
    logger.setLevel(level)
