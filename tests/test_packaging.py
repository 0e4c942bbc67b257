"""The install the README shows: `pip install -e .` for the core (no tracker, exporter or test package), the extras
[trackers], [export], [openvino] and [dev] (everything the tests need), the `yolo` command; the quick start is two
commands (install + train, install + test) and .ci/run runs that test command. The slow test installs the clone into a
fresh virtual environment (over this one's packages, offline) and runs the command and the API from elsewhere."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.test_cli_docs import _commands
from utils.files import ROOT

PYPROJECT = (ROOT / "pyproject.toml").read_text()


def _list(name):
    """The quoted requirement names of the TOML array `name = [...]` in pyproject.toml."""
    body = re.search(rf"^{re.escape(name)} = \[(.*?)\]$", PYPROJECT, re.S | re.M).group(1)
    return [re.split(r"[<>=\[]", r)[0] for r in re.findall(r'"([^"]+)"', body)]


def test_the_core_leaves_out_trackers_exporters_and_test_tools():
    core = _list("dependencies")
    assert {"torch", "torchvision", "numpy", "opencv-python-headless"} <= set(core)
    assert not set(core) & {"wandb", "mlflow", "clearml", "comet_ml", "onnx", "onnxruntime", "pytest", "openvino",
                            "nncf", "motmetrics"}
    assert _list("trackers") == ["wandb", "mlflow", "clearml", "comet_ml"]
    assert _list("export") == ["onnx", "onnxruntime"]
    assert _list("openvino") == ["openvino", "nncf"]
    assert _list("dev") == ["pytest", "motmetrics", "yolo-engine"]
    assert '"yolo-engine[export,trackers,openvino]"' in PYPROJECT
    assert re.search(r'^yolo = "yolo.cli:main"$', PYPROJECT, re.M)


def test_the_quick_start_is_two_commands_and_ci_runs_the_tests_one():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", readme, re.S).group(1)
    lines = [line.split(" #")[0].strip() for line in block.strip().splitlines()]
    assert len(lines) == 2
    (install_a, train), (install_b, tests) = (line.split(" && ") for line in lines)
    assert install_a == "pip install -e ." and train.startswith("python train.py")
    assert install_b == 'pip install -e ".[dev]"' and tests == "python -m pytest -q tests"
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("pip ")]
    assert [shlex.split(c.replace("pip install -q", "pip install")) for c in ci] == [shlex.split(lines[1])]
    assert sum(1 for _, argv in _commands(ROOT / "README.md") if argv[:2] == ["pip", "install"]) >= 2


@pytest.mark.slow
def test_a_fresh_environment_gets_the_command_and_the_api(tmp_path):
    venv = tmp_path / "venv"
    # --without-pip: the environment's own pip and setuptools, which build an editable install offline (a venv's
    # bundled setuptools lacks bdist_wheel)
    subprocess.run(["timeout", "300", sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what the install gives
    # offline: the build backend and every dependency come from the environment underneath
    r = subprocess.run(["timeout", "600", str(py), "-m", "pip", "install", "--no-index", "--no-build-isolation", "-q",
                        "-e", f"{ROOT}[dev]"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["timeout", "120", str(venv / "bin" / "yolo"), "help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "yolo detect train" in r.stdout, r.stderr[-2000:]
    r = subprocess.run(["timeout", "120", str(venv / "bin" / "yolo"), "segment", "val", "--help"], cwd=tmp_path,
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0 and "--weights" in r.stdout and "segmentation" in r.stdout, r.stderr[-2000:]
    (tmp_path / "train.py").write_text("raise SystemExit('the user's own train.py ran')\n")  # never taken for ours
    probe = ("import yolo, engine, pathlib; from yolo.scripts import load_script; "
             "print(pathlib.Path(yolo.__file__).parent.parent, pathlib.Path(engine.__file__).parent.parent, "
             "load_script('detect', 'train').__file__)")
    r = subprocess.run(["timeout", "120", str(py), "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == [str(ROOT), str(ROOT), str(ROOT / "train.py")]
