import shutil
from pathlib import Path

import pytest
import yaml

from data import dataset_yaml as dy
from data.dataset_yaml import (
    DatasetError,
    DatasetNotFoundError,
    check_cls_dataset,
    check_det_dataset,
)
from utils.errors import BadDataset
from utils.files import ROOT


def _write(path, data):
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return path


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_synthetic_dataset_generated_when_missing(tmp_path, yolo_log):
    spec = {"task": "segment", "n_train": 3, "n_val": 2, "seed": 1, "min_side": 64, "max_side": 80}
    f = _write(tmp_path / "toy.yaml", {"path": str(tmp_path / "toy"), "train": "images/train", "val": "images/val",
                                       "names": ["circle", "rectangle", "triangle"], "synthetic": spec})
    d = check_det_dataset(f)
    assert d["nc"] == 3 and d["names"] == {0: "circle", 1: "rectangle", 2: "triangle"}
    assert d["val"] == str(tmp_path / "toy" / "images" / "val") and Path(d["path"]) == tmp_path / "toy"
    assert len(list(Path(d["train"]).glob("*.jpg"))) == 3 and len(list(Path(d["val"]).glob("*.jpg"))) == 2
    assert any("generating synthetic segment" in m for m in yolo_log)
    stamp = (Path(d["val"]) / "00000.jpg").stat().st_mtime_ns
    assert check_det_dataset(str(f))["train"] == d["train"]
    assert (Path(d["val"]) / "00000.jpg").stat().st_mtime_ns == stamp  # not generated twice


def test_paths_names_and_lists(tmp_path, shapes_det, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(shapes_det, tmp_path / "ds")
    f = _write(tmp_path / "sub.yaml", {"path": "ds", "train": ["images/train", "images/val"], "val": "images/val",
                                       "test": "images/*", "names": {0: "a", 1: "b", 2: "c"}, "nc": 3})
    d = check_det_dataset(f)
    assert d["path"] == str(tmp_path / "ds")  # relative `path` found from the current directory
    assert d["train"] == [str(tmp_path / "ds/images/train"), str(tmp_path / "ds/images/val")]
    assert d["test"] == str(tmp_path / "ds/images/*") and d["yaml_file"] == str(f)
    no_path = _write(tmp_path / "ds" / "local.yaml", {"train": "images/train", "val": "images/val", "nc": 2})
    d2 = check_det_dataset(no_path)
    assert d2["path"] == str(tmp_path / "ds") and d2["names"] == {0: "class0", 1: "class1"}
    from_dict = check_det_dataset({"path": str(tmp_path / "ds"), "train": "images/train", "val": "images/val",
                                   "names": ["x"]})
    assert from_dict["val"] == str(tmp_path / "ds/images/val") and from_dict["yaml_file"] is None
    unlikely = "../datasets/unlikely-name-xyz"
    assert dy.dataset_root({"path": unlikely}) == (ROOT / unlikely).resolve()


def test_one_line_errors(tmp_path):
    broken = _write(tmp_path / "broken.yaml", "path: [unclosed\nnames: {0: a\n")
    with pytest.raises(DatasetError) as e:
        check_det_dataset(broken)
    assert str(broken) in _one_line(e) and "invalid YAML" in str(e.value)

    no_val = _write(tmp_path / "noval.yaml", {"train": "a", "names": ["x"]})
    with pytest.raises(DatasetError) as e:
        check_det_dataset(no_val)
    assert str(no_val) in _one_line(e) and "'val'" in str(e.value)

    bad_nc = _write(tmp_path / "nc.yaml", {"train": "a", "val": "b", "names": ["x", "y"], "nc": 3})
    with pytest.raises(DatasetError, match="nc=3 but 2 names"):
        check_det_dataset(bad_nc)

    missing = _write(tmp_path / "missing.yaml", {"path": str(tmp_path / "nothing"), "train": "t", "val": "v",
                                                 "names": ["x"]})
    with pytest.raises(DatasetNotFoundError) as e:
        check_det_dataset(missing)
    msg = _one_line(e)
    assert str(missing) in msg and str(tmp_path / "nothing" / "v") in msg and "no 'download'" in msg
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)

    with pytest.raises(DatasetNotFoundError) as e:
        check_det_dataset(tmp_path / "absent.yaml")
    assert "absent.yaml" in _one_line(e)


