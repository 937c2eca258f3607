"""BAL (Bundle Adjustment in the Large) problems: the problem object, a checked reader, a writer.

File format (https://grail.cs.washington.edu/projects/bal/), plain text, optionally .bz2 / .gz::

    <num_cameras> <num_points> <num_observations>
    <camera_index> <point_index> <x> <y>        num_observations lines
    <value>                                     9 * num_cameras lines: [w(3), t(3), f, k1, k2] per camera
    <value>                                     3 * num_points lines: X, Y, Z per point

The reader is vectorised (a numpy tokenizer finds the values per line, ``numpy.fromstring`` parses
the numbers) and reads the file in chunks of whole lines, so a 2 GB file needs no Python loop per
line. It validates everything while reading; any problem raises :class:`BALFormatError` naming the
line and what was expected, and nothing half-read is returned.
"""
from __future__ import annotations

import bz2
import contextlib
import copy
import dataclasses
import gzip
import os
from typing import Iterator, Optional, Tuple

import numpy as np

from ..checks import first_not_finite
from ..io import progress, read_ahead

__all__ = ["BALProblem", "BALFormatError", "read_bal", "write_bal", "open_text", "problem_name"]

CHUNK_BYTES = 64 << 20


class BALFormatError(ValueError):
    """A malformed BAL file; ``line`` is the 1-based line number (None when not tied to a line)."""

    def __init__(self, path, line, message):
        self.path, self.line = str(path), line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


