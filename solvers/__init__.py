"""Bundle adjustment of BAL problems: Levenberg-Marquardt with Ceres' semantics, Jacobians from
pyclad (``solvers.snavely``), Schur-complement linear algebra with numpy and scipy.sparse.

    import solvers
    problem = solvers.read_bal("problem-49-7776-pre.txt.bz2")      # or solvers.synthetic_problem(...)
    result = solvers.bundle_adjust(problem, linear_solver="sparse_schur", verbose=True)
    print(result.full_report())
    solvers.write_bal(result.problem, "optimised.txt")
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, List, Optional

import numpy as np

from .bal import BALFormatError, BALProblem, read_bal, write_bal
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint
from .evaluator import Evaluator
from .lm import Options, StopFlag, minimize
from .loss import LOSSES, Loss
from .linear_solver import LINEAR_SOLVERS
from .summary import LOG_HEADER, IterationSummary, full_report
from .synthetic import synthetic_problem

__all__ = ["bundle_adjust", "BundleAdjustResult", "Options", "Loss", "LOSSES", "LINEAR_SOLVERS",
           "BALProblem", "BALFormatError", "read_bal", "write_bal", "synthetic_problem",
           "IterationSummary", "StopFlag", "LOG_HEADER", "Checkpoint", "CheckpointError", "load_checkpoint"]


@dataclasses.dataclass
class BundleAdjustResult:
    """The outcome of :func:`bundle_adjust`.

    ``cameras`` / ``points`` are the optimised parameters (the best state found, never NaN);
    ``history`` the per-iteration records (Ceres' log columns); ``times`` splits the wall time
    into ``jacobian_evaluation`` (residuals and Jacobians), ``residual_evaluation`` (cost only,
    at candidate points), ``linear_solver`` and ``other``, with ``preprocessor``, ``minimizer``
    and ``total`` (and ``checkpoint``, the time spent writing checkpoints, when there were any).
    ``termination_type`` is one of CONVERGENCE, NO_CONVERGENCE, FAILURE, USER_SUCCESS (Ctrl-C).
    A solve resumed from a checkpoint has its path in ``resumed_from`` and its iteration in
    ``resumed_iteration``; its ``history`` and ``initial_cost`` are this solve's own. With
    ``checkpoint=``, ``checkpoint_iteration`` is the iteration of the last checkpoint written
    (counted from the first solve; None if none could be written).
    """
    cameras: np.ndarray
    points: np.ndarray
    initial_cost: float
    final_cost: float
    termination_type: str
    message: str
    history: List[IterationSummary]
    num_successful_steps: int
    num_unsuccessful_steps: int
    times: dict
    options: Options
    problem: BALProblem
    num_cameras: int
    num_points: int
    num_observations: int
    num_jacobian_evaluations: int = 0
    num_residual_evaluations: int = 0
    num_linear_solves: int = 0
    loss_name: str = "TRIVIAL"
    model_name: str = ""
    dtype: str = "float64"
    device: str = ""
    # "device" when every iteration's vectors and arithmetic stayed on the OpenCL device
    # (solvers.lm_device), "host" for the reference path; bytes that crossed to and from it.
    state: str = "host"
    transfers: dict = dataclasses.field(default_factory=dict)
    resumed_from: str = ""
    resumed_iteration: int = 0
    checkpoint_iteration: Optional[int] = None
    # sparse_schur: the reduced camera matrix's size and where it was factorised, e.g.
    # "Reduced camera matrix: 657 x 657, dense Cholesky on the device".
    linear_solver_detail: str = ""

    @property
    def iterations(self) -> int:
        """Trust-region steps taken (iterations after iteration 0), accepted or not."""
        return len(self.history) - 1 if self.history else 0

    @property
    def converged(self) -> bool:
        return self.termination_type == "CONVERGENCE"

    @property
    def usable(self) -> bool:
        """As Ceres' ``IsSolutionUsable``: anything but FAILURE."""
        return self.termination_type != "FAILURE"

    def full_report(self) -> str:
        return full_report(self)

    def brief_report(self) -> str:
        return (f"Ceres-style report: Iterations: {self.iterations}, Initial cost: {self.initial_cost:e}, "
                f"Final cost: {self.final_cost:e}, Termination: {self.termination_type}")


def bundle_adjust(problem: BALProblem, linear_solver: str = "sparse_schur", loss=None, loss_scale: float = 1.0,
                  max_iterations: int = 50, function_tolerance: float = 1e-6, gradient_tolerance: float = 1e-10,
                  parameter_tolerance: float = 1e-8, model=None, dtype=np.float64, device=None,
                  backend: Optional[str] = None, callback: Optional[Callable] = None, verbose: bool = False,
                  stop: Optional[StopFlag] = None, handle_sigint: bool = True, out=None,
                  resume=None, **options) -> BundleAdjustResult:
    """Minimise the BAL reprojection error of ``problem`` with Levenberg-Marquardt (Ceres' semantics).

    - ``linear_solver``: ``"sparse_schur"`` or ``"iterative_schur"``.
    - ``loss``: None/"trivial", "huber", "cauchy" or "soft_l1" (or a :class:`Loss`), with ``loss_scale``.
    - ``model``: the camera model; a class taking ``(cam_idx, pt_idx, observations, dtype=, device=)``
      (default: ``solvers.snavely.SnavelyModel``, built on pyclad) or an instance for this problem's
      observations with ``residuals`` and ``residuals_and_jacobians``.
    - ``dtype`` / ``device`` / ``backend``: passed to the model (float32 for devices without fp64).
    - ``callback(iteration_summary)`` runs after every iteration; ``verbose`` prints Ceres' log to
      ``out`` (default stdout) as it goes.
    - Ctrl-C (main thread, ``handle_sigint``) or ``stop.set()`` stops after the current iteration.
    - ``checkpoint=PATH`` (with ``checkpoint_every=N``, default 1) writes the best state found to
      PATH (a numpy ``.npz``, :mod:`solvers.checkpoint`) after iteration 0, every N iterations and
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
      OpenCL device (``result.state == "device"``, :mod:`solvers.lm_device`); ``device_resident=False``
      keeps the host reference path, ``True`` requires the device. For ``sparse_schur`` the reduced
      camera matrix is factorised on the device or on the host, whichever is faster
      (:mod:`solvers.sparse_schur_device`); ``result.linear_solver_detail`` (and the verbose log)
      says which.
    """
    if not isinstance(problem, BALProblem):
        raise TypeError(f"problem must be a solvers.BALProblem (read_bal or synthetic_problem), got {type(problem).__name__}")
    t_start = time.perf_counter()
    if isinstance(device, str):
        # A device named but not found is an error (DeviceNotFoundError, with the device list)
        # whatever the backends: silently solving on the host would hide the typo.
        from clkernels import select_device
        select_device(device)
    unknown = set(options) - {f.name for f in dataclasses.fields(Options)}
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; see solvers.Options")
    ck = None
    if resume is not None:
        ck = resume if isinstance(resume, Checkpoint) else load_checkpoint(resume)
        ck.check_problem(problem)
        options.setdefault("initial_trust_region_radius", ck.trust_region_radius)
    opts = Options(max_iterations=max_iterations, function_tolerance=function_tolerance,
                   gradient_tolerance=gradient_tolerance, parameter_tolerance=parameter_tolerance,
                   linear_solver=linear_solver, **options)
    opts.check()
    loss = loss if isinstance(loss, Loss) else Loss(loss or "trivial", loss_scale)
    evaluator = Evaluator(problem, loss, model=model, dtype=dtype, device=device, backend=backend)
    out = out or sys.stdout

    def report(it: IterationSummary):
        if verbose:
            if it.iteration == 0:
                print(LOG_HEADER, file=out)
            print(it.log_line(), file=out, flush=True)
        if callback is not None:
            callback(it)

    x0 = ck.x if ck is not None else np.concatenate([problem.cameras.ravel(), problem.points.ravel()])
    if verbose and ck is not None:
        ended = f" (its solve had ended: {ck.termination_type})" if ck.finished else ""
        print(f"Resuming from checkpoint {ck.path or '(given)'}: iteration {ck.iteration}, cost {ck.cost:e}, "
              f"trust region radius {opts.initial_trust_region_radius:e}{ended}", file=out)
    if verbose and opts.checkpoint is not None:
        print(f"Checkpoints: the best state to {opts.checkpoint} every {opts.checkpoint_every} "
              f"iteration{'s' if opts.checkpoint_every != 1 else ''} and at the end", file=out)
    t_pre = time.perf_counter() - t_start
    runtime = None
    if opts.schur_backend != "numpy":
        runtime = getattr(evaluator.model, "runtime", None)
        if runtime is None:
            from clkernels import NoPlatformError, get_runtime
            try:
                runtime = get_runtime(device)
            except NoPlatformError:  # no OpenCL at all: the numpy Schur complement still works
                if opts.schur_backend == "opencl" or device is not None:
                    raise
                runtime = None
    s = minimize(evaluator, x0, opts, callback=report, stop=stop, handle_sigint=handle_sigint,
                 runtime=runtime, iteration_offset=ck.iteration if ck is not None else 0)
    if verbose and s.linear_solver_detail:
        print(f"\n{s.linear_solver_detail}", file=out)      # apart from Ceres' log rows
    if not np.isfinite(s.initial_cost):
        c = evaluator.cost(x0)
        s.initial_cost = s.final_cost = float("inf") if c is None else c
    cameras, points = evaluator.split(s.x)
    t_total = time.perf_counter() - t_start
    minimizer = s.total_time
    other = max(0.0, minimizer - s.jacobian_time - s.residual_time - s.linear_solver_time)
    times = {"preprocessor": t_pre, "jacobian_evaluation": s.jacobian_time,
             "residual_evaluation": s.residual_time, "linear_solver": s.linear_solver_time,
             "other": other, "minimizer": minimizer, "total": t_total}
    if s.kernel_time is not None:
        times["device_kernels"] = s.kernel_time      # seconds per kernel and their total
    if s.checkpoint_time is not None:
        times["checkpoint"] = s.checkpoint_time      # part of "other"
    model_obj = evaluator.model
    dev = getattr(getattr(model_obj, "runtime", None), "info", None)
    return BundleAdjustResult(
        cameras=cameras.copy(), points=points.copy(), initial_cost=float(s.initial_cost),
        final_cost=float(s.final_cost), termination_type=s.termination_type, message=s.message,
        history=s.iterations, num_successful_steps=s.num_successful_steps,
        num_unsuccessful_steps=s.num_unsuccessful_steps, times=times, options=opts,
        problem=problem.with_parameters(cameras.copy(), points.copy()), num_cameras=problem.num_cameras,
        num_points=problem.num_points, num_observations=problem.num_observations,
        num_jacobian_evaluations=s.num_jacobian_evaluations, num_residual_evaluations=s.num_residual_evaluations,
        num_linear_solves=s.num_linear_solves,
        loss_name="TRIVIAL" if loss.name == "trivial" else f"{loss.name.upper()}({loss.scale:g})",
        model_name=type(model_obj).__name__, dtype=np.dtype(dtype).name,
        device=(dev.name if dev is not None else "host"), state=s.state, transfers=s.transfers,
        resumed_from=(ck.path if ck is not None else ""), resumed_iteration=(ck.iteration if ck is not None else 0),
        checkpoint_iteration=s.checkpoint_iteration, linear_solver_detail=s.linear_solver_detail)