def test_a_dataset_path_naming_folders_is_never_swapped_for_the_repo_s_file_of_that_name(tmp_path, monkeypatch):
    """A bare name finds the repo's data/<name>[.yaml]; a relative path is also tried from the repo's root; a path
    naming folders that do not hold it is refused (it used to validate on the repo's coco128.yaml)."""
    from data.dataset_yaml import find_dataset_yaml
    from utils.files import ROOT

    monkeypatch.chdir(tmp_path)
    assert find_dataset_yaml("coco128") == find_dataset_yaml("coco128.yaml") == ROOT / "data" / "coco128.yaml"
    assert find_dataset_yaml("data/coco128.yaml") == ROOT / "data" / "coco128.yaml"
    for wrong in (tmp_path / "datasets" / "coco128.yaml", "datasets/coco128.yaml", "datasets/coco128"):
        with pytest.raises(DatasetNotFoundError) as e:
            find_dataset_yaml(wrong)
        assert _one_line(e).startswith(f"{wrong}: dataset YAML not found") and "data/coco128" not in _one_line(e)
    (tmp_path / "data").mkdir()
    local = _write(tmp_path / "data" / "coco128.yaml", {"train": "a", "val": "b", "names": ["x"]})
    assert find_dataset_yaml("data/coco128.yaml") == Path("data/coco128.yaml") and local.is_file()


def _record_downloads(monkeypatch):
    calls = []
    def record(urls, dir, threads=1, within=None):
        calls.append((urls, Path(dir), threads))

    monkeypatch.setattr(dy, "download", record)
    return calls


def test_download_entries(tmp_path, monkeypatch):
    calls = _record_downloads(monkeypatch)
    root = tmp_path / "datasets" / "coco128"
    url = _write(tmp_path / "url.yaml", {"path": str(root), "train": "images/train2017", "val": "images/train2017",
                                         "names": ["a"], "download": "https://example.com/coco128.zip"})
    with pytest.raises(DatasetNotFoundError, match="autodownload is off"):
        check_det_dataset(url, autodownload=False)
    assert not calls
    with pytest.raises(DatasetNotFoundError):  # the fake download fetched nothing
        check_det_dataset(url)
    assert calls == [(["https://example.com/coco128.zip"], tmp_path / "datasets", 1)]

    calls.clear()
    coco = yaml.safe_load((ROOT / "data" / "coco.yaml").read_text())
    assert len(coco["names"]) == 80 and coco["names"][79] == "toothbrush"
    coco["path"] = str(tmp_path / "coco")
    with pytest.raises(DatasetNotFoundError):
        check_det_dataset(_write(tmp_path / "coco.yaml", coco))
    images = [f"http://images.cocodataset.org/zips/{s}2017.zip" for s in ("train", "val", "test")]
    assert calls == [(["https://github.com/ultralytics/yolov5/releases/download/v1.0/coco2017labels.zip"], tmp_path, 1),
                     (images, tmp_path / "coco" / "images", 3)]


def test_declarative_download_calls(tmp_path, monkeypatch):
    calls = _record_downloads(monkeypatch)
    spec = ["https://a.example/one.zip", "http://a.example/two.tar.gz",
            {"urls": "https://b.example/img.zip", "dir": "ds/images", "threads": 2},
            {"urls": ["https://c.example/x.zip", "https://c.example/y.zip"], "dir": "./ds/../ds/extra"},
            {"urls": ["https://d.example/z.zip"]}, "https://a.example/three.zip"]
    f = _write(tmp_path / "decl.yaml", {"path": str(tmp_path / "datasets" / "ds"), "train": "t", "val": "v",
                                        "names": ["a"], "download": spec})
    with pytest.raises(DatasetNotFoundError):  # the recorder fetched nothing
        check_det_dataset(f)
    parent = tmp_path / "datasets"
    assert calls == [(["https://a.example/one.zip", "http://a.example/two.tar.gz"], parent, 1),
                     (["https://b.example/img.zip"], parent / "ds" / "images", 2),
                     (["https://c.example/x.zip", "https://c.example/y.zip"], parent / "ds" / "extra", 1),
                     (["https://d.example/z.zip"], parent, 1),
                     (["https://a.example/three.zip"], parent, 1)]


SCRIPT = "download: |\n  from pathlib import Path\n  Path(r'{marker}').write_text('ran')\n"
BASH = "download: bash -c 'touch {marker}'\n"


