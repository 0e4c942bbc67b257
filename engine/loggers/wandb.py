"""Weights & Biases: `--loggers wandb` (pip install wandb). What is sent and when: engine/loggers/tracker.py.

Online after `wandb login` (or with WANDB_API_KEY); without a key the tracker is off with one warning, rather than
let wandb ask for an account on the terminal while every rank waits. WANDB_MODE=offline writes the run under the run
folder (<run>/wandb/offline-run-*), for `wandb sync` to upload later; a resumed run writes another such folder under
the same run id, and both sync into one run. The W&B project is --project with the characters W&B refuses in a
project name replaced by '-' (runs/train -> runs-train), the run's name is the run folder's (exp2). WANDB_ENTITY and
the other WANDB_* variables are wandb's own settings.
"""

from pathlib import Path

from engine.loggers.tracker import Tracker, TrackerOff, service_project_name


class WandbTracker(Tracker):
    name = "wandb"
    install = "wandb"

    def __init__(self, log_model=True):
        super().__init__(log_model)
        self.wandb = self.run = None

    def open(self, event, run_id):
        wandb = self.wandb = self.require("wandb")
        if wandb.setup().settings.mode in ("online", "shared") and not wandb.login(prompt=False, verify=False):
            raise TrackerOff("wandb: not logged in (wandb login, or WANDB_API_KEY); WANDB_MODE=offline needs no login")
        # reinit: a process may train several runs (train.run from Python, --evolve); resume "allow": a run id the
        # W&B server never received (an offline run not yet synced) is opened under that id
        self.run = wandb.init(project=service_project_name(event.project, 128), name=event.save_dir.name,
                              dir=event.save_dir, id=run_id, resume="allow" if run_id else None,
                              config=event.config, allow_val_change=True, reinit="create_new")
        return self.run.id

    def where(self):
        # an offline run's url warns "URL not available in offline run" on the console
        if not self.run.offline and self.run.url:
            return f": {self.run.url}"
        return f" offline in {Path(self.run.dir).parent} (wandb sync it to upload)"

    def log_step(self, metrics, pictures, step):
        # committed now: wandb keeps an uncommitted step in this process, and a killed worker would lose it
        self.run.log({**metrics, **self._images(pictures)}, step=step, commit=True)

    def log_final(self, pictures, table, step):
        # a committed step takes nothing more: the end's pictures and table go to the step after the last epoch
        columns, rows = table
        items = self._images(pictures)
        if rows:
            items["per_class"] = self.wandb.Table(columns=columns, data=rows)
        if items:
            self.run.log(items, step=step + 1, commit=True)

    def _images(self, paths):
        return {p.stem: self.wandb.Image(str(p)) for p in paths}

    def log_weights(self, path, step):
        artifact = self.wandb.Artifact(f"run_{self.run.id}_model", type="model", metadata={"epoch": step})
        artifact.add_file(str(path), name=path.name)
        self.run.log_artifact(artifact, aliases=["best"])

    def close(self, status="finished"):
        run, self.run = self.run, None
        if run is not None:
            # a run that ended early (killed or failed) is marked failed, W&B's status for a non-zero exit code;
            # --resume opens it again
            run.finish(exit_code=0 if status == "finished" else 1)
