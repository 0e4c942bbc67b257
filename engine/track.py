"""--track: the predictors' detections of each frame handed to a tracker (engine/tracking), one tracker per video
or stream (a folder of videos starts each afresh; the images of a folder are one sequence, in name order), the ids
put on the image's record and drawn with each id's trail, and each tracked box written to the sequence's MOT text
file (`tracks/<stem>.txt`, the stem the predictor gives the video in its run, `tracks/images.txt` for images), on
the line of the video's own frame number (a stream's, or the count of the images).

A record then holds only the boxes a confirmed track holds (a tracker drops the others: low-confidence boxes no
track claims, a new object's first frame), in the same order as its `ids`. Each box is the track's, where its Kalman
filter puts it after the frame's detection (clipped to the image, as Ultralytics' results clip it), with the
detection's confidence and class; masks and keypoints are the detection's, as Ultralytics keeps them. The MOT file
holds the same boxes.

An oriented-box model's rows (xywh, conf, cls, angle) are tracked as oriented boxes (xywhr: engine/tracking/tracker.py);
the track's box comes back in the predictions' form (`utils.rotated.regularize`), not clipped (Ultralytics' OBB
results are not); the MOT file, which has no angle, holds each box's upright envelope (the bounding box of its
corners), and the id is drawn there.
"""

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import torch

from engine.tracking.config import load_tracker_config, make_tracker, tracker_file
from engine.tracking.mot import Trails, id_colour, mot_lines
from utils.imageio import printable
from utils.log import LOGGER
from utils.rotated import regularize, xywhr_to_corners


class FrameTracker:
    """`name`: --track's value (bytetrack, botsort or a tracker YAML); `save_dir`: where tracks/*.txt go (None: no
    file); `rotated`: the records' boxes are an oriented-box model's."""

    def __init__(self, name, save_dir=None, rotated=False):
        self.cfg = load_tracker_config(name)
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.rotated = rotated
        self.sources = {}  # source path -> (tracker, trails, MOT file)
        self.one_sequence = False  # every source's frames one sequence (the API's persist=True, across its calls)
        self.last = None  # the source of the last frame: where a sequence turned on goes on from
        LOGGER.info(f"--track {name}: {self.cfg.tracker_type} ({printable(tracker_file(name))})")

    def _state(self, path, fps, stem):
        if path not in self.sources:
            mot = None
            if self.save_dir is not None:
                stem = stem or ("images" if path is None else Path(str(path)).stem)
                mot = self.save_dir / "tracks" / f"{printable(stem) or 'source'}.txt"
                mot.parent.mkdir(parents=True, exist_ok=True)
                mot.write_text("")
            self.sources[path] = (make_tracker(self.cfg, frame_rate=fps or 30, rotated=self.rotated), Trails(), mot)
        return self.sources[path]

    def _boxes(self, rows):
        """What the tracker follows of NMS rows (numpy): xyxy, or an oriented box's xywhr."""
        return np.c_[rows[:, :4], rows[:, -1]] if self.rotated else rows[:, :4]

    def _upright(self, rows):
        """xyxy of NMS rows (numpy): an oriented box's upright envelope."""
        if not self.rotated:
            return rows[:, :4]
        corners = xywhr_to_corners(torch.from_numpy(self._boxes(rows)).double()).numpy()
        return np.c_[corners.min(1), corners.max(1)]

    def update(self, record, im0, path, fps=30, stem=None, frame=None):
        """(record of the tracked boxes, their ids as an int64 array) for one frame of the video `path` (None: of
        the image sequence); im0 the frame as read (BoT-SORT's motion compensation reads it). `stem`: the MOT file's
        name (the predictor's, unique in its run; else the path's), `frame`: the number its lines give the frame
        (the video's own, which --vid-stride and a stream's skipped frames step past; else the sequence's count)."""
        if self.one_sequence:  # the calls' frames one sequence, counted across them
            if None not in self.sources and self.last in self.sources:  # persist=True after a call without it
                self.sources[None] = self.sources[self.last]
            path, frame = None, None
        self.last = path
        tracker, _, mot = self._state(path, fps, stem)
        rows = record.boxes
        det = rows.detach().cpu().double().numpy() if rows is not None else np.zeros((0, 7 if self.rotated else 6))
        idx, ids, boxes = tracker.update(self._boxes(det), det[:, 4], det[:, 5], im0)
        order = np.argsort(ids, kind="stable")  # by id: the same object keeps its place in the record
        idx, ids, tracked = idx[order], ids[order], self._with_track_boxes(det[idx[order]], boxes[order], im0.shape)
        keep = {"boxes": torch.from_numpy(tracked).to(rows)} if rows is not None else {}
        if record.masks is not None:
            keep["masks"] = record.masks[idx]
        if mot is not None:
            with open(mot, "a") as f:
                f.writelines(mot_lines(frame or tracker.frame, self._upright(tracked), ids, tracked[:, 4]))
        return dataclasses.replace(record, **keep), ids

    def _with_track_boxes(self, rows, boxes, shape):
        """NMS rows (numpy) with their box columns the tracks' `boxes`: xyxy clipped to the image (h, w, ...), or
        an oriented box's xywh and angle, regularised."""
        rows = rows.copy()
        if self.rotated:
            boxes = regularize(torch.from_numpy(boxes)).numpy()
            rows[:, :4], rows[:, -1] = boxes[:, :4], boxes[:, 4]
        else:
            rows[:, :4] = boxes.clip(0, [shape[1], shape[0], shape[1], shape[0]])
        return rows

    def draw(self, im0, record, ids, path):
        """Each id at its box's top-left corner (an oriented box's envelope's) and its trail, on the drawn frame."""
        _, trails, _ = self.sources[None if self.one_sequence else path]
        rows = record.boxes
        boxes = self._upright(rows.detach().cpu().double().numpy()) if rows is not None else np.zeros((0, 4))
        trails.draw(im0, boxes, ids)
        for (x1, y1, _, _), i in zip(boxes, ids):
            org = (int(x1), max(int(y1) - 4, 10))
            cv2.putText(im0, f"id {i}", org, cv2.FONT_HERSHEY_SIMPLEX, 0.5, id_colour(i), 2, cv2.LINE_AA)
        return im0
