"""Dataset downloads deliver data, nothing else: archives served by a local http.server (127.0.0.1, started and
stopped with each test) that try to drop a `.pth` into a site-packages-like folder, ship device nodes, setuid files,
links or code, or are no archive at all. A download that fails (a closed port, an HTTP error, a body cut short) is
one user error naming the URL and the reason, wherever the URL came from."""

import functools
import http.server
import io
import os
import re
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import zipfile

import pytest
import yaml

from data import downloads
from data.dataset_yaml import DatasetError, check_det_dataset
from data.downloads import DownloadFailed, fetch
from data.streams import open_source
from models.checkpoints import attempt_load, model_to_ckpt, releases, save_checkpoint
from models.yolo import DetectionModel
from utils.errors import UserError
from utils.files import ROOT

PTH = b"import os; open('PWNED', 'w').close()\n"


def _serve(handler):
    """(base URL, stop()) of an http.server on 127.0.0.1 answering with `handler`."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def stop():
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)

    return f"http://127.0.0.1:{httpd.server_address[1]}", stop


@pytest.fixture
def server(tmp_path):
    """(base URL, served folder, requested paths) of an http.server on 127.0.0.1 for this test only."""
    folder, requested = tmp_path / "served", []
    folder.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # quiet; record what was asked for instead
            requested.append(self.path)

    base, stop = _serve(functools.partial(Handler, directory=str(folder)))
    yield base, folder, requested
    stop()


@pytest.fixture
def closed_port_url():
    """An http URL of a port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def waits(monkeypatch):
    """The seconds waited between download attempts, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(downloads.time, "sleep", slept.append)
    return slept


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


def test_a_refused_source_download_is_one_user_error_naming_the_url(tmp_path, monkeypatch, closed_port_url, waits):
    monkeypatch.chdir(tmp_path)  # where a --source URL's file is downloaded to
    url = f"{closed_port_url}/a.jpg"
    with pytest.raises(DownloadFailed, match=rf"^download of {url} failed after 3 attempts: .*Connection refused$"):
        open_source(url)
    assert isinstance(DownloadFailed("x"), UserError) and waits == [2, 4] and not list(tmp_path.iterdir())


def test_official_weights_that_cannot_be_fetched_are_one_user_error(tmp_path, monkeypatch, server, waits):
    base, _, requested = server  # the served folder is empty: the release asset answers 404
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(releases, "RELEASES", ((r"yolov8[nsmlx]\.pt", f"{base}/release/"),))
    with pytest.raises(DownloadFailed, match=rf"^download of {base}/release/yolov8s\.pt failed after 3 attempts: "
                                             r"HTTP Error 404: File not found$"):
        attempt_load("yolov8s.pt")
    assert set(requested) == {"/release/yolov8s.pt"} and not (tmp_path / "yolov8s.pt").exists()


def test_a_dataset_archive_that_cannot_be_fetched_names_the_yaml_and_url(tmp_path, server, waits):
    base, _, _ = server
    f, site = _yaml(tmp_path, f"{base}/gone.zip")
    with pytest.raises(DatasetError, match=rf"^{f}: download of {base}/gone\.zip failed after 3 attempts: HTTP Error"
                                           " 404"):
        check_det_dataset(str(f))
    assert not list(site.glob("*.zip"))


def test_a_body_cut_short_is_retried_and_never_published(tmp_path, waits):
    class Short(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # promises 100 bytes, sends 10 and closes
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.close_connection = True

        def log_message(self, *args):
            pass

    base, stop = _serve(Short)
    try:
        with pytest.raises(DownloadFailed, match=r"failed after 2 attempts: the connection closed with 90 bytes"):
            fetch(f"{base}/w.pt", tmp_path / "w.pt", retries=2)
    finally:
        stop()
    assert waits == [2] and not list(tmp_path.iterdir())


def test_a_malformed_url_is_one_user_error(tmp_path, waits):
    with pytest.raises(DownloadFailed, match=r"^download of http://127\.0\.0\.1:abc/a\.jpg failed after 1 attempts: "
                                             r"nonnumeric port: 'abc'$"):
        fetch("http://127.0.0.1:abc/a.jpg", tmp_path / "a.jpg", retries=1)
    assert not waits and not list(tmp_path.iterdir())


# ------------------------------------------------------------------ what a download may cost (docs/safety.md)
def _sparse_tar():
    """255 bytes of tar.gz: an image and a label file of 1 GiB apparent size that is all hole (GNU sparse 1.0)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
        t.addfile(_info("ds/images/a.jpg", size=3), io.BytesIO(b"\xff\xd8\xff"))
        sparse_map = b"0\n".ljust(512, b"\0")  # no data blocks: the whole file is a hole
        info = _info("ds/labels/GNUSparseFile.0/a.txt", size=len(sparse_map))
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "ds/labels/a.txt",
                            "GNU.sparse.realsize": str(1 << 30)}
        t.addfile(info, io.BytesIO(sparse_map))
    return buf.getvalue()