def _indices(a, name: str) -> np.ndarray:
    """``a`` as int64 indices; a float array must hold whole numbers (never truncated)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        whole = np.isfinite(a) & (a == np.round(a))
        if not whole.all():
            bad = int(np.flatnonzero(~whole.ravel())[0])
            raise ValueError(f"{name}[{bad}] = {a.ravel()[bad]} is not a whole number: indices "
                             "must be integers")
    elif a.dtype.kind not in "iub" and a.size:
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _check_finite(what: str, a: np.ndarray) -> None:
    """Named here: on the device a value that is not finite is only "evaluation failed"."""
    row = first_not_finite(a)
    if row is not None:
        raise ValueError(f"{what}[{row}] = {a[row].tolist()} is not finite: remove "
                         + ("that observation" if what == "observations" else "it or its observations")
                         + " or fix its values")


@dataclasses.dataclass
class BALProblem:
    """A bundle adjustment problem in BAL form.

    cameras (nc, 9) float64: ``[w(3) angle-axis, t(3), f, k1, k2]``; points (np, 3) float64;
    camera_index, point_index (no,) int64; observations (no, 2) float64 (image x, y, origin at the
    image centre, as BAL stores them).
    """
    cameras: np.ndarray
    points: np.ndarray
    camera_index: np.ndarray
    point_index: np.ndarray
    observations: np.ndarray
    name: str = "problem"
    # Parameters per camera and per point (what a checkpoint's tables are checked against), as
    # solvers.ba.observation_index.ObservationIndex says them for other block sizes.
    camera_size = 9
    point_size = 3

    def __post_init__(self):
        self._check_parameters(finite=False)    # their finiteness below, after the observations'
        self.camera_index = _indices(self.camera_index, "camera_index")
        self.point_index = _indices(self.point_index, "point_index")
        self.observations = np.ascontiguousarray(self.observations, dtype=np.float64)
        nc, npt, no = self.num_cameras, self.num_points, self.num_observations
        if self.observations.shape != (no, 2):
            raise ValueError(f"observations must be (num_observations, 2), got {self.observations.shape}")
        if self.camera_index.shape != (no,) or self.point_index.shape != (no,):
            raise ValueError("camera_index and point_index must be (num_observations,), got "
                             f"{self.camera_index.shape} and {self.point_index.shape}")
        if no and (self.camera_index.min() < 0 or self.camera_index.max() >= nc):
            raise ValueError(f"camera_index has values outside [0, {nc}): fix the indices or the cameras")
        if no and (self.point_index.min() < 0 or self.point_index.max() >= npt):
            raise ValueError(f"point_index has values outside [0, {npt}): fix the indices or the points")
        for what, a in (("observations", self.observations), ("cameras", self.cameras), ("points", self.points)):
            _check_finite(what, a)

    def _check_parameters(self, finite: bool = True):
        """The cameras and points as float64 (nc, 9) and (np, 3) arrays (of finite values)."""
        self.cameras = np.ascontiguousarray(self.cameras, dtype=np.float64)
        self.points = np.ascontiguousarray(self.points, dtype=np.float64)
        if self.cameras.ndim != 2 or self.cameras.shape[1] != 9:
            raise ValueError(f"cameras must be (num_cameras, 9), got {self.cameras.shape}")
        if self.points.ndim != 2 or self.points.shape[1] != 3:
            raise ValueError(f"points must be (num_points, 3), got {self.points.shape}")
        if finite:
            _check_finite("cameras", self.cameras)
            _check_finite("points", self.points)

    @property
    def num_cameras(self) -> int:
        return self.cameras.shape[0]

    @property
    def num_points(self) -> int:
        return self.points.shape[0]

    @property
    def num_observations(self) -> int:
        return self.observations.shape[0]

    @property
    def num_parameters(self) -> int:
        return 9 * self.num_cameras + 3 * self.num_points

    def copy(self) -> "BALProblem":
        return BALProblem(self.cameras.copy(), self.points.copy(), self.camera_index.copy(),
                          self.point_index.copy(), self.observations.copy(), self.name)

    def with_parameters(self, cameras, points) -> "BALProblem":
        """The same observations with other cameras and points (arrays are not copied). Only the
        new parameters are checked: the observations and indices were when ``self`` was made
        (checking them again took over a second at 116 million observations)."""
        new = copy.copy(self)           # no __init__: the observation arrays are shared as they are
        new.cameras, new.points = cameras, points
        new._check_parameters()
        if new.cameras.shape != self.cameras.shape or new.points.shape != self.points.shape:
            raise ValueError(f"with_parameters: cameras {new.cameras.shape} and points {new.points.shape} must "
                             f"have the problem's shapes {self.cameras.shape} and {self.points.shape}")
        return new

    def camera_centers(self) -> np.ndarray:
        """Camera centres in world coordinates, ``c = -R(w)^T t`` (nc, 3)."""
        from ..models.rotation import rotate
        return -rotate(-self.cameras[:, 0:3], self.cameras[:, 3:6])

    def __repr__(self):
        return (f"BALProblem({self.name!r}: {self.num_cameras} cameras, {self.num_points} points, "
                f"{self.num_observations} observations)")


def open_text(path, mode="rb", like=None):
    """Open ``path`` for reading or writing bytes, through bz2 or gzip when its name (or the name
    ``like``, for a temporary file) ends in .bz2 or .gz."""
    path = os.fspath(path)
    name = os.fspath(like) if like is not None else path
    if name.endswith(".bz2"):
        return bz2.open(path, mode)
    if name.endswith(".gz"):
        return gzip.open(path, mode)
    return open(path, mode)


def _chunks(stream, size) -> Iterator[bytes]:
    """Whole lines from ``stream``, about ``size`` bytes at a time (the last chunk may lack '\\n')."""
    rest = b""
    while True:
        block = stream.read(size)
        if not block:
            if rest:
                yield rest
            return
        block = rest + block
        cut = block.rfind(b"\n")
        if cut < 0:
            rest = block
            continue
        rest = block[cut + 1:]
        yield block[:cut + 1]


def _tokens_per_line(chunk: bytes) -> np.ndarray:
    """Number of whitespace-separated tokens on each line of ``chunk`` (a final line without '\\n'
    counts as a line)."""
    a = np.frombuffer(chunk, dtype=np.uint8)
    # Every byte <= 32 is treated as a separator (space, tab, CR, LF, VT, FF, NUL): the same set the
    # number parser skips, so the two agree on where tokens are.
    sep = a <= 32
    starts = np.flatnonzero(~sep & np.concatenate(([True], sep[:-1])))
    newlines = np.flatnonzero(a == 10)
    n_lines = newlines.size + (0 if chunk.endswith(b"\n") else 1)
    return np.bincount(np.searchsorted(newlines, starts), minlength=n_lines)[:n_lines]


def _first_bad_token(chunk: bytes) -> Tuple[int, bytes]:
    """(index, text) of the first token of ``chunk`` that is not a number; only used on errors."""
    for i, tok in enumerate(chunk.split()):
        try:
            float(tok)
        except ValueError:
            return i, tok
        # A token that Python reads but numpy's parser does not (e.g. '1_0'): report it too.
        try:
            np.fromstring(tok, sep=" ")
        except ValueError:
            return i, tok
    return -1, b""


def _scan(stream, path, chunk_bytes) -> Tuple[np.ndarray, np.ndarray]:
    """All values (float64) and the token count of every line, chunk by chunk (a progress bar
    on a terminal for a read of over a second: solvers.io.progress)."""
    counts, values, line0 = [], [], 0
    compressed = path.endswith((".bz2", ".gz"))
    with progress.bar(None if compressed else os.path.getsize(path), f"reading {os.path.basename(path)}") as bar:
        for chunk in _chunks(stream, chunk_bytes):
            _scan_chunk(chunk, path, counts, values, line0)
            line0 += counts[-1].size
            bar.update(len(chunk))
    if not counts:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return np.concatenate(values), np.concatenate(counts)


def _scan_chunk(chunk, path, counts, values, line0):
    """Append a chunk's values and its lines' token counts (line0: lines before the chunk)."""
    c = _tokens_per_line(chunk)
    try:
        v = np.fromstring(chunk, dtype=np.float64, sep=" ")
    except ValueError:
        v = None
    if v is None or v.size != c.sum():
        k, tok = _first_bad_token(chunk)
        line = line0 + int(np.searchsorted(np.cumsum(c), k, side="right")) + 1
        shown = tok.decode("utf-8", "replace")[:40]
        raise BALFormatError(path, line, f"{shown!r} is not a number")
    counts.append(c)
    values.append(v)


def read_bal(path, name: Optional[str] = None, chunk_bytes: int = CHUNK_BYTES) -> BALProblem:
    """Read a BAL file (``.txt``, ``.bz2`` or ``.gz``) into a :class:`BALProblem`.

    Args:
        path: the file; the suffix says whether it is compressed.
        name: the problem's name (default: the file's name without its suffixes).
        chunk_bytes: how much text is parsed at a time (memory against speed; the default suits
            files of any size).

    Returns:
        The problem: cameras ``(n, 9)``, points ``(m, 3)``, and per observation the camera and
        point index and the observed pixel.

    Raises:
        BALFormatError: (a ``ValueError``) with the line number, for a bad header, a short or
            extra line, missing or extra lines, a token that is not a number, an index out of
            range, or a NaN/Inf value.
        FileNotFoundError: there is no such file.
    """
    path = os.fspath(path)
    try:
        # Read (and decompressed) in a thread, ahead of the parser: solvers.io.read_ahead.
        with read_ahead.take(path) as f:
            values, counts = _scan(f, path, chunk_bytes)
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise BALFormatError(path, None, f"cannot read the file ({e}); is it a complete BAL file?") from e
    return _assemble(path, values, counts, name)


def _assemble(path, values, counts, name) -> BALProblem:
    if counts.size == 0 or counts.sum() == 0:
        raise BALFormatError(path, 1, "empty file: expected a header 'num_cameras num_points num_observations'")
    if counts[0] != 3:
        raise BALFormatError(path, 1, f"bad header: expected 3 integers 'num_cameras num_points "
                                      f"num_observations', found {counts[0]} values")
    header = values[:3]
    if not np.all(np.isfinite(header)) or np.any(header != np.floor(header)) or np.any(header < 0):
        raise BALFormatError(path, 1, f"bad header: expected 3 non-negative integers, found {header.tolist()}")
    nc, npt, no = (int(h) for h in header)
    if nc == 0 or npt == 0 or no == 0:
        raise BALFormatError(path, 1, f"bad header: a problem needs cameras, points and observations, "
                                      f"found {nc} {npt} {no}")
    n_params = 9 * nc + 3 * npt
    n_lines = 1 + no + n_params
    expected = np.empty(min(counts.size, n_lines), dtype=np.int64)
    expected[0] = 3
    expected[1:1 + no] = 4
    expected[1 + no:] = 1
    head = counts[:expected.size]
    bad = np.flatnonzero(head != expected)
    if bad.size:
        i = int(bad[0])
        what = ("an observation 'camera_index point_index x y' (4 values)" if i <= no
                else "one parameter value per line")
        raise BALFormatError(path, i + 1, f"expected {what}, found {head[i]} values")
    if counts.size < n_lines:
        got = counts.size
        section = (f"{got - 1} of {no} observation lines" if got <= no
                   else f"{got - 1 - no} of {n_params} parameter lines")
        raise BALFormatError(path, got + 1, f"file ends early: found {section} "
                                            f"(header says {nc} cameras, {npt} points, {no} observations)")
    extra = np.flatnonzero(counts[n_lines:])
    if extra.size:
        raise BALFormatError(path, n_lines + int(extra[0]) + 1,
                             f"unexpected extra data after the last of the {n_params} parameter lines")

    obs = values[3:3 + 4 * no].reshape(no, 4)
    params = values[3 + 4 * no:].copy()   # a copy: views would keep all of values alive
    line_of_obs = np.arange(2, 2 + no)
    for col, label, limit in ((0, "camera index", nc), (1, "point index", npt)):
        idx = obs[:, col]
        wrong = ~np.isfinite(idx) | (idx != np.floor(idx)) | (idx < 0) | (idx >= limit)
        if wrong.any():
            k = int(np.flatnonzero(wrong)[0])
            raise BALFormatError(path, int(line_of_obs[k]),
                                 f"{label} {obs[k, col]:g} is not an integer in [0, {limit})")
    nonfinite = ~np.isfinite(obs[:, 2:]).all(axis=1)
    if nonfinite.any():
        k = int(np.flatnonzero(nonfinite)[0])
        raise BALFormatError(path, int(line_of_obs[k]), f"non-finite observation {obs[k, 2:].tolist()}: "
                                                        "expected finite x, y")
    nonfinite = ~np.isfinite(params)
    if nonfinite.any():
        k = int(np.flatnonzero(nonfinite)[0])
        what = (f"camera {k // 9} parameter {k % 9}" if k < 9 * nc
                else f"point {(k - 9 * nc) // 3} coordinate {(k - 9 * nc) % 3}")
        raise BALFormatError(path, 2 + no + k, f"non-finite value {params[k]} for {what}: expected a finite number")
    if name is None:
        name = problem_name(path)
    return BALProblem(cameras=params[:9 * nc].reshape(nc, 9), points=params[9 * nc:].reshape(npt, 3),
                      camera_index=obs[:, 0].astype(np.int64), point_index=obs[:, 1].astype(np.int64),
                      observations=obs[:, 2:].copy(), name=name)


def problem_name(path) -> str:
    """A BAL file's problem name: its file name without ``.bz2``/``.gz`` and ``.txt``."""
    base = os.path.basename(os.fspath(path))
    for ext in (".bz2", ".gz", ".txt"):
        if base.endswith(ext):
            base = base[:-len(ext)]
    return base


