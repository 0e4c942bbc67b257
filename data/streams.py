"""Live prediction inputs: webcams, rtsp/rtmp/http streams and `.streams` list files, each read by its own thread;
and `open_source`, which picks the loader for a --source (image/video URLs are downloaded once, then read as files).
"""

import os
import stat
import threading
import time
import urllib.parse
from pathlib import Path

import cv2

from data.augment import chw_rgb, letterbox
from data.downloads import fetch
from data.image_files import IMG_FORMATS, MISSING, VID_FORMATS, entry_problem, suffix
from data.sources import LoadImages, SourceNotFound
from utils.budget import MAX_IMAGE_PIXELS, MAX_STREAM_PIXELS, MAX_STREAMS, MAX_STREAMS_FILE_BYTES
from utils.errors import BadFile
from utils.imageio import check_pixels, printable
from utils.log import LOGGER

STREAM_SCHEMES = ("rtsp://", "rtmp://", "http://", "https://")


def _is_url(s):
    return s.lower().startswith(STREAM_SCHEMES)


def _url_file(url):
    """The media file a URL names (image or video suffix), or None for a stream."""
    path = urllib.parse.urlparse(url).path
    return Path(path).name if suffix(path) in IMG_FORMATS | VID_FORMATS else None


def open_source(source, imgsz=640, stride=32, auto=True, transforms=None, vid_stride=1):
    """LoadStreams for a webcam index ('0'), a stream URL or a .streams file; LoadImages for everything else.

    A URL of an image or video file is downloaded into the working directory once (kept for the next run) and then
    read as a file, so every frame is processed; streams are read live and may skip frames to stay current.
    """
    s = str(source)
    kwargs = {"imgsz": imgsz, "stride": stride, "auto": auto, "transforms": transforms, "vid_stride": vid_stride}
    if s.endswith(".streams"):
        return LoadStreams(streams_file(s), **kwargs)
    if s.isnumeric() or (_is_url(s) and _url_file(s) is None):
        return LoadStreams([s], **kwargs)
    if _is_url(s):
        name = _url_file(s)
        if not Path(name).is_file():
            LOGGER.info(f"Downloading {s} to {name}...")
            fetch(s, Path(name))
        s = name
    try:
        return LoadImages(s, **kwargs)
    except SourceNotFound as e:
        raise SourceNotFound(f"--source {s}: {e}") from None


def streams_file(path):
    """The sources a .streams file lists, one a line (`#` starts a comment), each once: at most MAX_STREAMS, read from
    a regular file of at most MAX_STREAMS_FILE_BYTES (docs/safety.md); BadFile (naming --source) otherwise."""
    why = entry_problem(path)
    if why:
        raise BadFile(f"--source {printable(path)}: {'file not found' if why == MISSING else f'it {why}'}")
    size = os.stat(path).st_size
    if size > MAX_STREAMS_FILE_BYTES:
        raise BadFile(f"--source {printable(path)}: a .streams file of {size} bytes, more than the "
                      f"{MAX_STREAMS_FILE_BYTES} that {MAX_STREAMS} sources take (docs/safety.md)")
    lines = [x.strip() for x in Path(path).read_text(errors="surrogateescape").splitlines()]
    lines = [x for x in lines if x and not x.startswith("#")]
    sources = list(dict.fromkeys(lines))
    if not sources:
        raise BadFile(f"--source {printable(path)}: lists no streams")
    if len(sources) > MAX_STREAMS:
        raise BadFile(f"--source {printable(path)}: lists {len(sources)} streams, more than the {MAX_STREAMS} read at "
                      "once (docs/safety.md)")
    if len(sources) < len(lines):
        LOGGER.info(f"{printable(path)}: {len(lines) - len(sources)} repeated lines, each source read once")
    for s in sources:  # FFmpeg's open of a FIFO waits for a writer for ever: a local source is a file or a webcam
        if "\0" in s:  # OpenCV would open the name up to it, which no check here saw
            raise BadFile(f"--source {printable(path)}: its source {printable(s)} holds a NUL byte")
        if not (s.isnumeric() or _is_url(s)) and os.path.lexists(s) and not _file_or_camera(s):
            raise BadFile(f"--source {printable(path)}: its source {printable(s)} {entry_problem(s) or 'is no file'}; "
                          "a stream is a URL, a webcam index or device, or a video file")
    return sources


