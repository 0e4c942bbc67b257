import cv2
import numpy as np
import pytest

from data.sources import LoadImages


def _images(shapes_det):
    return sorted((shapes_det / "images" / "val").glob("*.jpg"))


def _check_item(item, stride=32):
    path, im, im0, s = item
    assert im.dtype == np.uint8 and im.shape[0] == 3 and im.flags["C_CONTIGUOUS"]
    assert im.shape[1] % stride == 0 and im.shape[2] % stride == 0 and max(im.shape[1:]) == 96
    assert im0.ndim == 3 and im0.shape[2] == 3 and path in s
    return path


def test_file_folder_glob_and_list(shapes_det, tmp_path):
    files = _images(shapes_det)
    one = list(LoadImages(str(files[0]), imgsz=96))
    assert len(one) == 1 and _check_item(one[0]) == str(files[0])
    path, im, im0, s = one[0]
    assert s.startswith("image 1/1 ")
    np.testing.assert_array_equal(im0, cv2.imread(str(files[0])))
    h0, w0 = im0.shape[:2]
    r = 96 / max(h0, w0)  # the letterboxed content is the image scaled to the long side, RGB
    content = cv2.resize(im0, (round(w0 * r), round(h0 * r)))[..., ::-1].transpose(2, 0, 1)
    top, left = (im.shape[1] - content.shape[1]) // 2, (im.shape[2] - content.shape[2]) // 2
    crop = im[:, top : top + content.shape[1], left : left + content.shape[2]]
    assert np.abs(crop.astype(int) - content).mean() < 2

    folder = LoadImages(str(files[0].parent), imgsz=96)
    assert len(folder) == 4 and [_check_item(x) for x in folder] == [str(f) for f in files]
    assert len(list(LoadImages(str(files[0].parent / "0000[01].jpg"), imgsz=96))) == 2
    lst = tmp_path / "list.txt"
    lst.write_text(f"{files[1]}\n{files[2]}\n")
    assert [x[0] for x in LoadImages(str(lst), imgsz=96)] == [str(files[1]), str(files[2])]
    assert len(list(LoadImages([str(files[0]), str(files[3])], imgsz=96))) == 2


def test_video_frames(tmp_path, shapes_det):
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 10, (80, 64))
    for k in range(5):
        frame = np.full((64, 80, 3), 40 * k, np.uint8)
        writer.write(frame)
    writer.release()
    src = LoadImages([str(video), str(_images(shapes_det)[0])], imgsz=96)
    items = []
    for path, im, im0, s in src:
        items.append((path, src.mode, src.frame, s, im0))
        assert im.shape[1] % 32 == 0 and im.shape[2] % 32 == 0
    video_items = [x for x in items if x[1] == "video"]
    assert len(video_items) == 5 and src.frames == 5
    assert [x[2] for x in video_items] == [1, 2, 3, 4, 5]
    assert video_items[2][3].startswith("video 1/2 (3/5) ")
    assert [round(float(x[4].mean()) / 40) for x in video_items] == [0, 1, 2, 3, 4]
    assert items[-1][1] == "image" and len(items) == 6


def test_transforms_and_missing_source(shapes_det, tmp_path):
    files = _images(shapes_det)
    out = next(iter(LoadImages(str(files[0]), transforms=lambda im0: im0.shape)))
    assert out[1] == cv2.imread(str(files[0])).shape
    with pytest.raises(FileNotFoundError, match="no-such-file.jpg"):
        LoadImages(str(tmp_path / "no-such-file.jpg"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        LoadImages(str(tmp_path / "empty"))
    (tmp_path / "data.yaml").write_text("path: x\n")  # a dataset YAML given as --source said "no files found in" it
    with pytest.raises(FileNotFoundError, match=r"data\.yaml is not an image, a video, a \.txt list or a \.streams"):
        LoadImages(str(tmp_path / "data.yaml"))


def test_a_folder_is_read_itself_not_its_sub_folders(shapes_det, tmp_path, caplog):
    """detect.py --source DIR --project DIR/runs, run twice: the second run must not read the first run's output."""
    import logging
    import shutil

    from utils.log import LOGGER

    files = _images(shapes_det)
    folder = tmp_path / "photos"
    (folder / "runs" / "exp").mkdir(parents=True)
    for f in files[:2]:
        shutil.copy(f, folder / f.name)
    shutil.copy(files[2], folder / "runs" / "exp" / files[2].name)  # a drawn result of an earlier run
    caplog.set_level(logging.INFO, logger=LOGGER.name)
    LOGGER.addHandler(caplog.handler)  # the project's logger does not propagate to the root logger
    try:
        got = [x[0] for x in LoadImages(str(folder), imgsz=96)]
    finally:
        LOGGER.removeHandler(caplog.handler)
    assert got == [str(folder / f.name) for f in files[:2]]
    assert f"1 sub-folder(s) not read (runs); --source '{folder}/**/*' reads them too" in caplog.text
    assert len(list(LoadImages(str(folder / "**" / "*"), imgsz=96))) == 3  # the glob the note gives recurses
    with pytest.raises(FileNotFoundError, match=r"its 1 sub-folder\(s\) are not read: --source '.*runs/\*\*/\*'"):
        LoadImages(str(folder / "runs"))
