"""Charts of a run, drawn with matplotlib: results.png, labels.jpg, the P/R/F1/PR curves and the confusion matrices.

Figures are built with `matplotlib.figure.Figure` and saved directly (no pyplot): no global backend switch, no
window, and safe to call from any thread.
"""

import csv
from pathlib import Path

import numpy as np

from evaluation.plots import colors

MAX_CLASS_LINES = 20  # beyond this many classes a curve plot shows only the mean


def _rgb(i):
    return tuple(c / 255 for c in colors(i))


def _figure(**kwargs):
    # deferred: importing matplotlib is a noticeable part of every script's start-up, and runs with --noplots, the
    # predict scripts and a user error never draw a chart
    from matplotlib.figure import Figure

    return Figure(tight_layout=True, **kwargs)


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator  # deferred with the rest of matplotlib

    return MaxNLocator(integer=True)  # epochs are whole: no tick at 1.5


def _save(fig, path, dpi=150):
    fig.savefig(path, dpi=dpi)
    return Path(path)


def _smooth(y, f=0.1):
    """Box filter over a fraction f of the points (the mean curve is noisy at a few hundred detections)."""
    half = round(len(y) * f / 2)  # an odd window of 2 * half + 1 points (about f of them) keeps len(y) points
    p = np.ones(half)
    return np.convolve(np.concatenate((p * y[0], y, p * y[-1])), np.ones(2 * half + 1) / (2 * half + 1), mode="valid")


def read_results(csv_path):
    """results.csv -> (column names, float array (epochs, columns)); NaN where an epoch has no value (with --noval
    only the last epoch has validation metrics)."""
    with open(csv_path, newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]]
    values = [[float(v) if v.strip() else np.nan for v in r] for r in rows[1:]]
    return header, np.array(values, dtype=float).reshape(-1, len(header))


def plot_results(csv_path, path=None):
    """One panel per results.csv column (losses, precision, recall, mAPs; not the learning rates) by epoch."""
    header, data = read_results(csv_path)
    cols = [i for i, h in enumerate(header) if h != "epoch" and not h.startswith("lr/")]
    ncol = min(5, len(cols))
    nrow = -(-len(cols) // ncol)
    fig = _figure(figsize=(3.2 * ncol, 2.8 * nrow))
    epochs = data[:, header.index("epoch")] if "epoch" in header else np.arange(1, len(data) + 1)
    epochs = epochs + 1 if len(epochs) and epochs.min() == 0 else epochs  # a file numbered from 0 (older runs)
    for k, i in enumerate(cols):
        ax = fig.add_subplot(nrow, ncol, k + 1)
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.plot(epochs, data[:, i], marker=".", linewidth=2, markersize=8, label="results")
        if len(data) >= 20:  # a trend line only where there are enough epochs to average
            ax.plot(epochs, _smooth(data[:, i], 0.05), ":", linewidth=2, label="smooth")
        ax.set_title(header[i], fontsize=11)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{Path(csv_path).parent.name}: {len(data)} epochs")
    return _save(fig, path or Path(csv_path).with_name("results.png"))


def plot_labels(cls, boxes, names, path):
    """Class histogram, box centres, box sizes and box outlines of a dataset's labels.

    cls (n,) ints; boxes (n, 4) normalised xywh, or None for classification (histogram only).
    """
    cls = np.asarray(cls, dtype=int).reshape(-1)
    nc = len(names)
    panels = 1 if boxes is None else 4
    fig = _figure(figsize=(4 * min(panels, 2), 4 * (1 + (panels > 2))))
    ax = fig.add_subplot(1 + (panels > 2), min(panels, 2), 1)
    counts = np.bincount(cls, minlength=nc)
    ax.bar(range(nc), counts, color=[_rgb(i) for i in range(nc)])
    ax.set_ylabel("instances")
    ax.set_title(f"{len(cls)} labels, {nc} classes")
    ax.set_xticks(range(nc), [names[i] for i in range(nc)], rotation=90 if nc > 8 else 0, fontsize=8)
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=float).reshape(-1, 4)
        for k, (a, b, label) in enumerate(((0, 1, ("x", "y")), (2, 3, ("width", "height"))), start=2):
            ax = fig.add_subplot(2, 2, k)
            ax.hist2d(boxes[:, a], boxes[:, b], bins=50, range=((0, 1), (0, 1)), cmap="Blues")
            ax.set_xlabel(label[0])
            ax.set_ylabel(label[1])
            ax.set_title("box centres" if a == 0 else "box sizes")
        from matplotlib.collections import LineCollection  # deferred with Figure (_figure)

        ax = fig.add_subplot(2, 2, 4)
        # one collection of closed outlines: drawing 1000 Rectangle patches costs matplotlib more than the rest of
        # labels.jpg
        w, h = boxes[:1000, 2], boxes[:1000, 3]
        x0, x1, y0, y1 = 0.5 - w / 2, 0.5 + w / 2, 0.5 - h / 2, 0.5 + h / 2
        outlines = np.stack([np.stack(p, -1) for p in ((x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0))], 1)
        ax.add_collection(LineCollection(outlines, colors=[_rgb(c) for c in cls[:1000]], linewidths=1.0, alpha=0.3))
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_title("box outlines (centred)")
    return _save(fig, path, dpi=120)


