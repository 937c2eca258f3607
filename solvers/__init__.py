"""Nonlinear least squares with Levenberg-Marquardt in Ceres' semantics, Jacobians from pyclad.

General problems (:mod:`solvers.general.problem`, :mod:`solvers.solve`): named parameter groups, residual
kinds from pyclad-traceable functions, constant rows and entries, the Schur complement of any
eliminated group::

    import solvers
    prob = solvers.Problem()
    prob.add_parameter_block("poses", poses0); prob.add_parameter_block("points", points0)
    prob.add_residual_block(fn, ["poses", "points"], index=(img, pt), data=xy, loss="huber")
    result = solvers.solve(prob, linear_solver="sparse_schur", eliminate="points")

BAL bundle adjustment, a layer over them (``solvers.models.snavely``; the iterations on the OpenCL
device where they can be)::

    problem = solvers.read_bal("problem-49-7776-pre.txt.bz2")      # or solvers.synthetic_problem(...)
    result = solvers.bundle_adjust(problem, linear_solver="sparse_schur", verbose=True)
    print(result.full_report())
    solvers.write_bal(result.problem, "optimised.txt")

COLMAP reconstructions: :mod:`solvers.colmap` (``problem_from_reconstruction``,
``update_reconstruction``, ``python -m solvers.colmap``); camera models: :mod:`solvers.models.cameras`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from .bal import BALFormatError, BALProblem, read_bal, write_bal
from .loop.checkpoint import Checkpoint, CheckpointError, ProblemCheckpoint, load_checkpoint
from .loop.lm import Options, StopFlag
from .models.loss import LOSSES, Loss
from .linalg.linear_solver import LINEAR_SOLVERS
from .general.problem import ParameterBlock, Problem, ResidualBlock
from .split.rank_consistency import RankMismatchError
from .solve import SolveResult, solve
from .loop.summary import LOG_HEADER, IterationSummary
from .bal.synthetic import synthetic_problem

__all__ = ["Problem", "ParameterBlock", "ResidualBlock", "solve", "SolveResult",
           "bundle_adjust", "BundleAdjustResult", "Options", "Loss", "LOSSES", "LINEAR_SOLVERS",
           "BALProblem", "BALFormatError", "read_bal", "write_bal", "synthetic_problem",
           "IterationSummary", "StopFlag", "LOG_HEADER", "Checkpoint", "CheckpointError", "ProblemCheckpoint", "load_checkpoint",
           "DeviceMemoryError", "RankMismatchError"]


def __getattr__(name):
    # clkernels' class, the one the solvers raise, imported when asked for: ``import solvers``
    # does not load the OpenCL layer.
    if name == "DeviceMemoryError":
        from clkernels.memory import DeviceMemoryError
        return DeviceMemoryError
    raise AttributeError(f"module 'solvers' has no attribute {name!r}")


@dataclasses.dataclass
class BundleAdjustResult(SolveResult):
    """The outcome of :func:`bundle_adjust`: a :class:`solvers.SolveResult` (``parameters`` holds
    ``"cameras"`` and ``"points"``) with the BAL view of it.

    ``cameras`` / ``points`` are the optimised parameters (the best state found, never NaN) and
    ``problem`` the BAL problem holding them; ``history`` the per-iteration records (Ceres' log
    columns); ``times`` splits the wall time into ``jacobian_evaluation`` (residuals and
    Jacobians), ``residual_evaluation`` (cost only, at candidate points), ``linear_solver`` and
    ``other``, with ``preprocessor``, ``minimizer`` and ``total`` (and ``checkpoint``, the time
    spent writing checkpoints, when there were any). ``termination_type`` is one of CONVERGENCE,
    NO_CONVERGENCE, FAILURE, USER_SUCCESS (Ctrl-C). A solve resumed from a checkpoint has its
    path in ``resumed_from`` and its iteration in ``resumed_iteration``; its ``history`` and
    ``initial_cost`` are this solve's own. With ``checkpoint=``, ``checkpoint_iteration`` is the
    iteration of the last checkpoint written (counted from the first solve; None if none could be
    written). ``state`` is "device" when every iteration's vectors and arithmetic stayed on the
    OpenCL device (solvers.ba.lm_device), "host" for the reference path; ``transfers`` the bytes
    that crossed to and from it. ``linear_solver_detail`` (sparse_schur): the reduced camera
    matrix's size and where it was factorised.
    """
    cameras: Optional[np.ndarray] = None
    points: Optional[np.ndarray] = None
    problem: Optional[BALProblem] = None
    num_cameras: int = 0
    num_points: int = 0
    num_observations: int = 0


def bundle_adjust(problem: BALProblem, linear_solver: str = "sparse_schur", loss=None, loss_scale: float = 1.0,
                  max_iterations: int = 50, function_tolerance: float = 1e-6, gradient_tolerance: float = 1e-10,
                  parameter_tolerance: float = 1e-8, model=None, dtype=np.float64, device=None,
                  backend: Optional[str] = None, callback: Optional[Callable] = None, verbose: bool = False,
                  stop: Optional[StopFlag] = None, handle_sigint: bool = True, out=None,
                  resume=None, **options) -> BundleAdjustResult:
    """Minimise the BAL reprojection error of ``problem`` with Levenberg-Marquardt (Ceres' semantics).

    - ``linear_solver``: a Schur method of :data:`solvers.LINEAR_SOLVERS` (``"sparse_schur"``,
      ``"iterative_schur"``, ...; :mod:`solvers.linalg.linear_solver` describes each).
    - ``loss``: None/"trivial", "huber", "cauchy" or "soft_l1" (or a :class:`Loss`), with ``loss_scale``.
    - ``max_iterations``, ``function_tolerance``, ``gradient_tolerance``,
      ``parameter_tolerance``: Ceres' stopping rules with Ceres' defaults, as in :func:`solvers.solve`.
    - ``model``: the camera model; a class taking ``(cam_idx, pt_idx, observations, dtype=, device=)``
      (default: ``solvers.models.snavely.SnavelyModel``, built on pyclad) or an instance for this problem's
      observations with ``residuals`` and ``residuals_and_jacobians``.
    - ``dtype`` / ``device`` / ``backend``: passed to the model (float32 for devices without fp64).
    - ``callback(iteration_summary)`` runs after every iteration; ``verbose`` prints Ceres' log to
      ``out`` (default stdout) as it goes. An exception the callback raises ends the solve
      (``USER_FAILURE``) and reaches the caller with the result on it (``exc.result``, the best
      state found); a checkpoint then holds the last completed iteration.
    - Ctrl-C (main thread, ``handle_sigint``) or ``stop.set()`` stops after the current iteration.
    - ``checkpoint=PATH`` (with ``checkpoint_every=N``, default 1) writes the best state found to
      PATH (a numpy ``.npz``, :mod:`solvers.loop.checkpoint`) after iteration 0, every N iterations and
      at the end (Ctrl-C and FAILURE included), atomically (a temporary file in the same directory,
      fsync'ed, then renamed over PATH): PATH always holds a complete checkpoint, and a killed
      solve loses at most N iterations. A second Ctrl-C interrupts at once and leaves the last one.
      The first write raises if it fails; a later failure warns and the solve goes on.
    - ``resume=PATH`` (or a :class:`solvers.Checkpoint`) starts from a checkpoint's parameters
      instead of ``problem``'s; it raises :class:`solvers.CheckpointError` if the checkpoint is
      for another problem (sizes and a fingerprint of the observations are compared). The
      checkpoint's trust-region radius is restored as ``initial_trust_region_radius`` unless that
      option is given; Ceres' other per-solve state is not: the Jacobi scaling is computed anew at
      the checkpoint's parameters and the radius' decrease factor starts at 2, so the resumed
      iterations follow the uninterrupted ones closely but not digit for digit. The resumed solve
      is a new solve: its log starts at iteration 0 and ``max_iterations`` counts its own
      iterations; its checkpoints count on from the checkpoint's iteration. Resuming from and
      checkpointing to the same PATH is the way to restart a solve that may be killed again.
    - Other keyword options: fields of :class:`solvers.Options` (``eta``, ``initial_trust_region_radius``,
      ``jacobi_scaling``, ``max_linear_solver_iterations``, ``device_resident``, ...).
    - Where it can (a pyclad model in float64, a device with fp64) every iteration stays on the
      OpenCL device (``result.state == "device"``, :mod:`solvers.ba.lm_device`); ``device_resident=False``
      keeps the host reference path, ``True`` requires the device. For ``sparse_schur`` the reduced
      camera matrix is factorised on the device or on the host, whichever is faster
      (:mod:`solvers.linalg.sparse_schur_device`); ``result.linear_solver_detail`` (and the verbose log)
      says which.
    """
    if not isinstance(problem, BALProblem):
        raise TypeError(f"problem must be a solvers.BALProblem (read_bal or synthetic_problem), got {type(problem).__name__}")
    if resume is not None:
        ck = resume if isinstance(resume, (Checkpoint, ProblemCheckpoint)) else load_checkpoint(resume)
        ck.check_problem(problem)
        resume = ck
    # The BAL problem as a solvers.Problem: cameras, points and the Snavely residual; solve runs
    # it on the bundle-adjustment core with the camera model (pyclad's Snavely by default).
    prob = Problem(dtype=dtype, device=device, backend=backend or "auto", name=problem.name)
    # Shared, not copied: the Problem lives only for this call, and the BAL problem's arrays
    # are only read (the solution comes back in new arrays).
    prob.add_parameter_block("cameras", problem.cameras, copy=False)
    prob.add_parameter_block("points", problem.points, copy=False)
    from .models.snavely import snavely_residual
    prob.add_residual_block(snavely_residual, ["cameras", "points"],
                            index=(problem.camera_index, problem.point_index), data=problem.observations,
                            loss=loss, loss_scale=loss_scale, name="reprojection", copy=False,
                            index_checked=True)      # BALProblem checks its indices when made
    if model is None:
        from .ba.evaluator import default_model_class
        model = default_model_class()
    try:
        r = solve(prob, linear_solver=linear_solver, eliminate="points", max_iterations=max_iterations,
                  function_tolerance=function_tolerance, gradient_tolerance=gradient_tolerance,
                  parameter_tolerance=parameter_tolerance, callback=callback, verbose=verbose, stop=stop,
                  handle_sigint=handle_sigint, out=out, model=model, resume=resume, **options)
    except Exception as exc:        # a callback's exception: its .result as this function's result
        if not isinstance(getattr(exc, "result", None), SolveResult):
            raise
        exc.result = _bundle_adjust_result(exc.result, problem)
        raise
    return _bundle_adjust_result(r, problem)


def _bundle_adjust_result(r: SolveResult, problem: BALProblem) -> BundleAdjustResult:
    cameras, points = r.parameters["cameras"], r.parameters["points"]
    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(SolveResult)}
    return BundleAdjustResult(**fields, cameras=cameras, points=points,
                              problem=problem.with_parameters(cameras.copy(), points.copy()),
                              num_cameras=problem.num_cameras, num_points=problem.num_points,
                              num_observations=problem.num_observations)
