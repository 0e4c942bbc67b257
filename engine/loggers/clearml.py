"""ClearML: `--loggers clearml` (pip install clearml). What is sent and when: engine/loggers/tracker.py.

Online after `clearml-init` (clearml.conf) or with CLEARML_API_HOST, CLEARML_API_ACCESS_KEY and
CLEARML_API_SECRET_KEY. Without credentials, or with a server that does not answer its ping within 10 s, the tracker
is off with one warning: ClearML itself would retry for minutes while every rank waits. CLEARML_OFFLINE_MODE=1 needs
neither: the task is written as an offline session, <CLEARML_CACHE_DIR or ~/.clearml/cache>/offline/<task id>/ and a
zip of it beside, uploaded later from Python with `Task.import_offline_session("<id>.zip")`.

The ClearML project is --project as given, the task's name the run folder's. The options are the task's `Args`
section, the hyperparameters its `Hyperparameters`. A results.csv column is a scalar titled by the part before its
last '/' and named by the rest ('train/box_loss' -> train / box_loss; a name without '/' is both), at iteration =
the epoch as results.csv numbers it. Pictures are debug samples titled by their file's stem, the final per-class
table a table plot, best.pt the task's artifact `best.pt` (not an output model: clearml 2.1's OutputModel raises
offline, its placeholder model lacking `locked`).

A restart continues the task (Task.init(continue_last_task=<id>), iterations kept as sent: no offset). Offline, the
session folder of that id is continued in place, its events appended and its zip rewritten whole, so one zip holds
every epoch. Where the folder is gone (another machine, a cleared cache), ClearML opens a new session folder under the
same id holding only what follows; upload the first session's zip, then this one with
`Task.import_offline_session(zip, previous_task_id=<the first upload's id>)`. A run that ends early is closed, then
marked stopped (killed: --resume opens it again) or failed on the server; an offline session records no status.

What Task.init would otherwise do to the run is turned off: framework binding (it patches torch.save, matplotlib and
TensorBoard's writer, and would send what this tracker sends a second time), argparse and console capture, resource
monitoring, repository and package detection (a thread that stores the uncommitted diff and that Task.close waits up
to 5 minutes for), reseeding every random generator (Task.set_random_seed(None)), the reporting subprocess forked from
the training process (reports are written by a thread and flushed at each epoch's end), and the fork hook that would
start ClearML in every DataLoader worker (unbound as Task.close unbinds it). Its signal handlers, sys.excepthook and
sys.exit are put back by the shared rules (tracker.kept_process_state). A run started by a process that had a ClearML
task (a sweep driver, a test suite) inherits CLEARML_PROC_MASTER_ID naming that process, which makes Task.init return
a stub or the parent's task: the run asked for a task of its own, so that inherited marker is dropped.
"""

import os

from engine.loggers.tracker import Tracker, TrackerOff

# every key Task.init's auto_connect_frameworks knows, off; a key left out would be on
FRAMEWORKS = ("matplotlib", "tensorflow", "tensorboard", "pytorch", "xgboost", "scikit", "fastai", "lightgbm",
              "hydra", "detect_repository", "tfdefines", "joblib", "megengine", "catboost", "gradio")
PING_TIMEOUT = 10  # seconds for the server to answer before the tracker is off
MASTER_VARS = ("CLEARML_PROC_MASTER_ID", "TRAINS_PROC_MASTER_ID")  # "<pid>:<task id>" of the process with the task


def scalar_name(column):
    """(title, series) of a results.csv column: 'metrics/mAP50(B)' -> ('metrics', 'mAP50(B)')."""
    title, _, series = column.rpartition("/")
    return (title, series) if title else (column, column)


