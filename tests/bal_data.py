"""Where the tests find the real BAL problems (they are not part of the package).

Looked up in $PYCLAD_BAL_DIR, else shared/data/bal inside or beside the checkout (where CI
lays it). Missing data skips the tests that need it, with the reason, on a user's machine;
where PYCLAD_REQUIRE_BAL=1 (CI sets it) missing data is a failure, so it can hide nothing.
"""
import glob
import os
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def bal_dir():
    for folder in (os.environ.get("PYCLAD_BAL_DIR", ""), _ROOT / "shared" / "data" / "bal",
                   _ROOT.parent / "shared" / "data" / "bal"):
        if folder and glob.glob(os.path.join(str(folder), "problem-*.txt*")):
            return pathlib.Path(folder)
    return None


def missing(what: str):
    message = (f"{what}: the real BAL problems are not shipped with the package; set "
               "PYCLAD_BAL_DIR to a folder of problem-*.txt.bz2 files")
    if os.environ.get("PYCLAD_REQUIRE_BAL") == "1":
        pytest.fail(message)
    pytest.skip(message)


def bal_file(name: str) -> pathlib.Path:
    """The path of one shared problem, e.g. ``bal_file("problem-49-7776-pre")``."""
    folder = bal_dir()
    path = folder / f"{name}.txt.bz2" if folder else None
    if path is None or not path.exists():
        missing(f"{name}.txt.bz2 not found")
    return path


def bal_paths():
    """Every shared problem, smallest first."""
    folder = bal_dir()
    if folder is None:
        missing("no BAL problems found")
    return sorted((str(p) for p in folder.glob("problem-*.txt*")), key=os.path.getsize)
