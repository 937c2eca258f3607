"""COLMAP reconstructions: read, check, bundle-adjust and write the sparse models that COLMAP 4
(and pycolmap 4.2) write, text or binary, with rigs and frames or the classic three files.

    from solvers import colmap
    rec = colmap.read_model("sparse/0")                  # a Reconstruction of numpy arrays
    prob = colmap.problem_from_reconstruction(rec)       # a solvers.Problem
    result = solvers.solve(prob)
    colmap.update_reconstruction(rec, result)            # poses, intrinsics, points, errors
    colmap.write_model(rec, "sparse/refined", binary=True)

A ``pycolmap.Reconstruction`` needs no file: ``colmap.bundle_adjust(rec)`` solves it and updates
it in place; ``from_pycolmap`` and ``to_pycolmap`` convert.

The names live in five modules, gathered here:

- :mod:`solvers.colmap.model`: the camera models' table, :class:`Reconstruction` and
  :func:`validate`, the checks that reading and writing share;
- :mod:`solvers.colmap.io`: :func:`read_model` and :func:`write_model` (all or nothing);
- :mod:`solvers.colmap.problem`: a reconstruction as a problem, and the solution written back;
- :mod:`solvers.colmap.in_memory`: pycolmap reconstructions (pycolmap imported there only);
- :mod:`solvers.colmap.cli`: ``python -m solvers.colmap MODEL --out OUT``.
"""
from .io import ColmapFormatError, read_model, write_model
from .model import CAMERA_MODELS, ColmapModelError, Reconstruction, validate
from .problem import point_errors, problem_from_reconstruction, update_reconstruction
from .in_memory import bundle_adjust, from_pycolmap, to_pycolmap
from .priors import PosePriors, read_pose_priors

__all__ = ["CAMERA_MODELS", "ColmapFormatError", "ColmapModelError", "Reconstruction", "read_model",
           "write_model", "validate", "problem_from_reconstruction", "update_reconstruction", "point_errors",
           "bundle_adjust", "from_pycolmap", "to_pycolmap", "PosePriors", "read_pose_priors"]
