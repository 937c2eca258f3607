"""Checkpoints of a solve: the best state found so far, written atomically.

Two formats: a bundle adjustment's (below; ``bundle_adjust`` and the bundle-adjustment core of
``solvers.solve``) and a general problem's (``format`` ``"pyclad-problem-checkpoint"``: every
parameter group's whole table as ``group:NAME``, the same scalars and strings, and a fingerprint
of the problem's structure; :class:`ProblemCheckpoint`). The bundle adjustment's:

A checkpoint is a numpy ``.npz`` archive (plain arrays, nothing pickled) holding

- ``format`` (``"pyclad-bal-checkpoint"``) and ``version`` (:data:`FORMAT_VERSION`);
- ``cameras`` (num_cameras, 9) and ``points`` (num_points, 3): the best parameters found;
- ``iteration``: the iterations done when it was written, counted from the first solve (a solve
  resumed from a checkpoint of iteration k writes k + its own iterations);
- ``cost``: the cost of those parameters (with the loss of the solve that wrote it);
- ``trust_region_radius``: the radius the next step would have used;
- ``termination_type``: empty while the solve runs, its termination type once it has ended;
- ``num_cameras``, ``num_points``, ``num_observations``, ``fingerprint`` (SHA-256 of the
  observations' camera and point indices and observed values) and ``problem_name``: what
  :meth:`Checkpoint.check_problem` compares, so that a checkpoint of another problem is refused.

Writing goes through :mod:`solvers.io.atomic`: a temporary file in the checkpoint's own directory
(``.NAME.PID.RANDOM.pyclad-tmp``, never the checkpoint's name), flushed and fsync'ed, then renamed
over the checkpoint (``os.replace``, atomic on POSIX and Windows); the directory is fsync'ed after
the rename where the platform allows. At any moment the checkpoint's path therefore holds either
the previous complete checkpoint or the new complete one; a write that fails or is interrupted
removes its temporary file and leaves the previous checkpoint as it was, and a temporary that a
killed process left behind is removed by the next write.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import warnings
import zipfile
from typing import Optional

import numpy as np

from ..io.atomic import replacing

FORMAT = "pyclad-bal-checkpoint"
FORMAT_VERSION = 1

_SCALARS = ("version", "iteration", "cost", "trust_region_radius", "num_cameras", "num_points",
            "num_observations")
_STRINGS = ("format", "termination_type", "fingerprint", "problem_name")
_KEYS = _SCALARS + _STRINGS + ("cameras", "points")


class CheckpointError(ValueError):
    """A file that is not a usable checkpoint, or a checkpoint of another problem."""


def problem_fingerprint(problem) -> str:
    """SHA-256 (hex) of a BAL problem's observations: their camera and point indices and their
    observed values, in the file's order. The parameters are left out: they are what a solve
    changes."""
    h = hashlib.sha256(FORMAT.encode())
    h.update(np.array([problem.num_cameras, problem.num_points, problem.num_observations], "<i8").tobytes())
    # Fixed dtypes and byte order, so the same problem hashes the same on every machine.
    for a, dtype in ((problem.camera_index, "<i8"), (problem.point_index, "<i8"), (problem.observations, "<f8")):
        h.update(np.ascontiguousarray(a, dtype=dtype).tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The contents of a bundle adjustment's checkpoint file (see the module docstring).

    :func:`load_checkpoint` returns one; :func:`solvers.bundle_adjust`'s ``checkpoint=`` writes
    them, and its ``resume=`` takes one (or its path).

    Attributes:
        cameras: ``(num_cameras, C)`` float64, the best camera parameters found (C = 9 for
            BAL's cameras).
        points: ``(num_points, P)`` float64, the best point parameters found (P = 3 for BAL's
            points).
        iteration: the iterations done when it was written, counted from the first solve (a
            solve resumed from a checkpoint of iteration k writes k + its own iterations).
        cost: the cost of those parameters, with the loss of the solve that wrote it.
        trust_region_radius: the radius the next step would have used (positive).
        num_cameras: the problem's number of cameras.
        num_points: the problem's number of points.
        num_observations: the problem's number of observations.
        fingerprint: SHA-256 (hex) of the problem's observations: their camera and point
            indices and observed values (``problem_fingerprint``).
        termination_type: empty while the solve runs, its termination type once it has ended.
            Default ``""``.
        problem_name: the name of the problem it was written for. Default ``""``.
        path: where it was read from; ``""`` (the default) for one not read from a file.

    The problem's sizes and ``fingerprint`` are what :meth:`check_problem` compares, so that a
    checkpoint of another problem is refused.
    """
    cameras: np.ndarray
    points: np.ndarray
    iteration: int
    cost: float
    trust_region_radius: float
    num_cameras: int
    num_points: int
    num_observations: int
    fingerprint: str
    termination_type: str = ""
    problem_name: str = ""
    path: str = ""

    @property
    def x(self) -> np.ndarray:
        """The parameters as the minimizer's state vector (cameras then points)."""
        return np.concatenate([self.cameras.ravel(), self.points.ravel()])

    @property
    def finished(self) -> bool:
        """Whether the solve that wrote it had ended (rather than being stopped or killed mid-way)."""
        return bool(self.termination_type)

    def check_problem(self, problem) -> None:
        """Raise :class:`CheckpointError` unless this checkpoint was written for ``problem``."""
        where = f"checkpoint {self.path!r}" if self.path else "the checkpoint"
        if hasattr(problem, "groups"):
            raise CheckpointError(f"{where} is a bundle adjustment's ({self.problem_name!r}); this "
                                  "problem runs the general core: resume from a checkpoint of this problem")
        widths = (problem.camera_size, problem.point_size)
        if (self.cameras.shape[1], self.points.shape[1]) != widths:
            raise CheckpointError(f"{where} holds cameras of {self.cameras.shape[1]} and points of "
                                  f"{self.points.shape[1]} parameters; this problem's have {widths[0]} and "
                                  f"{widths[1]}: resume from a checkpoint of this problem")
        mine = (self.num_cameras, self.num_points, self.num_observations)
        theirs = (problem.num_cameras, problem.num_points, problem.num_observations)
        if mine != theirs:
            raise CheckpointError(
                f"{where} was written for a problem with {mine[0]} cameras, {mine[1]} points and "
                f"{mine[2]} observations ({self.problem_name!r}); this problem ({problem.name!r}) has "
                f"{theirs[0]}, {theirs[1]} and {theirs[2]}: resume from a checkpoint of this problem")
        if self.fingerprint != problem_fingerprint(problem):
            raise CheckpointError(
                f"{where} was written for another problem ({self.problem_name!r}) of the same size: "
                f"the observations of {problem.name!r} differ from the ones it was written for; "
                "resume from a checkpoint of this problem")