class ClearMLTracker(Tracker):
    name = "clearml"
    install = "clearml"

    def __init__(self, log_model=True):
        super().__init__(log_model)
        self.task = None

    def open(self, event, run_id):
        clearml = self.require("clearml")
        from clearml.backend_api.session.defs import ENV_OFFLINE_MODE

        Task = clearml.Task
        if ENV_OFFLINE_MODE.get():  # ClearML reads it once, when imported: a later setting counts here too
            Task.set_offline(True)
        if not Task.is_offline():
            self._check_server()
        for var in MASTER_VARS:  # set by a ClearML task in a parent process, this one would get a stub or its task
            if os.environ.get(var, "").partition(":")[0] not in ("", str(os.getpid())):
                del os.environ[var]
        Task.set_random_seed(None)
        Task._report_subprocess_enabled = False  # what clearml.conf's development.report_use_subprocess sets
        self.task = Task.init(project_name=event.project, task_name=event.save_dir.name,
                              continue_last_task=run_id or False, reuse_last_task_id=False,
                              auto_connect_frameworks=dict.fromkeys(FRAMEWORKS, False), auto_connect_arg_parser=False,
                              auto_connect_streams=False, auto_resource_monitoring=False)
        from clearml.binding.environ_bind import PatchOsFork

        PatchOsFork.patch_fork(None)
        self.task.set_initial_iteration(0)  # a continued task would shift every iteration past its last one
        config = event.config
        self.task.connect({k: v for k, v in config.items() if k != "hyp"}, name="Args")
        self.task.connect(config["hyp"], name="Hyperparameters")
        return self.task.id

    def _check_server(self):
        """TrackerOff unless credentials are configured and the API server answers at all."""
        import requests
        from clearml.backend_api import Session
        from clearml.backend_api.session.defs import ENV_ACCESS_KEY, ENV_AUTH_TOKEN
        from clearml.config import config_obj

        if not (ENV_ACCESS_KEY.get() or ENV_AUTH_TOKEN.get() or config_obj.get("api.credentials.access_key", None)):
            raise TrackerOff("clearml: not configured (clearml-init, or CLEARML_API_* variables); "
                             "CLEARML_OFFLINE_MODE=1 needs no server")
        host = Session.get_api_server_host()
        try:  # any HTTP answer will do: what is wrong past the connection, Task.init says at once
            requests.get(f"{host}/debug.ping", timeout=PING_TIMEOUT)
        except requests.RequestException as e:
            raise TrackerOff(f"clearml: server {host} does not answer ({type(e).__name__}); "
                             "CLEARML_OFFLINE_MODE=1 needs no server") from None

    def where(self):
        if self.task.is_offline():
            folder = self.task.get_offline_mode_folder()
            return f" offline in {folder} ({folder.name}.zip at the end, for Task.import_offline_session)"
        return f": {self.task.get_output_log_web_page()}"

    def log_step(self, metrics, pictures, step):
        logger = self.task.get_logger()
        for column, value in metrics.items():
            logger.report_scalar(*scalar_name(column), value=float(value), iteration=step)
        for p in pictures:
            logger.report_image(p.stem, p.name, iteration=step, local_path=str(p))
        self.task.flush(wait_for_uploads=True)  # written now: a killed worker loses no epoch ClearML was given

    def log_final(self, pictures, table, step):
        columns, rows = table
        if rows:
            self.task.get_logger().report_table("per_class", "final validation", iteration=step,
                                                table_plot=[list(columns), *map(list, rows)])
        self.log_step({}, pictures, step)

    def log_weights(self, path, step):
        self.task.upload_artifact(path.name, artifact_object=str(path), metadata={"epoch": step}, wait_on_upload=True)

    def close(self, status="finished"):
        task, self.task = self.task, None
        if task is not None:
            task.close()  # marks the task completed; an offline session records no status
            if status == "killed":  # then the server's status, as ClearML's own exit hook sets it
                task.stopped(force=True, status_message="stopped early: --resume continues it")
            elif status == "failed":
                task.mark_failed(force=True, status_reason="the run ended with an error")
