"""What a tracker kept of a run, read from its own files with no login, server or network, as one table of the logged
metrics by step (the epoch, numbered as results.csv numbers it):

    python -m engine.loggers.offline runs/train/exp/wandb/offline-run-*       # W&B offline run folder(s)
    python -m engine.loggers.offline runs/train/mlflow.db                     # MLflow's local store, every run
    python -m engine.loggers.offline ~/.clearml/cache/offline/<task id>.zip   # ClearML offline session
    python -m engine.loggers.offline runs/train/exp/comet/<key>.zip           # Comet offline experiment

W&B's run file is read by wandb's own reader (`wandb leet inspect --json`; `wandb leet` is its terminal viewer), the
MLflow store by MlflowClient (`mlflow ui` is its browser view), the ClearML and Comet zips as those packages write
them (their events: ClearML's metrics.jsonl, Comet's messages.json), so the table shows what an upload would send.
"""

import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path


def read_wandb(folder):
    """{metric: {step: value}} of a W&B offline run folder."""
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)], capture_output=True,
                       text=True, timeout=300)
    if r.returncode:
        raise ValueError(f"{folder}: wandb cannot read it ({r.stderr.strip()[-300:]})")
    metrics = {}
    for record in map(json.loads, r.stdout.splitlines()):
        if record.get("type") == "history":
            step = int(record["history"]["step"].get("num", 0))
            item = record["history"]["item"]
            # a picture or table comes flattened as `name._type`, `name.height`, `name.size`...: not metrics
            media = {k.rpartition(".")[0] for k in item if k.endswith("._type")}
            for k, v in item.items():
                if not k.startswith("_") and k.rpartition(".")[0] not in media and isinstance(v, (int, float)):
                    metrics.setdefault(k, {})[step] = float(v)
    return metrics


def read_mlflow(db):
    """{run name/metric: {step: value}} of every run in an MLflow sqlite store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(db).resolve()}")
    metrics = {}
    for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
        for key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            metrics[f"{run.info.run_name}/{key}"] = {m.step: float(m.value) for m in history}
    return metrics


def read_clearml(zf):
    """{title/series: {iteration: value}} of a ClearML offline session zip."""
    metrics = {}
    for line in zf.read("metrics.jsonl").decode().splitlines():
        for event in json.loads(line) if line.strip() else []:
            if event.get("type") == "training_stats_scalar":
                title, series = event["metric"], event["variant"]
                name = title if title == series else f"{title}/{series}"  # clearml.scalar_name, read back
                metrics.setdefault(name, {})[int(event["iter"])] = float(event["value"])
    return metrics


def read_comet(zf):
    """{metric: {step: value}} of a Comet offline experiment zip (its own 'process duration' left out)."""
    metrics = {}
    for line in zf.read("messages.json").decode().splitlines():
        message = json.loads(line) if line.strip() else {}
        if message.get("type") == "metric_msg":
            m = message["payload"]["metric"]
            if m["metricName"] != "process duration":
                metrics.setdefault(m["metricName"], {})[int(m["step"])] = float(m["metricValue"])
    return metrics


def read(path):
    """{metric: {step: value}} of whatever tracker's offline files `path` is."""
    path = Path(path)
    if path.is_dir() and list(path.glob("*.wandb")):
        return read_wandb(path)
    if path.suffix == ".db":
        return read_mlflow(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if "metrics.jsonl" in names:
                return read_clearml(zf)
            if "messages.json" in names:
                return read_comet(zf)
    raise ValueError(f"{path}: not a W&B offline run folder, an MLflow .db, or a ClearML / Comet offline zip")


def table(metrics):
    """The metrics as CSV text: a step column, then one column per metric."""
    names = sorted(metrics)
    steps = sorted({s for series in metrics.values() for s in series})
    lines = [",".join(["step", *names])]
    lines += [",".join([str(s), *(f"{metrics[n][s]:.6g}" if s in metrics[n] else "" for n in names)]) for s in steps]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("paths", nargs="+", help="W&B offline run folders, MLflow .db files, ClearML or Comet offline zips")
    for path in p.parse_args(argv).paths:
        try:
            print(f"# {path}\n{table(read(path))}")
        except (ValueError, OSError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