@pytest.mark.parametrize("kind", ["python", "bash", "python in a list", "bash in a mapping"])
def test_script_downloads_refused_and_not_run(tmp_path, monkeypatch, kind):
    calls = _record_downloads(monkeypatch)
    marker = tmp_path / "marker"
    head = f"path: {tmp_path / 'datasets' / 'ds'}\ntrain: t\nval: v\nnames: [a]\n"
    body = {"python": SCRIPT, "bash": BASH,
            "python in a list": "download:\n  - https://a.example/x.zip\n  - |\n    import os\n"
                                "    os.system('touch {marker}')\n",
            "bash in a mapping": "download:\n  - urls: bash -c 'touch {marker}'\n"}[kind]
    f = _write(tmp_path / "script.yaml", head + body.format(marker=marker))
    with pytest.raises(DatasetError) as e:
        check_det_dataset(f)
    assert not marker.exists() and not calls  # refused before anything ran or was fetched
    msg = _one_line(e)
    assert msg.startswith(f"{f}: 'download'") and "is a script; scripts in dataset YAMLs are not run" in msg, msg


@pytest.mark.parametrize("spec, words", [
    ([{"urls": "https://a.example/x.zip", "dir": "../elsewhere"}], ["'download'[0].dir", "leads outside"]),
    ([{"urls": "https://a.example/x.zip", "dir": "ds/../../up"}], ["'download'[0].dir", "leads outside"]),
    ([{"urls": "https://a.example/x.zip", "dir": "/etc/ds"}], ["'download'[0].dir", "must be relative"]),
    (["https://a.example/ok.zip", {"urls": "https://a.example/x.zip", "run": "rm -rf /"}], ["'download'[1]", "'run'"]),
    ([{"dir": "ds"}], ["'download'[0]", "needs 'urls'"]),
    ([{"urls": "https://a.example/x.zip", "threads": "many"}], ["threads must be an integer"]),
    ("ftp://a.example/x.zip", ["'download'", "not an http(s) URL"]),
    (["file:///etc/passwd"], ["'download'[0]", "not an http(s) URL"]),
    ({"urls": "https://a.example/x.zip"}, ["'download' must be an http(s) URL, or a list"]),
    ([{"urls": []}], ["'download'[0].urls is an empty list"]),
])
def test_malformed_download_refused_before_fetching(tmp_path, monkeypatch, spec, words):
    calls = _record_downloads(monkeypatch)
    f = _write(tmp_path / "bad.yaml", {"path": str(tmp_path / "datasets" / "ds"), "train": "t", "val": "v",
                                       "names": ["a"], "download": spec})
    with pytest.raises(DatasetError) as e:
        check_det_dataset(f)
    msg = _one_line(e)
    assert msg.startswith(f"{f}: ") and all(w in msg for w in words), msg
    assert not calls and not (tmp_path / "elsewhere").exists() and not (tmp_path / "datasets").exists()


def test_official_yamls_parse():
    for name, n in (("coco128", 80), ("coco128-seg", 80), ("shapes", 3), ("shapes-seg", 3), ("shapes-cls", 3)):
        d = yaml.safe_load((ROOT / "data" / f"{name}.yaml").read_text())
        assert len(d["names"]) == n and d["path"] == f"../datasets/{name}"
    assert dy.find_dataset_yaml("shapes-cls") == ROOT / "data" / "shapes-cls.yaml"
    assert dy.find_dataset_yaml("data/shapes").resolve() == (ROOT / "data" / "shapes.yaml").resolve()


def test_classification_dataset_checks(tmp_path, shapes_cls, monkeypatch):
    d = check_cls_dataset(shapes_cls)
    assert d["names"] == {0: "circle", 1: "rectangle", 2: "triangle"} and d["nc"] == 3 and d["test"] is None
    assert d["train"] == str(shapes_cls / "train") and d["val"] == str(shapes_cls / "val")

    monkeypatch.chdir(tmp_path)
    spec = {"task": "classify", "n_train": 2, "n_val": 1, "seed": 0, "min_side": 32, "max_side": 40}
    _write(tmp_path / "toy-cls.yaml", {"path": str(tmp_path / "toy-cls"), "train": "train", "val": "val",
                                       "synthetic": spec, "names": ["circle", "rectangle", "triangle"]})
    got = check_cls_dataset("toy-cls")  # not a folder: toy-cls.yaml is used and the data generated
    assert Path(got["path"]) == tmp_path / "toy-cls" and got["nc"] == 3
    assert len(list(Path(got["val"]).glob("*/*.jpg"))) == 3

    _write(tmp_path / "wrong.yaml", {"path": str(tmp_path / "toy-cls"), "train": "train", "val": "val",
                                     "names": ["a", "b", "c"]})
    with pytest.raises(DatasetError, match="are not in .names."):
        check_cls_dataset(tmp_path / "wrong.yaml")
    (tmp_path / "only-train" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError) as e:
        check_cls_dataset(tmp_path / "only-train")
    only = tmp_path / "only-train"
    assert _one_line(e).endswith(f"missing {only / 'test'} (the validation split is {only / 'val'}, else "
                                 f"{only / 'test'})"), "names the val/ folder it looked for first"
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        check_cls_dataset(tmp_path / "nowhere")


