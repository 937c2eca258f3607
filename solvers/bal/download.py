"""Download the official BAL problems (https://grail.cs.washington.edu/projects/bal/) with a local cache.

    from solvers.bal.download import download
    path = download("problem-49-7776-pre")               # group found in the table below
    path = download("problem-1723-156502-pre", group="ladybug")
    problem = solvers.read_bal(path)

Files land in ``$PYCLAD_BAL_CACHE`` (default ``~/.cache/pyclad/bal/<group>/``) and are fetched
once: a complete cached file is returned without touching the network. Downloads go to a
``.partial`` file that is renamed only once complete and checked to be a bzip2 BAL file.
``base_url`` may point at a mirror, including a local ``file://`` folder laid out as
``<base_url>/<group>/<name>.txt.bz2``.
"""
from __future__ import annotations

import bz2
import os
import shutil
import urllib.error
import urllib.request
from typing import Optional

from . import problem_name

BASE_URL = "https://grail.cs.washington.edu/projects/bal/data"
GROUPS = ("ladybug", "trafalgar", "dubrovnik", "venice", "final")

# A few problems of each group (the full lists are on the BAL site; any name works with group=).
KNOWN = {
    "ladybug": ["problem-49-7776-pre", "problem-73-11032-pre", "problem-138-19878-pre",
                "problem-318-41628-pre", "problem-372-47423-pre", "problem-412-52215-pre",
                "problem-1723-156502-pre"],
    "trafalgar": ["problem-21-11315-pre", "problem-39-18060-pre", "problem-50-20431-pre",
                  "problem-126-40037-pre", "problem-257-65132-pre"],
    "dubrovnik": ["problem-16-22106-pre", "problem-88-64298-pre", "problem-135-90642-pre",
                  "problem-356-226730-pre"],
    "venice": ["problem-52-64053-pre", "problem-89-110973-pre", "problem-245-198739-pre",
               "problem-1778-993923-pre"],
    "final": ["problem-93-61203-pre", "problem-394-100368-pre", "problem-871-527480-pre",
              "problem-961-187103-pre", "problem-1936-649673-pre", "problem-3068-310854-pre",
              "problem-4585-1324582-pre", "problem-13682-4456117-pre"],
}


def cache_dir() -> str:
    return os.environ.get("PYCLAD_BAL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pyclad", "bal")


def find_group(name: str) -> Optional[str]:
    name = problem_name(name)
    for group, names in KNOWN.items():
        if name in names:
            return group
    return None


def download(name: str, group: Optional[str] = None, cache: Optional[str] = None,
             base_url: Optional[str] = None, timeout: float = 60.0) -> str:
    """Path of the cached ``<name>.txt.bz2`` of BAL group ``group``, downloading it if needed.

    ``name`` may be given as ``"group/problem-..."``. Raises ``ValueError`` for an unknown group or a
    name whose group cannot be found, ``OSError`` (with the URL) when the download fails.
    """
    if "/" in name and group is None:
        group, name = name.split("/", 1)
    name = problem_name(name)
    group = group or find_group(name)
    if group is None:
        raise ValueError(f"the BAL group of {name!r} is unknown: pass group= one of {GROUPS}")
    if group not in GROUPS:
        raise ValueError(f"group={group!r} is not one of {GROUPS}")
    folder = os.path.join(cache or cache_dir(), group)
    path = os.path.join(folder, name + ".txt.bz2")
    if os.path.isfile(path):
        return path
    os.makedirs(folder, exist_ok=True)
    url = f"{(base_url or BASE_URL).rstrip('/')}/{group}/{name}.txt.bz2"
    tmp = path + ".partial"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
        _check_bz2_bal(tmp, url)
    except (urllib.error.URLError, OSError, ValueError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, ValueError):
            raise
        raise OSError(f"cannot download {url}: {e}") from e
    os.replace(tmp, path)
    return path


def _check_bz2_bal(path: str, url: str) -> None:
    """The downloaded file must decompress and start with a BAL header (3 integers)."""
    try:
        with bz2.open(path, "rb") as f:
            first = f.readline(256).split()
    except (OSError, EOFError) as e:
        raise ValueError(f"{url} is not a bzip2 file ({e})") from e
    if len(first) != 3 or not all(t.isdigit() for t in first):
        raise ValueError(f"{url} does not start with a BAL header 'num_cameras num_points num_observations'")