def plot_curve(x, curves, names, path, xlabel, ylabel, summary):
    """Per-class curves (rows of `curves`, in the order of `names`) and their mean, thick, labelled `summary(mean)`."""
    fig = _figure(figsize=(9, 6))
    ax = fig.add_subplot(1, 1, 1)
    curves = np.asarray(curves).reshape(-1, len(x))
    if len(curves) <= MAX_CLASS_LINES:
        for i, (y, name) in enumerate(zip(curves, names)):
            ax.plot(x, y, linewidth=1, label=str(name), color=_rgb(i))
    else:
        ax.plot(x, curves.T, linewidth=1, color="grey")
    mean = curves.mean(0) if len(curves) else np.zeros_like(x)
    ax.plot(x, mean, linewidth=3, color="blue", label=f"all classes {summary(mean)}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left")
    ax.set_title(f"{ylabel}-{xlabel} curve" if xlabel == "Recall" else f"{ylabel}-Confidence curve")
    return _save(fig, path)


def plot_metric_curves(curves, names, save_dir, prefix=""):
    """PR, F1, P and R curve PNGs from `ap_per_class` curves (`prefix` 'Mask' for the mask metrics)."""
    px, labels = curves["px"], [names[int(c)] for c in curves["classes"]]
    ap50 = curves["ap50"]
    save_dir = Path(save_dir)
    files = [plot_curve(px, curves["pr"], labels, save_dir / f"{prefix}PR_curve.png", "Recall", "Precision",
                        lambda m: f"{ap50.mean() if len(ap50) else 0:.3f} mAP@0.5")]
    for key, ylabel in (("f1", "F1"), ("p", "Precision"), ("r", "Recall")):
        def best(m):
            i = int(_smooth(m, 0.1).argmax()) if m.any() else 0
            return f"{m[i]:.2f} at {px[i]:.3f}"

        f = save_dir / f"{prefix}{key.upper()}_curve.png"
        files.append(plot_curve(px, curves[key], labels, f, "Confidence", ylabel, best))
    return files


def draw_confusion_matrix(array, labels, path, normalize=True):
    """A square matrix [predicted, true] with class names on both axes, counts or column fractions in the cells."""
    n = len(labels)
    size = min(max(6, 0.5 * n + 3), 24)
    fig = _figure(figsize=(size, size * 0.85))
    ax = fig.add_subplot(1, 1, 1)
    shown = np.where(array < 0.005, np.nan, array) if normalize else np.where(array == 0, np.nan, array)
    im = ax.imshow(shown, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if n < 30:
        vmax = 1.0 if normalize else max(float(np.nanmax(array)), 1.0)
        for r in range(n):
            for c in range(n):
                if np.isnan(shown[r, c]):
                    continue
                text = f"{array[r, c]:.2f}" if normalize else str(int(array[r, c]))
                ax.text(c, r, text, ha="center", va="center", fontsize=8,
                        color="white" if array[r, c] / vmax > 0.5 else "black")
    ax.set_xticks(range(n), labels, rotation=90, fontsize=9)
    ax.set_yticks(range(n), labels, fontsize=9)
    ax.set_xlabel("True")
    ax.set_ylabel("Predicted")
    ax.set_title("Confusion Matrix" + (" (normalized by true class)" if normalize else " (counts)"))
    return _save(fig, path)


class RunPlots:
    """Trainer callbacks (engine/callbacks.py) that draw a run's pictures on rank 0: labels.jpg after set-up,
    results.png from results.csv at the end (a second or more of matplotlib per call: too slow for every epoch of small
    runs; no results.csv, with --loggers leaving out csv: no results.png). Attached before the loggers, which send the
    pictures on (TensorBoard, trackers).

    The validator draws its own charts (val batches, curves, confusion matrices) on the final validation.
    """

    def on_pretrain_routine_end(self, event):
        cls, boxes = event.labels
        plot_labels(cls, boxes, event.names, event.save_dir / "labels.jpg")

    def on_train_end(self, event):
        results = event.save_dir / "results.csv"
        if event.main and results.is_file():  # an event of every rank
            plot_results(results)