def _zeros_archive(mode, n):
    """A tar (`mode` 'w:bz2', 'w:gz') or zip (mode 'zip') holding one label file of `n` zero bytes."""
    buf = io.BytesIO()
    if mode == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z, z.open("ds/labels/a.txt", "w") as f:
            for _ in range(n >> 20):
                f.write(bytes(1 << 20))
        return buf.getvalue()

    class Zeros(io.RawIOBase):
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = bytes(len(b))
            return len(b)

    with tarfile.open(fileobj=buf, mode=mode) as t:
        info = tarfile.TarInfo("ds/labels/a.txt")
        info.size = n
        t.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return buf.getvalue()


def _nothing_left(tmp_path, site):
    """Nothing of a refused download: no dataset, no archive, no temporary file or folder."""
    left = [p for p in tmp_path.rglob("*") if p.is_file() and "served" not in p.parts and p.suffix != ".yaml"]
    return not left and not (site / "ds").exists()


@pytest.mark.parametrize("kind", ["sparse label file", "tar.bz2 of 128 MiB of zeros", "zip of 128 MiB of zeros"])
def test_archives_that_unpack_beyond_their_budget_are_refused_before_writing(tmp_path, server, kind):
    """The sparse tar passes every member check; the bombs are under 200 KB. Unpacked, they would write 1 GiB or
    128 MiB (more than 100x their size and the 64 MiB floor); refused with nothing written or left."""
    base, folder, _ = server
    name, make, words = {
        "sparse label file": ("ds.tar.gz", _sparse_tar, "a sparse file"),
        "tar.bz2 of 128 MiB of zeros": ("ds.tar.bz2", lambda: _zeros_archive("w:bz2", 128 << 20), "it may unpack to"),
        "zip of 128 MiB of zeros": ("ds.zip", lambda: _zeros_archive("zip", 128 << 20), "the 67108864 it may take"),
    }[kind]
    data = make()
    assert len(data) < 200_000
    (folder / name).write_bytes(data)
    f, site = _yaml(tmp_path, f"{base}/{name}")
    with pytest.raises(DatasetError, match=rf"{re.escape(name)}: refusing to unpack.*{words}"):
        check_det_dataset(str(f))
    assert _nothing_left(tmp_path, site)


def test_a_download_that_is_no_archive_is_refused_at_its_first_bytes(tmp_path, waits):
    """A server sending 1 GiB of text for `ds.zip`: refused after its first 512 bytes, before the rest is fetched
    (it sends a few megabytes at most, what the sockets buffer) and nothing is kept."""
    sent = []

    class Gigabyte(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            try:
                for _ in range(1 << 14):
                    self.wfile.write(b"x" * (1 << 16))
                    sent.append(1 << 16)
            except OSError:  # the client closed the connection
                pass

        def log_message(self, *args):
            pass

    base, stop = _serve(Gigabyte)
    try:
        f, site = _yaml(tmp_path, f"{base}/ds.zip")
        with pytest.raises(DatasetError, match=r"ds\.zip: not a zip or tar archive by its first bytes"):
            check_det_dataset(str(f))
    finally:
        stop()
    assert sum(sent) < 32 << 20 and _nothing_left(tmp_path, site) and not waits  # not retried either


def test_an_archive_within_its_budget_unpacks(tmp_path, server):
    """The same kinds, honest: a tar.bz2 and a zip of labels ten times their size unpack whole."""
    base, folder, _ = server
    lines = "".join(f"0 0.{i % 9 + 1} 0.5 0.1 0.1\n" for i in range(20000)).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as t:
        t.addfile(_info("ds/labels/a.txt", size=len(lines)), io.BytesIO(lines))
        t.addfile(_info("ds/images/a.jpg", size=3), io.BytesIO(b"\xff\xd8\xff"))
    (folder / "ds.tar.bz2").write_bytes(buf.getvalue())
    f, site = _yaml(tmp_path, f"{base}/ds.tar.bz2")
    check_det_dataset(str(f))
    assert (site / "ds" / "labels" / "a.txt").read_bytes() == lines and len(buf.getvalue()) * 5 < len(lines)
