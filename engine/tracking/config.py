"""The tracker's settings: a YAML with Ultralytics' keys (data/trackers/bytetrack.yaml, botsort.yaml), read strictly.

`--track bytetrack` / `--track botsort` name the project's files; `--track my.yaml` a file of one's own, whose
`tracker_type` chooses the tracker (`--track botsort.yaml` too, where the working folder holds one: Ultralytics'
guide has one copy its files and edit them). Ultralytics' botsort.yaml also holds re-identification keys (`with_reid`,
`proximity_thresh`, `appearance_thresh`, `model`): they are accepted so its files load, and `with_reid: true`, which
would need an appearance model this project does not run, is refused.
"""

import dataclasses
import difflib
from pathlib import Path

from utils.files import ROOT, ConfigError, yaml_load

TRACKERS_DIR = ROOT / "data" / "trackers"
REID_KEYS = {"with_reid": "bool", "proximity_thresh": "float", "appearance_thresh": "float", "model": "str"}


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
    """A YAML file that is there, whatever its name (one's own botsort.yaml in the working folder, as Ultralytics
    reads it first); else `bytetrack` / `botsort` (or their .yaml names) -> the project's file; else the path."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    if str(name) in ("bytetrack", "botsort", "bytetrack.yaml", "botsort.yaml"):
        return TRACKERS_DIR / f"{path.stem}.yaml"
    return path


def _typed(key, value, hint, label):
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {"float": number, "int": number and float(value).is_integer(), "bool": isinstance(value, bool),
          "str": isinstance(value, str)}[hint]
    if not ok:
        raise ConfigError(f"{label}: {key}: {value!r} is not {'an' if hint == 'int' else 'a'} {hint}")
    return int(value) if hint == "int" else float(value) if hint == "float" else value


def load_tracker_config(name):
    """The TrackerConfig of `name` (see tracker_file); each mistake is one ConfigError naming the file and key."""
    path = tracker_file(name)
    d = yaml_load(path)
    fields = {f.name: f for f in dataclasses.fields(TrackerConfig)}
    unknown = sorted(map(str, set(d) - set(fields) - set(REID_KEYS)))
    if unknown:
        close = {k: difflib.get_close_matches(k, [*fields, *REID_KEYS], n=1) for k in unknown}
        hints = [f"{k} (did you mean {m[0]}?)" if m else k for k, m in close.items()]
        raise ConfigError(f"{path}: unknown key(s) {', '.join(hints)}; a tracker takes {', '.join(fields)}")
    for k, hint in REID_KEYS.items():  # typed like the rest: with_reid: 'false' (a string) is no false
        if k in d:
            _typed(k, d[k], hint, path)
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
    if cfg.track_low_thresh > cfg.track_high_thresh:  # the second association's boxes lie between the two
        raise ConfigError(f"{path}: track_low_thresh {cfg.track_low_thresh} is above track_high_thresh "
                          f"{cfg.track_high_thresh}: the second association would take no box (set them equal for "
                          "none)")
    return cfg


def make_tracker(cfg, frame_rate=30, rotated=False):
    """The tracker `cfg` names; `rotated`: it follows oriented boxes (xywhr)."""
    from engine.tracking.tracker import BotSort, ByteTracker

    return (BotSort if cfg.tracker_type == "botsort" else ByteTracker)(cfg, frame_rate, rotated)
