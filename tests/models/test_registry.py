"""models/registry.py: blocks from a user's own file (--modules), and checkpoints that record and require them."""

import hashlib
import json

import pytest
import torch
import torch.nn as nn

import models.heads as heads
import models.registry as registry
from models.checkpoints import attempt_load, load_checkpoint, model_to_ckpt, save_checkpoint
from models.yolo import DetectionModel
from tests.user_blocks_util import BLOCKS, with_rows
from utils.errors import BadCheckpoint, BadModelYaml, BadOption


@pytest.fixture
def blocks(tmp_path, monkeypatch):
    """A user's file of two blocks, and a registry of user blocks of this test's own."""
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    f = tmp_path / "my_blocks.py"
    f.write_text(BLOCKS)
    return f


def test_a_users_blocks_become_row_names(blocks):
    with pytest.raises(BadModelYaml, match="unknown module 'Scale'; a block of your own comes with --modules"):
        DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3)
    assert sorted(registry.use_modules([blocks, blocks])) == ["Blur", "Blur", "Scale", "Scale"]  # once imported
    m = DetectionModel(with_rows([-1, 1, "Scale", [1024]], [-1, 1, "Blur", []]), nc=3)
    assert type(m.model[10]).__name__ == "Scale" and m.model[10].g.shape == (1, 256, 1, 1)  # width-scaled: 1024/4
    assert type(m.model[11]).__name__ == "Blur"
    assert registry.USER_BLOCKS["Scale"].sha256 == hashlib.sha256(blocks.read_bytes()).hexdigest()


@pytest.mark.parametrize("source, message", [
    ("import torch.nn as nn\nclass Conv(nn.Module):\n    pass\n", "Conv is the name of a built-in block"),
    ("x = 1\n", "defines no torch.nn.Module subclass"),
    ("import torch.nn as nn\n\nclass A(nn.Module:\n    pass\n", r"bad\.py:3: importing it raised SyntaxError"),
    ("import torch.nn as nn\n\n\nraise RuntimeError('boom')\n", r"bad\.py:4: importing it raised RuntimeError: boom"),
])
def test_a_bad_file_is_one_error_naming_it(source, message, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    f = tmp_path / "bad.py"
    f.write_text(source)
    with pytest.raises(BadOption, match=message):
        registry.use_modules([f])


def test_the_code_that_runs_is_the_code_that_was_hashed(blocks, monkeypatch):
    """--modules imports through importlib (a module spec and loader), from the bytes it hashed:
    a file rewritten between the read and the import does not run its new text under the old sha256."""
    import inspect

    blocks.write_text(blocks.read_text() + "# a sha256 of this test's own: no module imported before is reused\n")
    read = registry.Path.read_bytes
    first = blocks.read_bytes()

    def read_then_rewrite(path):
        data = read(path)
        if path == blocks:
            blocks.write_text("raise SystemExit('the rewritten file ran')\n")
        return data

    monkeypatch.setattr(registry.Path, "read_bytes", read_then_rewrite)
    assert sorted(registry.use_modules([blocks])) == ["Blur", "Scale"]
    cls = registry.USER_BLOCKS["Scale"].cls
    module = inspect.getmodule(cls)
    assert module.__spec__.origin == str(blocks) and module.__file__ == str(blocks)
    assert registry.USER_BLOCKS["Scale"].sha256 == hashlib.sha256(first).hexdigest()


def test_missing_files_and_clashing_names(blocks, tmp_path):
    for path in (tmp_path / "none.py", tmp_path / "blocks.txt"):
        with pytest.raises(BadOption, match=rf"--modules {path}"):
            registry.use_modules([path])
    registry.use_modules([blocks])
    other = tmp_path / "other.py"
    other.write_text("import torch.nn as nn\nclass Scale(nn.Module):\n    pass\n")
    with pytest.raises(BadOption, match="Scale is also defined by my_blocks.py"):
        registry.use_modules([other])


def test_checkpoint_records_and_requires_the_users_blocks(blocks, tmp_path, monkeypatch):
    """A checkpoint of a model with user blocks names them and the file's sha256, first in its pickle; without
    --modules it is refused naming them and the option before torch unpickles anything; with another version of
    the file it loads with a warning."""
    registry.use_modules([blocks])
    model = DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3)
    save_checkpoint({"model": model_to_ckpt(model), "epoch": 3}, tmp_path / "m.pt")
    plain = tmp_path / "plain.pt"
    save_checkpoint({"model": model_to_ckpt(DetectionModel("yolov8n.yaml", nc=3))}, plain)
    ckpt = load_checkpoint(tmp_path / "m.pt")
    assert list(ckpt)[0] == registry.NEEDS_KEY and "user_blocks" not in load_checkpoint(plain)
    assert json.loads(ckpt[registry.NEEDS_KEY]) == {"Scale": {"file": "my_blocks.py",
                                                              "sha256": registry.USER_BLOCKS["Scale"].sha256}}
    assert type(attempt_load(tmp_path / "m.pt").model[10]).__name__ == "Scale"

    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("unpickled"))
    with pytest.raises(BadCheckpoint, match=r"m\.pt: its model needs blocks of your own \(Scale, from my_blocks\.py\)"
                                            r": give that file with --modules FILE\.py"):
        load_checkpoint(tmp_path / "m.pt")
    monkeypatch.undo()

    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    blocks.write_text(BLOCKS + "\n# edited\n")
    registry.use_modules([blocks])
    warnings = []
    monkeypatch.setattr(registry.LOGGER, "warning", warnings.append)
    attempt_load(tmp_path / "m.pt")
    assert len(warnings) == 1 and "block Scale comes from my_blocks.py, whose sha256 differs" in warnings[0]