@pytest.mark.parametrize("body, error", [
    ("names: [a, null, c]\n", "the name of class 1 must be text, got NoneType None"),
    ("names: [a, '', c]\n", "the name of class 1 must be text, got str ''"),
    ("names: [a, [b], c]\n", "the name of class 1 must be text, got list ['b']"),
    ("names: {0: a, 1: b, '1': c}\n", "'names' keys must be distinct integer class ids, got [0, 1, '1']"),
    ("names: [a, b]\nnc: '2'\n", "'nc' must be a positive integer, got str '2'"),
    ("nc: true\n", "'nc' must be a positive integer, got bool True"),
    ("names: [a, b]\nnames: [c, d]\n", "line 5 invalid YAML (duplicate key 'names' (first on line 4))"),
])
def test_names_nc_and_duplicate_keys_are_refused_naming_them(shapes_det, tmp_path, body, error):
    f = _write(tmp_path / "d.yaml", f"path: {shapes_det}\ntrain: images/train\nval: images/val\n{body}")
    with pytest.raises(DatasetError) as e:
        check_det_dataset(f)
    assert _one_line(e) == f"{f}: {error}"


def test_every_yaml_refuses_duplicate_keys_and_non_utf8_bytes(tmp_path):
    from engine.hyp import read_hyp
    from models.yolo import yaml_model_load
    from utils.errors import BadModelYaml
    from utils.files import ConfigError

    model = tmp_path / "m.yaml"
    model.write_text((ROOT / "models" / "yolov5n.yaml").read_text() + "nc: 3\n")
    with pytest.raises(BadModelYaml, match=r"m.yaml: line \d+ invalid YAML \(duplicate key 'nc' \(first on line"):
        yaml_model_load(model)
    hyp = tmp_path / "h.yaml"
    hyp.write_text("lr0: 0.01\nlrf: 0.1\nlr0: 0.02\n")
    with pytest.raises(ConfigError, match=r"h.yaml: line 3 invalid YAML \(duplicate key 'lr0' \(first on line 1\)\)"):
        read_hyp(hyp)
    latin1 = tmp_path / "l.yaml"  # a class name saved as Latin-1: never turned into 'caf\ufffd'
    latin1.write_bytes(b"path: /x\ntrain: a\nval: b\nnames: [caf\xe9]\n")
    with pytest.raises(DatasetError) as e:
        check_det_dataset(latin1)
    assert _one_line(e) == f"{latin1}: not UTF-8 text (byte 0xe9 at offset 36)"


@pytest.mark.parametrize("body, error", [
    ("path: 7\ntrain: images/train\nval: images/val\n",
     "'path' must be a path, got int 7; quote a folder name that YAML reads as a number (path: '2017')"),
    ("path: ROOT\ntrain: {a: 1}\nval: images/val\n", "'train' must be a path or a list of paths, got dict {'a': 1}"),
    ("path: ROOT\ntrain: images/train\nval: [images/val, 010]\n", "'val' must be a path or a list of paths, got "
     "list ['images/val', 8]; quote a folder name that YAML reads as a number (val: '2017')"),
], ids=["path-number", "train-mapping", "val-list-number"])
def test_a_path_or_split_that_is_not_text_is_refused_naming_the_key(shapes_det, tmp_path, body, error):
    f = _write(tmp_path / "d.yaml", body.replace("ROOT", str(shapes_det)) + "names: [a, b, c]\n")
    with pytest.raises(DatasetError) as e:
        check_det_dataset(f)
    assert _one_line(e) == f"{f}: {error}"


