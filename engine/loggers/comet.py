"""Comet: `--loggers comet` (pip install comet_ml). What is sent and when: engine/loggers/tracker.py.

Online with COMET_API_KEY (or `comet login`); without a key the tracker is off with one warning, and so is an
experiment whose server does not answer (comet_ml gives up after about 30 s and would drop everything quietly).
Offline, with comet_ml's COMET_START_ONLINE=false or YOLOv5's COMET_MODE=offline, each start of the run writes a zip
of the experiment's messages into COMET_OFFLINE_DIRECTORY, else <run>/comet, for `comet upload <zip>` later.

The Comet project is --project with the characters a project name refuses replaced by '-' (runs/train -> runs-train),
the experiment's name the run folder's. The options and hyperparameters are its parameters (`hyp|lr0`); results.csv
columns are metrics under the same names at step = epoch = the epoch as results.csv numbers it; pictures are images
named by their file's stem, the final per-class table the asset per_class.csv, best.pt a model named `best`.
comet_ml's own collection (console, code, git, environment, system metrics, CLI arguments, and the import hooks that
would log torch and TensorBoard a second time: COMET_DISABLE_AUTO_LOGGING=1 is set unless already set) is off.

A restart continues the experiment by its key (comet_ml.start(experiment_key=..., mode="get")). Offline, that writes
another zip under the same key, which `comet upload` appends to the experiment the first zip created: upload them in
order. comet_ml builds the offline zip when the experiment ends, from a temporary folder: a run stopped by Ctrl-C (or
by SIGTERM outside torchrun) leaves its zip; a worker killed outright (SIGKILL, an out-of-memory kill, or the SIGTERM
with which torchrun's agent ends the survivors of a failed group) leaves only an empty <key>.zip (the probe comet_ml
writes at the start; nothing to upload), and its epochs since that start are not in Comet. Which of the two a
survivor of a lost peer leaves is a race: its collective fails at once and it ends through the exception, writing
its zip, unless the agent's SIGTERM comes first (or, cutting the zip short, while it writes). The restarted run goes
on under the same key from its checkpoint. Online, each epoch is flushed to the server as it ends.
"""

import os

from engine.loggers.tracker import Tracker, TrackerOff, service_project_name

# comet_ml's own collection, off: this tracker sends what the other trackers send, once
COLLECT = dict(auto_output_logging=False, log_code=False, log_git_metadata=False, log_git_patch=False,
               log_env_details=False, log_env_gpu=False, log_env_cpu=False, log_env_host=False,
               log_env_network=False, log_env_disk=False, auto_param_logging=False, auto_metric_logging=False,
               parse_args=False, log_graph=False, display_summary_level=0)


class CometTracker(Tracker):
    name = "comet"
    install = "comet_ml"

    def __init__(self, log_model=True):
        super().__init__(log_model)
        self.experiment = None

    def open(self, event, run_id):
        os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")  # read when comet_ml is imported
        comet_ml = self.require("comet_ml")
        config = comet_ml.get_config()
        online = config.get_bool(None, "comet.start.online", default=True, not_set_value=None)
        online = online and os.environ.get("COMET_MODE", "").lower() != "offline"
        if online and not config.get_string(None, "comet.api_key"):
            raise TrackerOff("comet: no API key (COMET_API_KEY, or comet login); COMET_START_ONLINE=false needs none")
        folder = os.environ.get("COMET_OFFLINE_DIRECTORY") or str(event.save_dir / "comet")
        settings = comet_ml.ExperimentConfig(name=event.save_dir.name, offline_directory=folder, **COLLECT)
        project = service_project_name(event.project, 100)
        self.experiment = comet_ml.start(project_name=project, experiment_key=run_id,
                                         mode="get" if run_id else "create", online=online, experiment_config=settings)
        if not self.experiment.alive:
            raise TrackerOff("comet: the experiment did not start (no answer from the Comet server?); "
                             "COMET_START_ONLINE=false needs none")
        self.experiment.log_parameters(event.config)
        return self.experiment.get_key()

    def where(self):
        url = getattr(self.experiment, "url", None)
        if url:
            return f": {url}"
        return f" offline, a zip in {self.experiment.offline_directory} at the end (comet upload it)"

    def log_step(self, metrics, pictures, step):
        if metrics:
            self.experiment.log_metrics({k: float(v) for k, v in metrics.items()}, step=step, epoch=step)
        for p in pictures:
            self.experiment.log_image(str(p), name=p.stem, step=step)
        self.experiment.flush()  # online: sent now, so a killed worker loses no epoch Comet was given

    def log_final(self, pictures, table, step):
        columns, rows = table
        if rows:
            self.experiment.log_table("per_class.csv", tabular_data=[list(r) for r in rows], headers=list(columns))
        self.log_step({}, pictures, step)

    def log_weights(self, path, step):
        self.experiment.log_model("best", str(path), file_name=path.name, metadata={"epoch": step})

    def close(self, status="finished"):
        experiment, self.experiment = self.experiment, None
        if experiment is not None:
            if status != "finished":  # Comet has no status for it; --resume continues a killed one
                experiment.log_other("ended", status)
            experiment.end()