def write_bal(problem: BALProblem, path) -> None:
    """Write ``problem`` as a BAL file (``.bz2``/``.gz`` compressed when the name says so).

    Values are written with 17 significant digits (``%.17g``), so reading the file back gives the
    same float64 values bit for bit. The problem is checked first (a :class:`BALProblem` is
    checked when made: shapes, index ranges, finite values), and the file is written beside
    ``path`` and renamed into place (:mod:`solvers.io.atomic`): ``path`` is the old file or the new
    one, never a part, whatever fails or kills the writer.
    """
    from ..io.atomic import replacing
    p = problem
    if not isinstance(p, BALProblem):
        raise TypeError(f"write_bal takes a BALProblem, not {type(p).__name__}")
    p.__post_init__()           # arrays may have been changed in place since it was made
    obs = np.empty(p.num_observations, dtype=[("c", np.int64), ("p", np.int64), ("x", np.float64), ("y", np.float64)])
    obs["c"], obs["p"] = p.camera_index, p.point_index
    obs["x"], obs["y"] = p.observations[:, 0], p.observations[:, 1]
    with replacing(path) as raw:
        with _compressor(raw, path) as f:
            f.write(f"{p.num_cameras} {p.num_points} {p.num_observations}\n".encode())
            np.savetxt(f, obs, fmt=["%d", "%d", "%.17g", "%.17g"], delimiter=" ")
            np.savetxt(f, np.concatenate([p.cameras.ravel(), p.points.ravel()]), fmt="%.17g")


def _compressor(raw, name):
    """A writer over the open file ``raw``, compressing as ``name``'s extension says; closing it
    leaves ``raw`` open (the atomic writer closes and renames it)."""
    name = os.fspath(name)
    if name.endswith(".bz2"):
        return bz2.BZ2File(raw, "wb")
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="wb")
    return contextlib.nullcontext(raw)
