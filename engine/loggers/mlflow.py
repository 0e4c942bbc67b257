"""MLflow: `--loggers mlflow` (pip install mlflow). What is sent and when: engine/loggers/tracker.py.

The tracking store is MLFLOW_TRACKING_URI (a server `http://host:5000`, `sqlite:///path.db`, ...), else a local one
beside the runs, `sqlite:///<project>/mlflow.db` with artifacts in <project>/mlartifacts, which needs no server
(`mlflow ui --backend-store-uri sqlite:///<project>/mlflow.db` shows it). The experiment is --project as given, the
run's name the run folder's. MLflow refuses parentheses in names, so results.csv's `metrics/mAP50(B)` is logged as
`metrics/mAP50_B`; options are parameters under their own names, hyperparameters under `hyp/`. Parameters cannot
change once logged: a resumed run logs only those it lacks (an --epochs extension is not one).
"""

import re
import time
from pathlib import Path

from engine.loggers.tracker import Tracker

BATCH = 100  # parameters per log_batch call, MLflow's limit


def mlflow_name(key):
    """A metric or parameter name MLflow takes: 'metrics/mAP50-95(B)' -> 'metrics/mAP50-95_B'."""
    return re.sub(r"[^\w./\- :]", "_", re.sub(r"\((\w+)\)", r"_\1", key))


def flat_params(config):
    """{name: text} of a run's config, the nested `hyp` dict flattened to `hyp/<key>`."""
    params = {}
    for k, v in config.items():
        items = {f"{k}/{hk}": hv for hk, hv in v.items()} if isinstance(v, dict) else {k: v}
        params.update({mlflow_name(name): str(value) for name, value in items.items()})
    return params


class MLflowTracker(Tracker):
    name = "mlflow"
    install = "mlflow"

    def __init__(self, log_model=True):
        super().__init__(log_model)
        self.mlflow = self.client = self.run_id = None
        self.uri = ""

    def open(self, event, run_id):
        self.mlflow = self.require("mlflow")
        from mlflow.entities import Param

        default = Path(event.save_dir).resolve().parent  # the --project folder
        local = f"sqlite:///{default / 'mlflow.db'}"
        # set: MLFLOW_TRACKING_URI, or mlflow.set_tracking_uri by a Python caller
        self.uri = self.mlflow.get_tracking_uri() if self.mlflow.is_tracking_uri_set() else local
        self.client = self.mlflow.MlflowClient(tracking_uri=self.uri)
        run = self._existing(run_id)
        if run is None:
            experiment = self._experiment(event.project, default)
            run = self.client.create_run(experiment, run_name=event.save_dir.name)
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        self.run_id = run.info.run_id
        new = {k: v for k, v in flat_params(event.config).items() if k not in run.data.params}
        items = list(new.items())
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in items[i: i + BATCH]])
        return self.run_id

    def _existing(self, run_id):
        """The run to continue, or None: none recorded, or the store no longer has it (another store, deleted)."""
        if run_id is None:
            return None
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(run_id)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return None if run.info.lifecycle_stage == "deleted" else run

    def _experiment(self, name, default):
        """The id of experiment `name`, created where none is (artifacts beside the default store's database)."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        local = self.uri == f"sqlite:///{default / 'mlflow.db'}"
        return self.client.create_experiment(name, artifact_location=(default / "mlartifacts").as_uri() if local
                                             else None)

    def where(self):
        return f" in {self.uri}"

    def log_step(self, metrics, pictures, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        if metrics:
            self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), float(v), now, step)
                                                        for k, v in metrics.items()])
        for p in pictures:
            self.client.log_artifact(self.run_id, str(p), "pictures")

    def log_final(self, pictures, table, step):
        self.log_step({}, pictures, step)
        columns, rows = table
        if rows:
            self.client.log_table(self.run_id, {c: [r[i] for r in rows] for i, c in enumerate(columns)},
                                  "per_class.json")

    def log_weights(self, path, step):
        self.client.log_artifact(self.run_id, str(path), "weights")

    def close(self, status="finished"):
        run_id, self.run_id = self.run_id, None
        if run_id is not None:
            self.client.set_terminated(run_id, status.upper())  # FINISHED, KILLED, FAILED: MLflow's own statuses