def _file_or_camera(path):
    """Whether `path` is a regular file or a character device (/dev/video0), which a capture opens and reads."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISCHR(mode)


class LoadStreams:
    """Frames of several live sources, each read by a background thread so inference never waits on the network.

    A reader keeps only the newest unprocessed frame of its source (every vid_stride-th frame is decoded): when
    inference is slower than the stream, older frames are skipped, as a live view should. Iteration yields
    (source, im, im0, description) like LoadImages, from whichever source has a new frame, in turn. A source that
    ends or errors is reported with a warning and the others go on; one silent for `timeout` seconds is given up.
    Iteration stops when no source is left.
    """

    mode = "stream"
    cap = None  # no container to ask for a frame rate: saved stream videos use 30 fps

    def __init__(self, sources, imgsz=640, stride=32, auto=True, transforms=None, vid_stride=1, timeout=10.0):
        self.sources = [str(s) for s in sources]
        self.imgsz, self.stride, self.auto, self.transforms = imgsz, stride, auto, transforms
        self.vid_stride, self.timeout = max(int(vid_stride), 1), timeout
        n = len(self.sources)
        self.cond = threading.Condition()
        self.pending = [None] * n  # (frame number, BGR image) not yet handed out, per source
        self.alive, self.reported = [True] * n, [False] * n
        self.read, self.skipped = [0] * n, [0] * n  # frames decoded and frames replaced before inference took them
        self.last = [time.monotonic()] * n
        self.next_source, self.frame = 0, 0
        # each source is opened in its own thread, all at once: a slow one does not hold back the others; none reads
        # a frame before every one has opened and the sources are accepted together (`go`): a refusal (one that
        # cannot open, the sources' pixels past MAX_STREAM_PIXELS) comes before any frame is read
        self.opened = [threading.Event() for _ in range(n)]
        self.go = threading.Event()
        self.pixels, self.refused = 0, False
        self.info = [None] * n  # (width, height, fps), read by the reader thread: a capture is not thread-safe
        self.threads = [threading.Thread(target=self._reader, args=(i,), daemon=True, name=f"stream-{i}")
                        for i in range(n)]
        for t in self.threads:
            t.start()
        try:
            self._check_opened()
        except BaseException:  # a refusal, or an interrupt while opening
            self.refused = True  # each reader closes its capture unread: one still in OpenCV's code when the
            self.go.set()  # interpreter ends aborts the process ("terminate called")
            for t in self.threads:
                t.join(self.timeout + 1)
            raise
        # a source's silence counts from here, when its reader may start: the opening took up to the slowest
        # source's time, which the first frame wait must not be charged with
        self.last = [time.monotonic()] * n
        self.go.set()
        for i, s in enumerate(self.sources):
            w, h, fps = self.info[i]
            LOGGER.info(f"stream {i + 1}/{n}: {s} {w}x{h} at {fps:.0f} fps")

    def _check_opened(self):
        """BadFile naming the first source that cannot be opened or whose frames are over the pixel limit, else the
        sources whose frames hold more than MAX_STREAM_PIXELS together (docs/safety.md)."""
        for event in self.opened:
            event.wait()
        for i, s in enumerate(self.sources):
            if self.info[i] is None:
                raise BadFile(f"--source {s}: cannot open the stream")
            check_pixels(*self.info[i][:2], f"--source {s}: its frames are ")
        if self.pixels > MAX_STREAM_PIXELS:
            sizes = [f"{w}x{h}" for w, h, _ in self.info]
            raise BadFile(f"--source: {len(self.sources)} streams ({', '.join(sizes[:4])}"
                          f"{', ...' if len(sizes) > 4 else ''}) whose frames hold {self.pixels} pixels together, "
                          f"more than the {MAX_STREAM_PIXELS} read at once (docs/safety.md); give fewer")

    def __len__(self):
        return len(self.sources)

    def _open(self, i):
        s = self.sources[i]
        ms = int(self.timeout * 1000)  # FFmpeg backends give up on a silent source instead of blocking for 30 s
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, ms]
        cap = cv2.VideoCapture(int(s) if s.isnumeric() else s, cv2.CAP_ANY, params)
        if not cap.isOpened():
            return None
        self.info[i] = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                        cap.get(cv2.CAP_PROP_FPS))
        with self.cond:
            self.pixels += self.info[i][0] * self.info[i][1]
            if self.pixels > MAX_STREAM_PIXELS:  # refused: the sources opened already close unread
                self.refused = True
        if self.refused or self.info[i][0] * self.info[i][1] > MAX_IMAGE_PIXELS:  # the constructor names the sizes
            cap.release()
            return None
        return cap

    def _reader(self, i):
        """Open the source; once all are accepted, grab every frame (so the decoder keeps up with it) and decode
        every vid_stride-th."""
        try:
            cap = self._open(i)
        finally:
            self.opened[i].set()
        if cap is not None:
            self.go.wait()
            if self.refused:
                cap.release()
                cap = None
        if cap is None:
            with self.cond:
                self.alive[i], self.reported[i] = False, True  # the constructor reports it
            return
        with self.cond:
            self.last[i] = time.monotonic()
        n, error = 0, None
        try:
            while not self.refused and cap.grab():
                n += 1
                if (n - 1) % self.vid_stride:
                    continue
                ok, im = cap.retrieve()
                if not ok:
                    break
                if im.shape[0] * im.shape[1] > (self.info[i][0] * self.info[i][1] or MAX_IMAGE_PIXELS):  # grown
                    LOGGER.warning(f"WARNING: stream {self.sources[i]}: a frame of {im.shape[1]}x{im.shape[0]}, larger "
                                   f"than the {self.info[i][0]}x{self.info[i][1]} it opened with; stopped")
                    break
                with self.cond:
                    self.skipped[i] += self.pending[i] is not None
                    self.pending[i] = (n, im)
                    self.read[i] += 1
                    self.last[i] = time.monotonic()
                    self.cond.notify_all()
        except cv2.error as e:
            error = e
        finally:
            cap.release()
            with self.cond:
                self.alive[i] = False
                self.cond.notify_all()
        if error is not None:
            LOGGER.warning(f"stream {self.sources[i]}: read error ({error})")

    def _report_ended(self):
        for i, s in enumerate(self.sources):
            if not self.alive[i] and self.pending[i] is None and not self.reported[i]:
                self.reported[i] = True
                LOGGER.warning(f"WARNING: stream {s} ended or was lost after {self.read[i]} frames "
                               f"({self.skipped[i]} skipped to keep up); {sum(self.alive)} stream(s) left")

    def _take(self):
        """(source index, frame number, image) of the next new frame, waiting for one; None when all are gone."""
        with self.cond:
            while True:
                self._report_ended()
                n = len(self.sources)
                order = [(self.next_source + k) % n for k in range(n)]
                ready = [i for i in order if self.pending[i] is not None]
                if ready:
                    i = ready[0]
                    (frame, im), self.pending[i] = self.pending[i], None
                    self.next_source = (i + 1) % n
                    return i, frame, im
                now = time.monotonic()
                for i in range(n):
                    if self.alive[i] and now - self.last[i] > self.timeout:
                        self.alive[i] = False  # its thread may stay blocked in the network read: it is a daemon
                        LOGGER.warning(f"WARNING: stream {self.sources[i]} sent nothing for {self.timeout:.0f}s")
                if not any(self.alive):
                    self._report_ended()
                    return None
                self.cond.wait(timeout=min(1.0, self.timeout))

    def __iter__(self):
        return self

    def __next__(self):
        item = self._take()
        if item is None:
            raise StopIteration
        i, self.frame, im0 = item
        if self.transforms is not None:
            im = self.transforms(im0)
        else:
            im = letterbox(im0, self.imgsz, stride=self.stride, auto=self.auto)[0]
            im = chw_rgb(im)
        desc = f"stream {i + 1}/{len(self.sources)} {self.sources[i]} (frame {self.frame}): "
        return self.sources[i], im, im0, desc
