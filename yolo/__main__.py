"""`python -m yolo ...`: the `yolo` command where the package is not installed (yolo/cli.py)."""

import sys

from yolo.cli import main

if __name__ == "__main__":
    sys.exit(main())
