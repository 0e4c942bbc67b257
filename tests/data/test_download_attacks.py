"""Dataset downloads deliver data, nothing else: archives served by a local http.server (127.0.0.1, started and
stopped with each test) that try to drop a `.pth` into a site-packages-like folder, ship device nodes, setuid files,
links or code, or are no archive at all."""

import functools
import http.server
import io
import os
import stat
import subprocess
import sys
import tarfile
import threading
import zipfile

import pytest
import yaml

from models.checkpoints import model_to_ckpt, save_checkpoint
from models.yolo import DetectionModel
from utils.data.dataset_yaml import DatasetError, check_det_dataset
from utils.files import ROOT

PTH = b"import os; open('PWNED', 'w').close()\n"


@pytest.fixture
def server(tmp_path):
    """(base URL, served folder, requested paths) of an http.server on 127.0.0.1 for this test only."""
    folder, requested = tmp_path / "served", []
    folder.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # quiet; record what was asked for instead
            requested.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", folder, requested
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


def _yaml(tmp_path, download, name="ds"):
    """A dataset YAML whose absolute `path` lies in a site-packages-like folder (its parent would run a `.pth`)."""
    site = tmp_path / "site-packages"
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"path": str(site / name), "train": "images", "val": "images", "names": ["a"],
                                 "download": download}))
    return f, site


def _tar(members):
    """tar.gz bytes of (TarInfo, bytes or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for info, data in members:
            info.size = len(data) if data is not None else 0
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name, **kw):
    info = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def _zip(members):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def _planted(site):
    return [p.name for p in site.rglob("*") if p.suffix in (".pth", ".py", ".so", ".pyc")] if site.exists() else []


def test_a_bare_non_archive_url_is_refused_before_fetching(tmp_path, server):
    base, folder, requested = server
    (folder / "evil.pth").write_bytes(PTH)
    f, site = _yaml(tmp_path, f"{base}/evil.pth")
    with pytest.raises(DatasetError, match=r"does not name a zip or tar archive"):
        check_det_dataset(str(f))
    assert not requested and not _planted(site)


def test_a_pth_named_like_an_archive_is_refused_and_deleted(tmp_path, server):
    base, folder, _ = server
    (folder / "data.zip").write_bytes(PTH)
    f, site = _yaml(tmp_path, f"{base}/data.zip")
    with pytest.raises(DatasetError, match=r"data\.zip: not a zip or tar archive"):
        check_det_dataset(str(f))
    assert not _planted(site) and not list(site.glob("*.zip"))


@pytest.mark.parametrize("kind", ["device node", "setuid file", "symlink", "hard link", "fifo", "escape"])
def test_tar_members_no_dataset_needs_refuse_the_archive(tmp_path, server, kind):
    base, folder, _ = server
    image = (_info("ds/images/a.jpg"), b"\xff\xd8\xff")
    bad = {
        "device node": (_info("ds/images/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3), None),
        "setuid file": (_info("ds/images/b.jpg", mode=0o4755), b"\xff\xd8\xff"),
        "symlink": (_info("ds/images/c.jpg", type=tarfile.SYMTYPE, linkname="/etc/passwd"), None),
        "hard link": (_info("ds/images/d.jpg", type=tarfile.LNKTYPE, linkname="ds/images/a.jpg"), None),
        "fifo": (_info("ds/images/pipe", type=tarfile.FIFOTYPE), None),
        "escape": (_info("../../escaped.txt"), b"x"),
    }[kind]
    (folder / "ds.tar.gz").write_bytes(_tar([image, bad]))
    f, site = _yaml(tmp_path, f"{base}/ds.tar.gz")
    with pytest.raises(DatasetError, match=r"ds\.tar\.gz: refusing to unpack"):
        check_det_dataset(str(f))
    assert not (site / "ds").exists() and not list(tmp_path.rglob("escaped.txt")) and not list(site.glob("*.tar.gz"))


def test_only_data_files_inside_the_root_are_unpacked(tmp_path, server):
    base, folder, _ = server
    (folder / "ds.zip").write_bytes(_zip([
        ("ds/images/a.jpg", b"\xff\xd8\xff"), ("ds/labels/a.txt", "0 0.5 0.5 0.2 0.2\n"),
        ("ds/meta.json", "{}"), ("evil.pth", PTH), ("ds/hook.py", "print(1)\n"), ("ds/lib.so", b"\x7fELF"),
        ("ds/__pycache__/x.cpython-311.pyc", b"\0"), ("other/stolen.txt", "outside the root"),
    ]))
    f, site = _yaml(tmp_path, f"{base}/ds.zip")
    check_det_dataset(str(f))
    found = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert found == ["ds/images/a.jpg", "ds/labels/a.txt", "ds/meta.json"], found
    assert all(not os.stat(site / p).st_mode & (stat.S_IXUSR | stat.S_ISUID) for p in found)


def test_a_declared_dir_receives_its_archive(tmp_path, server):
    base, folder, _ = server
    (folder / "img.zip").write_bytes(_zip([("train/a.jpg", b"\xff\xd8\xff"), ("x.py", "print(1)")]))
    (folder / "ds.zip").write_bytes(_zip([("ds/labels/a.txt", "0 0.5 0.5 0.2 0.2\n")]))
    f, site = _yaml(tmp_path, [f"{base}/ds.zip", {"urls": f"{base}/img.zip", "dir": "ds/images"}])
    check_det_dataset(str(f))
    assert (site / "ds" / "images" / "train" / "a.jpg").is_file() and not _planted(site)


def test_scripts_exit_2_with_one_line(tmp_path, server):
    """Whole processes: train.py and val.py meet a device-node tar and a `.pth` URL; exit 2, one line, nothing
    planted."""
    base, folder, _ = server
    (folder / "dev.tar.gz").write_bytes(_tar([(_info("ds/images/null", type=tarfile.CHRTYPE, devmajor=1,
                                                     devminor=3), None)]))
    (folder / "evil.pth").write_bytes(PTH)
    dev, site = _yaml(tmp_path, f"{base}/dev.tar.gz", "dev")
    pth, _ = _yaml(tmp_path, f"{base}/evil.pth", "pth")
    weights = tmp_path / "w.pt"
    save_checkpoint({"model": model_to_ckpt(DetectionModel("yolov5n.yaml", nc=1)), "ema": None}, weights)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["--img", "64", "--device", "cpu", "--workers", "0", "--project", str(tmp_path / "runs")]
    runs = [[str(ROOT / "train.py"), "--data", str(dev), "--epochs", "1", *common],
            [str(ROOT / "val.py"), "--data", str(pth), "--weights", str(weights), *common]]
    procs = [subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=env) for argv in runs]
    for p, argv in zip(procs, runs):
        out, err = p.communicate(timeout=240)
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert p.returncode == 2 and "Traceback" not in out + err, (argv[0], err[-2000:])
        assert len(errors) == 1 and ("refusing to unpack" in errors[0] or "zip or tar" in errors[0]), errors
    assert not _planted(site) and not (site / "dev").exists()
