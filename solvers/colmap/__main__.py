"""``python -m solvers.colmap MODEL_DIR --out OUT_DIR``: the command line of :mod:`solvers.colmap.cli`."""
import sys

from .cli import main

sys.exit(main())