def _write_npz(f, arrays: dict) -> None:
    """The archive itself (apart, so the tests can make a write fail half-way)."""
    np.savez(f, **arrays)


def save_checkpoint(path, checkpoint) -> None:
    """Write ``checkpoint`` (a :class:`Checkpoint` or :class:`ProblemCheckpoint`) to ``path``
    atomically (see the module docstring)."""
    if isinstance(checkpoint, ProblemCheckpoint):
        _save_atomic(path, checkpoint.arrays())
        return
    arrays = {"format": np.array(FORMAT), "version": np.array(FORMAT_VERSION, np.int64),
              "cameras": np.asarray(checkpoint.cameras, np.float64).reshape(checkpoint.num_cameras, -1),
              "points": np.asarray(checkpoint.points, np.float64).reshape(checkpoint.num_points, -1),
              "iteration": np.array(checkpoint.iteration, np.int64),
              "cost": np.array(checkpoint.cost, np.float64),
              "trust_region_radius": np.array(checkpoint.trust_region_radius, np.float64),
              "num_cameras": np.array(checkpoint.num_cameras, np.int64),
              "num_points": np.array(checkpoint.num_points, np.int64),
              "num_observations": np.array(checkpoint.num_observations, np.int64),
              "fingerprint": np.array(checkpoint.fingerprint),
              "termination_type": np.array(checkpoint.termination_type),
              "problem_name": np.array(checkpoint.problem_name)}
    _save_atomic(path, arrays)


