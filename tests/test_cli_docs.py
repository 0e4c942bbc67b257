"""The scripts' --help, and the commands the documents show: every option has help text and its default once, the
launcher's option comes last; every command in README.md and docs/*.md parses with the options its script has, so
the documents cannot drift from the scripts."""

import ast
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from utils.files import ROOT
from yolo.cli import split_words
from yolo.scripts import script_path

SCRIPTS = ["train", "val", "detect", "export", "segment.train", "segment.val", "segment.predict", "classify.train",
           "classify.val", "classify.predict", "pose.train", "pose.val", "pose.predict"]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _help(module):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        importlib.import_module(module).parse_opt(["--help"])
    assert e.value.code == 0
    return out.getvalue()


def _entries(text):
    """{first option string: (invocation, help text)} of a --help output."""
    entries, current = {}, None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            invocation, _, help_text = line.strip().partition("  ")
            current = invocation.split()[0].rstrip(",")
            entries[current] = [invocation, help_text.strip()]
        elif current and re.match(r"^ {4,}\S", line):
            entries[current][1] = (entries[current][1] + " " + line.strip()).strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("module", SCRIPTS)
def test_help_says_every_option_and_its_default_once(module):
    text = _help(module)
    entries = _entries(text)
    assert "--weights" in entries and "(default: None)" not in text
    for flag, (_, help_text) in entries.items():
        assert help_text, f"{module} {flag} has no help"
        assert help_text.count("(default") <= 1, f"{module} {flag}: {help_text}"
    if module != "export":
        assert list(entries)[-1] == "--local-rank", "the launcher's option comes last"


def test_help_comes_before_torch_is_imported():
    """--help of every script and of `yolo` imports no torch (seconds on a small CPU): the scripts import their
    engine after parsing."""
    probe = ("import contextlib, importlib, io, sys\n"
             f"for module in {SCRIPTS!r}:\n"
             "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
             "        importlib.import_module(module).parse_opt(['--help'])\n"
             "from yolo.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['help'])\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'cv2')))\n")
    r = subprocess.run(["timeout", "120", sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout[-2000:], r.stderr[-2000:])


def _commands(doc):
    """(line, argv) of every shell command in the ```bash blocks of `doc`, continuation lines joined."""
    text = doc.read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|;", line):
                if part.strip() and not part.strip().startswith("#"):
                    yield part.strip(), shlex.split(part)


SBATCH = "examples/slurm/train.sbatch"


def _script_args(argv):
    """(module, args) of a command that runs one of SCRIPTS, directly, under torchrun, through the SLURM script,
    TorchX's dist.ddp (`--script`) or as `yolo TASK MODE ...`; None for other commands. The launcher's own options are
    checked by torchrun's parser."""
    if argv[:1] == ["yolo"]:
        task, mode, args = split_words(argv[1:])
        return script_path(task, mode).removesuffix(".py").replace("/", "."), args
    if argv[:1] == ["sbatch"] and SBATCH in argv:
        argv = ["python", *argv[argv.index(SBATCH) + 1 :], "--name", "job1", "--resume", "auto"]  # as it runs them
    elif argv[:2] == ["torchx", "run"] and "--script" in argv:
        argv = ["python", *argv[argv.index("--script") + 1 :]]
    elif argv[:1] == ["torchrun"]:
        argv = ["python", "-m", "torch.distributed.run", *argv[1:]]
    if argv[:1] != ["python"]:
        return None
    rest = argv[1:]
    if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        from torch.distributed.run import get_args_parser

        launcher = get_args_parser().parse_args(rest[2:])
        rest = [launcher.training_script, *launcher.training_script_args]
    if not rest or not rest[0].endswith(".py"):
        return None
    assert (ROOT / rest[0]).is_file(), f"{rest[0]} does not exist"
    module = rest[0].removesuffix(".py").replace("/", ".")
    return (module, rest[1:]) if module in SCRIPTS else None


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_documented_command_parses(doc):
    parsed = 0
    for line, argv in _commands(doc):
        found = _script_args(argv)
        if found:
            module, args = found
            importlib.import_module(module).parse_opt(args)  # a BadOption names what does not parse
            parsed += 1
    assert parsed or doc.name != "README.md"


def test_the_kubernetes_manifest_runs_a_command_that_parses():
    """examples/kubernetes/pytorchjob.yaml: its torchrun line parses, continues its run on the mounted volume, and
    the volume is one every pod may write."""
    docs = list(yaml.safe_load_all((ROOT / "examples/kubernetes/pytorchjob.yaml").read_text()))
    claim, job = docs
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    [container] = pod["containers"]
    [line] = [x for x in container["args"][0].replace("\\\n", " ").splitlines() if x.strip().startswith("torchrun")]
    module, args = _script_args(shlex.split(line.split("&")[0]))
    opt = importlib.import_module(module).parse_opt(args).opt  # a train script: utils/cli.Parsed
    assert opt.resume == "auto" and opt.project == "/runs"
    assert {"name": "runs", "mountPath": "/runs"} in container["volumeMounts"]


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_documented_python_compiles(doc):
    for block in re.findall(r"```python\n(.*?)```", doc.read_text(), re.S):
        ast.parse(block)


def test_the_cpu_install_hint_asks_for_the_versions_the_package_allows():
    """Else pip replaces the CPU build with the CUDA one when it installs the package."""
    wanted = sorted(re.findall(r'"(torch(?:vision)?>=[^"]+)"', (ROOT / "pyproject.toml").read_text()))
    hint = next(argv for _, argv in _commands(ROOT / "README.md") if "--index-url" in argv)
    assert sorted(a for a in hint if a.startswith("torch")) == wanted


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__"))
def test_benchmarks_run_as_the_documents_show(name):
    """`python -m benchmarks.<name> --help` from the root of a clone, as docs/performance.md shows: no PYTHONPATH
    (and no path edits in the scripts), so a benchmark that imports the project finds this checkout by itself."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(["timeout", "120", sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def test_benchmarks_leave_the_path_alone():
    """The project installs itself editable and `-m` puts the root first: a benchmark that edits sys.path would
    import another checkout than the one it is run from."""
    edits = [p.name for p in (ROOT / "benchmarks").glob("*.py") if re.search(r"sys\.path\.(insert|append)|PYTHONPATH",
                                                                           p.read_text())]
    assert edits == []
