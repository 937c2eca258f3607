"""``python -m solvers.colmap MODEL_DIR --out OUT_DIR``: the command line of :mod:`solvers.colmap.cli`."""
from ..split.cli import exit_process
from .cli import main

# Guarded so that importing the package's modules one by one (documentation tools do) runs nothing.
if __name__ == "__main__":
    exit_process(main())