def _save_atomic(path, arrays: dict) -> None:
    # solvers.io.atomic: a temporary beside the checkpoint, fsync'ed and renamed over it; a
    # temporary a killed writer left is removed by the next write.
    with replacing(path) as f:
        _write_npz(f, arrays)


def load_checkpoint(path) -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint` (or a solve's ``checkpoint=``).

    Raises FileNotFoundError when ``path`` does not exist and :class:`CheckpointError` when it is
    not a checkpoint, is damaged, or has a newer format than this version reads."""
    path = os.fspath(path)
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{path!r} is not a checkpoint (a .npy array, not an .npz archive)")
        with z:
            missing = [k for k in _KEYS if k not in z.files]
            if "format" in z.files and str(z["format"]) == PROBLEM_FORMAT:
                return ProblemCheckpoint.from_npz(z, path)
            if "format" not in z.files or str(z["format"]) != FORMAT:
                raise CheckpointError(f"{path!r} is not a pyclad checkpoint")
            version = int(z["version"]) if "version" in z.files else -1
            if version > FORMAT_VERSION:
                raise CheckpointError(f"{path!r} has checkpoint format {version}; this version of pyclad "
                                      f"reads format {FORMAT_VERSION} and older: upgrade pyclad to resume it")
            if missing:
                raise CheckpointError(f"{path!r} is a damaged checkpoint: it lacks {missing}")
            d = {k: z[k] for k in _KEYS}
    except (CheckpointError, FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except KeyError as e:               # a general checkpoint without one of its fields
        raise CheckpointError(f"{path!r} is a damaged checkpoint: it lacks {e}") from e
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:     # truncated, garbage, pickled
        raise CheckpointError(f"{path!r} is not a readable checkpoint: {e}") from e
    ck = Checkpoint(cameras=np.array(d["cameras"], np.float64), points=np.array(d["points"], np.float64),
                    iteration=int(d["iteration"]), cost=float(d["cost"]),
                    trust_region_radius=float(d["trust_region_radius"]),
                    num_cameras=int(d["num_cameras"]), num_points=int(d["num_points"]),
                    num_observations=int(d["num_observations"]), fingerprint=str(d["fingerprint"]),
                    termination_type=str(d["termination_type"]), problem_name=str(d["problem_name"]),
                    path=path)
    if ck.cameras.ndim != 2 or ck.points.ndim != 2 or ck.cameras.shape[0] != ck.num_cameras \
            or ck.points.shape[0] != ck.num_points:
        raise CheckpointError(f"{path!r} is a damaged checkpoint: cameras {ck.cameras.shape} and points "
                              f"{ck.points.shape} for {ck.num_cameras} cameras and {ck.num_points} points")
    if not (np.all(np.isfinite(ck.cameras)) and np.all(np.isfinite(ck.points))):
        raise CheckpointError(f"{path!r} is a damaged checkpoint: its parameters are not all finite")
    if not (np.isfinite(ck.trust_region_radius) and ck.trust_region_radius > 0):
        raise CheckpointError(f"{path!r} is a damaged checkpoint: trust region radius {ck.trust_region_radius}")
    return ck


PROBLEM_FORMAT = "pyclad-problem-checkpoint"
_PROBLEM_SCALARS = ("version", "iteration", "cost", "trust_region_radius")
_PROBLEM_STRINGS = ("format", "termination_type", "fingerprint", "problem_name")


def structure_fingerprint(problem) -> str:
    """SHA-256 (hex) of a :class:`solvers.Problem`'s structure: its groups (names, shapes, what
    is constant) and residual kinds (names, groups, the rows each block uses, its data). The
    parameter values are left out: they are what a solve changes."""
    h = hashlib.sha256(PROBLEM_FORMAT.encode())
    for name, g in problem.groups.items():
        h.update(f"group {name} {g.values.shape}".encode())
        for mask in (g.constant_rows, g.constant_columns, g.constant_entries):
            h.update(b"-" if mask is None else np.ascontiguousarray(mask, np.uint8).tobytes())
    for r in problem.residuals:
        h.update(f"kind {r.name} {[g.name for g in r.groups]}".encode())
        for c in r.columns:
            h.update(np.ascontiguousarray(c, "<i8").tobytes())
        h.update(b"-" if r.data is None else np.ascontiguousarray(r.data, "<f8").tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class ProblemCheckpoint:
    """A general problem's checkpoint (see the module docstring): every group's table at the
    best state, by name."""
    tables: dict
    iteration: int
    cost: float
    trust_region_radius: float
    fingerprint: str
    termination_type: str = ""
    problem_name: str = ""
    path: str = ""

    @property
    def finished(self) -> bool:
        return bool(self.termination_type)

    def arrays(self) -> dict:
        out = {"format": np.array(PROBLEM_FORMAT), "version": np.array(FORMAT_VERSION, np.int64),
               "iteration": np.array(self.iteration, np.int64), "cost": np.array(self.cost, np.float64),
               "trust_region_radius": np.array(self.trust_region_radius, np.float64),
               "fingerprint": np.array(self.fingerprint), "termination_type": np.array(self.termination_type),
               "problem_name": np.array(self.problem_name)}
        out.update({f"group:{k}": np.asarray(v, np.float64) for k, v in self.tables.items()})
        return out

    @classmethod
    def from_npz(cls, z, path: str) -> "ProblemCheckpoint":
        version = int(z["version"])
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{path!r} has checkpoint format {version}; this version of pyclad "
                                  f"reads format {FORMAT_VERSION} and older: upgrade pyclad to resume it")
        tables = {k[len("group:"):]: np.array(z[k], np.float64) for k in z.files if k.startswith("group:")}
        ck = cls(tables=tables, iteration=int(z["iteration"]), cost=float(z["cost"]),
                 trust_region_radius=float(z["trust_region_radius"]), fingerprint=str(z["fingerprint"]),
                 termination_type=str(z["termination_type"]), problem_name=str(z["problem_name"]), path=path)
        if not tables or not all(np.all(np.isfinite(t)) for t in tables.values()):
            raise CheckpointError(f"{path!r} is a damaged checkpoint: its parameters are missing or not all finite")
        if not (np.isfinite(ck.trust_region_radius) and ck.trust_region_radius > 0):
            raise CheckpointError(f"{path!r} is a damaged checkpoint: trust region radius {ck.trust_region_radius}")
        return ck

    def check_problem(self, problem) -> None:
        """Raise :class:`CheckpointError` unless this checkpoint was written for ``problem`` (a
        :class:`solvers.Problem` of the same structure)."""
        where = f"checkpoint {self.path!r}" if self.path else "the checkpoint"
        if not hasattr(problem, "groups"):
            raise CheckpointError(f"{where} is a general problem's ({self.problem_name!r}); this is a "
                                  "bundle adjustment: resume from a checkpoint of this problem")
        shapes = {k: g.values.shape for k, g in problem.groups.items()}
        mine = {k: t.shape for k, t in self.tables.items()}
        if mine != shapes:
            raise CheckpointError(f"{where} was written for groups {mine}; this problem "
                                  f"({problem.name!r}) has {shapes}: resume from a checkpoint of this problem")
        if self.fingerprint != structure_fingerprint(problem):
            raise CheckpointError(
                f"{where} was written for another problem ({self.problem_name!r}) with groups of the same "
                f"shapes: the residuals or constant parameters of {problem.name!r} differ; resume from "
                "a checkpoint of this problem")

    def x(self, layout, problem) -> np.ndarray:
        """The state vector of ``layout`` (solvers.general.problem_evaluator.Layout) at these tables;
        constant rows and entries keep ``problem``'s values."""
        return layout.x_from_tables({k: np.where(g.free_mask(), self.tables[k], g.values)
                                     for k, g in problem.groups.items()})


class CheckpointWriter:
    """What a solve uses: writes the best state to ``path`` every ``every`` iterations and at the
    end. ``iteration_offset`` is the iteration of the checkpoint the solve was resumed from.

    The first write of a solve raises on failure (a path that cannot be written is better known
    at once); a later failure warns (RuntimeWarning) and the solve goes on, the last checkpoint
    written staying as it was: the solve's progress is worth more than one missed checkpoint."""

    def __init__(self, path, every: int, problem, iteration_offset: int = 0, layout=None):
        self.path, self.every = os.fspath(path), int(every)
        self.problem_name = problem.name
        # A general problem (solvers.Problem, with its Layout) or a bundle adjustment's observations.
        self.general = (problem, layout) if layout is not None else None
        if self.general is None:
            self.shape = (problem.num_cameras, problem.num_points, problem.num_observations)
            self.camera_size = problem.camera_size
            self.fingerprint = problem_fingerprint(problem)
        else:
            self.fingerprint = structure_fingerprint(problem)
        self.iteration_offset = int(iteration_offset)
        self.num_written = 0
        self.last_iteration: Optional[int] = None     # of the last checkpoint written (with the offset)
        self.time = 0.0

    def due(self, iteration: int) -> bool:
        return iteration % self.every == 0

    def write(self, x, iteration: int, cost: float, radius: float, termination_type: str = "") -> bool:
        """Write the state ``x`` (cameras then points) of ``iteration``; whether it was written."""
        t0 = time.perf_counter()
        x = np.asarray(x, np.float64)
        if self.general is not None:
            problem, layout = self.general
            ck = ProblemCheckpoint(
                tables={name: layout.values(problem, x, name) for name in problem.groups},
                iteration=self.iteration_offset + int(iteration), cost=float(cost),
                trust_region_radius=float(radius), fingerprint=self.fingerprint,
                termination_type=termination_type, problem_name=self.problem_name)
        else:
            nc, npt, nobs = self.shape
            C = self.camera_size
            ck = Checkpoint(cameras=x[:C * nc].reshape(nc, C), points=x[C * nc:].reshape(npt, -1),
                            iteration=self.iteration_offset + int(iteration), cost=float(cost),
                            trust_region_radius=float(radius), num_cameras=nc, num_points=npt,
                            num_observations=nobs, fingerprint=self.fingerprint,
                            termination_type=termination_type, problem_name=self.problem_name)
        try:
            save_checkpoint(self.path, ck)
        except OSError as e:
            if self.num_written == 0:
                raise
            # No iteration number in the message: the same failure repeated warns once.
            warnings.warn(f"checkpoint={self.path!r} could not be written ({e}); the solve goes on and "
                          "the last checkpoint written is left as it was", RuntimeWarning, stacklevel=2)
            return False
        finally:
            self.time += time.perf_counter() - t0
        self.num_written += 1
        self.last_iteration = ck.iteration
        return True


def check_checkpoint_options(checkpoint, checkpoint_every) -> None:
    """Refuse at once (rather than after the first iteration) a ``checkpoint_every`` that is not
    a whole number >= 1 and a ``checkpoint`` path that could never be written."""
    every = checkpoint_every
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise ValueError(f"checkpoint_every must be an integer >= 1 (write the best state every N "
                         f"iterations), got {every!r}")
    if checkpoint is None:
        return
    try:
        path = os.fspath(checkpoint)
    except TypeError:
        raise TypeError(f"checkpoint must be a file path (str or os.PathLike) or None, "
                        f"got {type(checkpoint).__name__}") from None
    if not isinstance(path, str) or not path:
        raise ValueError(f"checkpoint must be a non-empty file path, got {checkpoint!r}")
    if os.path.isdir(path):
        raise ValueError(f"checkpoint={path!r} is a directory; give a file path in it, "
                         f"e.g. {os.path.join(path, 'checkpoint.npz')!r}")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"checkpoint={path!r}: the directory {directory!r} does not exist; "
                         "create it or choose another path")


def cli_options(checkpoint, checkpoint_every) -> dict:
    """The solve's keyword options for the command lines' ``--checkpoint PATH`` and
    ``--checkpoint-every N``, checked; ValueError (or TypeError) saying what is wrong."""
    if checkpoint_every is not None and not checkpoint:
        raise ValueError("--checkpoint-every needs --checkpoint PATH")
    if not checkpoint:
        return {}
    options = {"checkpoint": checkpoint, "checkpoint_every": checkpoint_every or 1}
    check_checkpoint_options(**options)
    return options
