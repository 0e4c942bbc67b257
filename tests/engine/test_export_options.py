"""export.py's options: its arguments are ExportOptions' fields, whose defaults are the command line's, and the
exporter reads them as that class, built once."""

import dataclasses
from types import SimpleNamespace

import pytest

import export
from engine.options import ExportOptions


def test_every_export_argument_is_a_field_with_the_command_line_s_default():
    parsed = export.parse_opt(["--weights", "w.pt"])
    assert set(vars(parsed)) == {f.name for f in dataclasses.fields(ExportOptions)}
    assert ExportOptions.from_values(parsed) == ExportOptions(weights="w.pt")
    opt = ExportOptions.from_values(export.parse_opt(["--weights", "w.pt", "--no-dynamic", "--img", "320", "192",
                                                      "--batch", "4", "format=onnx", "--opset", "12"]))
    assert (opt.dynamic, opt.imgsz, opt.batch_size, opt.include, opt.opset) == (False, [320, 192], 4, ["onnx"], 12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opt.half = True


def test_the_exporter_reads_a_namespace_naming_some_options_as_export_options():
    from engine.exporter import Exporter

    exporter = Exporter(SimpleNamespace(weights="w.pt", include=["onnx"], opset=13))
    assert exporter.opt == ExportOptions(weights="w.pt", include=["onnx"], opset=13)
    assert (exporter.opt.modules, exporter.opt.dynamic, exporter.opt.device) == ([], None, "cpu")  # None: per format


def test_the_export_arguments_made_from_the_fields_keep_their_order_and_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # no line broken inside a word (argparse breaks at hyphens)
    with pytest.raises(SystemExit):
        export.parse_opt(["--help"])
    out = capsys.readouterr().out
    flags = [w.split()[0].rstrip(",") for w in out.splitlines() if w.startswith("  --")]
    assert flags == ["--weights", "--include", "--imgsz", "--batch-size", "--device", "--half", "--dynamic",
                     "--simplify", "--opset", "--int8", "--data", "--calib-images", "--modules"]
    text = " ".join(out.split())
    for said in ("--include INCLUDE [INCLUDE ...] formats: onnx, torchscript, openvino, engine (default: torchscript "
                 "onnx) --imgsz",
                 "--batch-size BATCH_SIZE, --batch BATCH_SIZE example input batch; with --no-dynamic the largest batch "
                 "the file takes (default: 1) --device", "--dynamic, --no-dynamic any batch and image size",
                 "only the example input's (default: fixed for openvino, which runs a fixed input fastest; any for "
                 "the other formats) --simplify", "--opset OPSET ONNX opset version; the "
                 "versions this torch exports are checked before exporting (default: 17) --int8"):
        assert said in text
