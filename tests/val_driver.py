"""Run a val script's own parse_opt/main (under torchrun or alone) and write what main returned, per rank, as JSON:

    python -m torch.distributed.run --nproc_per_node 2 -m tests.val_driver OUT_DIR val|segment|pose|obb|classify <args>
"""

import importlib
import json
import sys
from pathlib import Path

from utils.dist import get_rank

SCRIPTS = {"val": "val", "segment": "segment.val", "pose": "pose.val", "obb": "obb.val", "classify": "classify.val"}


def main():
    out, script, args = Path(sys.argv[1]), importlib.import_module(SCRIPTS[sys.argv[2]]), sys.argv[3:]
    stats = script.main(script.parse_opt(args))
    (out / f"stats_rank{max(get_rank(), 0)}.json").write_text(json.dumps(stats))


if __name__ == "__main__":
    main()