def test_a_classification_split_is_one_folder_and_null_means_the_default(shapes_cls, tmp_path):
    f = _write(tmp_path / "c.yaml", {"path": str(shapes_cls), "train": ["train", "val"], "val": "val"})
    with pytest.raises(DatasetError) as e:
        check_cls_dataset(f)
    assert _one_line(e) == f"{f}: 'train' must be a path, got list ['train', 'val']"
    f = _write(tmp_path / "c.yaml", {"path": 7, "val": "val"})
    with pytest.raises(DatasetError, match=r"'path' must be a path, got int 7"):
        check_cls_dataset(f)
    f = _write(tmp_path / "c.yaml", {"path": str(shapes_cls), "train": None, "val": "val"})
    assert check_cls_dataset(f)["train"] == str(shapes_cls / "train")


def test_of_a_split_list_only_the_missing_entries_are_named(shapes_det, tmp_path):
    f = _write(tmp_path / "d.yaml", {"path": str(shapes_det), "train": ["images/train", "images/nope"],
                                     "val": ["images/val", "images/gone"], "names": ["a", "b", "c"]})
    with pytest.raises(DatasetNotFoundError) as e:
        check_det_dataset(f)
    assert _one_line(e) == (f"{f}: dataset not found, missing {shapes_det / 'images/gone'} (the YAML has no "
                            "'download' or 'synthetic' entry)")
    f = _write(tmp_path / "d.yaml", {"path": str(shapes_det), "train": ["images/train", "images/nope"],
                                     "val": "images/val", "names": ["a", "b", "c"]})
    with pytest.raises(DatasetNotFoundError) as e:
        check_det_dataset(f)
    assert _one_line(e) == f"{f}: dataset not found, missing {shapes_det / 'images/nope'}"


@pytest.mark.parametrize("check", [check_det_dataset, check_cls_dataset])
def test_an_empty_data_argument_is_one_error(check):
    with pytest.raises(DatasetError, match=r"^--data is empty: give a dataset YAML"):
        check("")


@pytest.mark.parametrize("data", [".", "/"])
def test_a_folder_without_a_name_is_looked_into_not_taken_for_a_yaml(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '.': a folder holding nothing
    with pytest.raises(BadDataset) as e:
        check_det_dataset(data)
    assert _one_line(e).startswith(f"{Path(data).resolve()} is a folder holding no dataset this project reads")


def test_a_relative_path_found_only_beside_the_yaml_is_read_from_there(tmp_path, monkeypatch, yolo_log):
    """CVAT's Ultralytics YOLO export: data.yaml says `path: ./` and lists train.txt, val.txt beside it; run from
    another folder, the dataset is the YAML's folder (from the current directory its splits do not exist). Where
    the current directory holds them, it stays the root."""
    export = tmp_path / "export"
    (export / "images" / "train").mkdir(parents=True)
    for split in ("train", "val"):
        (export / f"{split}.txt").write_text("images/train/x.jpg\n")
    data = _write(export / "data.yaml", "path: ./\ntrain: train.txt\nval: val.txt\nnames:\n  0: car\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    d = check_det_dataset(data)
    assert (d["path"], d["train"], d["val"]) == (str(export), str(export / "train.txt"), str(export / "val.txt"))
    assert any("path ./ is read from the YAML's folder" in m for m in yolo_log)
    for split in ("train", "val"):
        (elsewhere / f"{split}.txt").write_text("x.jpg\n")
    assert check_det_dataset(data)["train"] == str(elsewhere / "train.txt")


@pytest.mark.parametrize("name", ["roboflow-export.zip", "instances_val.json", "project-1.JSON"])
def test_an_export_archive_or_annotation_file_as_data_is_named(tmp_path, name):
    """What an annotation tool hands out, given as --data itself: one line saying what to give instead (it was read
    as YAML: 'not UTF-8 text', or 'missing required key(s)' of a COCO file)."""
    (tmp_path / name).write_bytes(b"PK\x03\x04\xa4" if name.endswith(".zip") else b'{"images": []}')
    with pytest.raises(DatasetError) as e:
        check_det_dataset(tmp_path / name)
    what = "an archive" if name.endswith(".zip") else "an annotation file"
    assert _one_line(e).endswith(f"is {what}, not a dataset YAML: give the folder of the dataset (unpacked), or its "
                                 "data.yaml, as --data")