def test_a_forged_record_cannot_hide_a_needed_block(blocks, tmp_path, monkeypatch):
    """The record is a convenience, not the guard: a checkpoint whose record is missing or wrong still fails to
    build a block nobody gave, as one error naming it."""
    registry.use_modules([blocks])
    model = DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3)
    torch.save({"model": model_to_ckpt(model)}, tmp_path / "m.pt")  # written without the record
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    with pytest.raises(BadCheckpoint, match="unknown module 'Scale'"):
        attempt_load(tmp_path / "m.pt")


def test_a_forged_record_is_one_short_line(blocks, tmp_path, monkeypatch):
    """A record naming what no class could be called (a newline, a built-in's name with a dot) is ignored, and a
    real but absurdly long list is cut: the refusal stays one line."""
    registry.use_modules([blocks])
    model = DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3)
    names = {"Scale": {"file": "a\nb.py"}, "x\ny": {}, "nn.Conv2d": {}, **{f"B{i}" * 20: {} for i in range(50)}}
    torch.save({registry.NEEDS_KEY: json.dumps(names), "model": model_to_ckpt(model)}, tmp_path / "m.pt")
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    with pytest.raises(BadCheckpoint) as e:
        load_checkpoint(tmp_path / "m.pt")
    message = str(e.value)
    assert "\n" not in message, repr(message)
    assert len(message) < 700 and "(B0B0" in message and "..." in message and "x y" not in message


def test_an_exception_in_a_users_block_is_one_error_naming_the_row(blocks):
    """Scale asserts its input's width equals the row's: a row that breaks it is the YAML's mistake, one line."""
    registry.use_modules([blocks])
    with pytest.raises(BadModelYaml, match=r"backbone\[10\]\): your block Scale refused .*AssertionError"):
        DetectionModel(with_rows([-1, 1, "Scale", [512]]), nc=3)


def test_a_block_rule_parse_model_lacks_is_the_users_error(blocks):
    """A channel_rule no parse_model branch knows is a bug in a built-in block but the user's mistake in theirs."""
    blocks.write_text(blocks.read_text().replace('channel_rule = "width"', 'channel_rule = "depth"'))
    registry.use_modules([blocks])
    with pytest.raises(BadModelYaml, match=r"your block Scale refused .*NotImplementedError: Scale\.channel_rule"):
        DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3)


def test_only_the_blocks_no_file_gave_are_named(blocks, tmp_path, monkeypatch):
    """A checkpoint needing Scale and Blur, loaded with a file that defines Blur alone: refused, naming Scale."""
    registry.use_modules([blocks])
    model = DetectionModel(with_rows([-1, 1, "Scale", [1024]], [-1, 1, "Blur", []]), nc=3)
    save_checkpoint({"model": model_to_ckpt(model)}, tmp_path / "m.pt")
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    blur = tmp_path / "blur.py"
    blur.write_text(BLOCKS[:BLOCKS.index("class Scale")] + BLOCKS[BLOCKS.index("class Blur"):])
    registry.use_modules([blur])
    with pytest.raises(BadCheckpoint, match=r"needs blocks of your own \(Scale, from my_blocks\.py\)"):
        load_checkpoint(tmp_path / "m.pt")


def test_an_edited_block_whose_weights_no_longer_fit_is_one_error(blocks, tmp_path, monkeypatch):
    """The file changed (warned by sha256) so that its parameter has another shape: the load by key says which."""
    registry.use_modules([blocks])
    save_checkpoint({"model": model_to_ckpt(DetectionModel(with_rows([-1, 1, "Scale", [1024]]), nc=3))},
                    tmp_path / "m.pt")
    monkeypatch.setattr(registry, "USER_BLOCKS", {})
    blocks.write_text(BLOCKS.replace("torch.full((1, c1, 1, 1), 0.5)", "torch.full((c1, 1, 1), 0.5)"))
    registry.use_modules([blocks])
    warnings = []
    monkeypatch.setattr(registry.LOGGER, "warning", warnings.append)
    with pytest.raises(BadCheckpoint, match=r"m\.pt: its model is malformed .*size mismatch for model\.10\.g"):
        attempt_load(tmp_path / "m.pt")
    assert len(warnings) == 1 and "whose sha256 differs" in warnings[0]


def test_every_head_class_is_nameable():
    """The heads a YAML row may name are found in models/heads.py, not listed: each nn.Module class it defines
    resolves by its own name (an ambiguous name by the YAML's anchors), so a new head cannot be left out."""
    defined = [c for c in vars(heads).values()
               if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == heads.__name__]
    assert len(defined) == len(registry.HEADS) == 9
    for c in defined:
        assert c in registry.HEADS and c in (registry.resolve(c.__name__, True), registry.resolve(c.__name__, False))
    assert registry.resolve("Detect", True) is heads.Detect
    assert registry.resolve("Detect", False) is heads.AnchorFreeDetect
    assert registry.resolve("Segment", False) is heads.AnchorFreeSegment


def test_a_head_made_outside_heads_py_is_no_builtin():
    class Elsewhere(heads.AnchorFreeDetect):
        pass

    assert Elsewhere not in registry.HEADS and registry.resolve("Elsewhere", False) is None

