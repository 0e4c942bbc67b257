"""The tracker's settings: a YAML with Ultralytics' keys (data/trackers/bytetrack.yaml, botsort.yaml), read strictly.

`--track bytetrack` / `--track botsort` name the project's files; `--track my.yaml` a file of one's own, whose
`tracker_type` chooses the tracker. Ultralytics' botsort.yaml also holds re-identification keys (`with_reid`,
`proximity_thresh`, `appearance_thresh`, `model`): they are accepted so its files load, and `with_reid: true`, which
would need an appearance model this project does not run, is refused.
"""

import dataclasses
from pathlib import Path

from utils.files import ROOT, ConfigError, yaml_load

TRACKERS_DIR = ROOT / "data" / "trackers"
REID_KEYS = {"with_reid", "proximity_thresh", "appearance_thresh", "model"}


@dataclasses.dataclass(frozen=True)
class TrackerConfig:
    tracker_type: str
    track_high_thresh: float
    track_low_thresh: float
    new_track_thresh: float
    track_buffer: int
    match_thresh: float
    fuse_score: bool
    gmc_method: str = "none"  # BoT-SORT's camera-motion compensation: sparseOptFlow or none


def tracker_file(name):
    """`bytetrack` / `botsort` (or their .yaml names) -> the project's file; any other value is a path."""
    if str(name) in ("bytetrack", "botsort", "bytetrack.yaml", "botsort.yaml"):
        return TRACKERS_DIR / f"{Path(name).stem}.yaml"
    return Path(name)


def _typed(key, value, hint, label):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"float": number, "int": number and float(value).is_integer(), "bool": isinstance(value, bool),
          "str": isinstance(value, str)}[hint]
    if not ok:
        raise ConfigError(f"{label}: {key}: {value!r} is not a {hint}")
    return int(value) if hint == "int" else float(value) if hint == "float" else value


def load_tracker_config(name):
    """The TrackerConfig of `name` (see tracker_file); each mistake is one ConfigError naming the file and key."""
    path = tracker_file(name)
    d = yaml_load(path)
    fields = {f.name: f for f in dataclasses.fields(TrackerConfig)}
    unknown = set(d) - set(fields) - REID_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; a tracker takes "
                          f"{', '.join(fields)}")
    if d.get("with_reid"):
        raise ConfigError(f"{path}: with_reid: re-identification needs an appearance model, which this project "
                          "does not run; set it to false")
    missing = [k for k, f in fields.items() if k not in d and f.default is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{path}: missing key(s) {', '.join(missing)}")
    values = {k: _typed(k, d[k], f.type.__name__, path) for k, f in fields.items() if k in d}
    cfg = TrackerConfig(**values)
    if cfg.tracker_type not in ("bytetrack", "botsort"):
        raise ConfigError(f"{path}: tracker_type: {cfg.tracker_type!r}, expected bytetrack or botsort")
    if cfg.gmc_method not in ("sparseOptFlow", "none"):
        raise ConfigError(f"{path}: gmc_method: {cfg.gmc_method!r}, expected sparseOptFlow or none (the other "
                          "methods of Ultralytics' GMC are not here)")
    thresholds = ("track_high_thresh", "track_low_thresh", "new_track_thresh", "match_thresh")
    bad = [k for k in thresholds if not 0 <= getattr(cfg, k) <= 1] + (["track_buffer"] if cfg.track_buffer < 1
                                                                       else [])
    if bad:
        raise ConfigError(f"{path}: {', '.join(bad)} out of range (thresholds 0..1, track_buffer >= 1)")
    return cfg


def make_tracker(cfg, frame_rate=30, rotated=False):
    """The tracker `cfg` names; `rotated`: it follows oriented boxes (xywhr)."""
    from engine.tracking.tracker import BotSort, ByteTracker

    return (BotSort if cfg.tracker_type == "botsort" else ByteTracker)(cfg, frame_rate, rotated)
