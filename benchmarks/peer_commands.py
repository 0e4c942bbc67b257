"""The peers' training commands that need more than their CLI, shared by whole_run.py and study.py."""

# Ultralytics' own training (`YOLO(model).train(**ARGS)`, the values read as its CLI reads them) with torch at N
# threads once training starts: Ultralytics resets the count to cpu_count - 1, one thread on 2 cores. The count
# changes its speed, not what it computes. The task comes from the model's name, as for `yolo train`.
ULTRALYTICS_THREADS = (
    "import sys, torch; from ultralytics import YOLO; from ultralytics.cfg import smart_value; "
    "n, args = int(sys.argv[1]), dict(a.split('=', 1) for a in sys.argv[2:]); m = YOLO(args.pop('model')); "
    "m.add_callback('on_train_start', lambda t: torch.set_num_threads(n)); "
    "m.train(**{k: smart_value(v) for k, v in args.items()})"
)


def ultralytics_train(python, threads, args):
    """argv that trains with Ultralytics from `python` (its venv's interpreter) at `threads` torch threads; `args`
    are its training options {name: value}, `model` among them."""
    return [str(python), "-c", ULTRALYTICS_THREADS, str(threads), *(f"{k}={v}" for k, v in args.items())]
