"""Levenberg-Marquardt with the semantics of Ceres Solver's trust-region minimizer.

What this follows (Ceres 2.x ``TrustRegionMinimizer``, ``LevenbergMarquardtStrategy``,
``TrustRegionStepEvaluator``, monotonic steps, no inner iterations):

- Jacobi scaling: at iteration 0, ``s = 1 / (1 + sqrt(diag(J^T J)))`` per parameter; every step
  is then solved for in the scaled variables of ``J diag(s)`` (applied to the normal equations'
  diagonal rather than to every Jacobian entry: see ``_LMStrategy.compute_step``).
- The step solves ``(J^T J + D^T D) y = J^T f`` with ``D = sqrt(clamp(diag(J^T J), 1e-6, 1e32) / radius)``
  (the diagonal is recomputed only after an accepted step), ``step = -y``; the model cost change is
  ``-(J step) . (f + J step / 2)`` and a step is valid only when it is positive (otherwise the radius
  shrinks and the step is retried, at most 5 times in a row).
- ``relative_decrease = (cost - candidate_cost) / model_cost_change``; the step is accepted when it
  exceeds ``min_relative_decrease`` (1e-3). Accepted: ``radius /= max(1/3, 1 - (2 rho - 1)^3)``
  (Nielsen), capped at 1e16; rejected: ``radius /= decrease_factor`` and the factor doubles.
- Termination, in Ceres' order: parameter tolerance ``|dx| <= tol (|x| + tol)`` and function
  tolerance ``|cost_change| <= tol cost`` (checked on every candidate, before acceptance), then
  after each iteration: time, iteration count, gradient tolerance ``max|g| <= tol`` (after accepted
  steps), minimum radius 1e-32.
- A candidate whose residuals are not finite has infinite cost and is rejected; a non-finite
  Jacobian at an accepted point ends the solve with FAILURE. The parameters returned are always the
  best ones evaluated successfully.

Checkpoints (``Options.checkpoint``, :mod:`solvers.loop.checkpoint`): the best parameters, with the
iteration, their cost and the radius, are written atomically after iteration 0, after every
``checkpoint_every``-th iteration the solve continues from, and when it ends (any termination,
Ctrl-C's USER_SUCCESS and FAILURE included, unless no point was ever evaluated successfully).
A second Ctrl-C, which interrupts at once, leaves the last checkpoint written.
"""
from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Callable, Optional

import numpy as np

from .checkpoint import CheckpointWriter, check_checkpoint_options
from ..linalg.linear_solver import LINEAR_SOLVERS
from .summary import IterationSummary, SolverSummary

DBL_MAX = np.finfo(np.float64).max


@dataclasses.dataclass
class Options:
    """Solver options; defaults are Ceres' ``Solver::Options`` defaults.

    Any field is also a keyword of :func:`solvers.solve` and :func:`solvers.bundle_adjust`
    (``solve(problem, eta=0.05, checkpoint="ck.npz")``).

    Attributes:
        max_iterations: the iteration limit (a whole number; 2.5 or "10" is an error).
        function_tolerance: stop when ``|cost change| / cost`` falls below it.
        gradient_tolerance: stop when the gradient's max norm falls below it.
        parameter_tolerance: stop when the step's norm falls below it times the parameters' norm.
        initial_trust_region_radius: the first trust-region radius (Levenberg-Marquardt's 1/mu).
        max_trust_region_radius: the largest radius.
        min_trust_region_radius: at or below this radius the solve ends (CONVERGENCE).
        min_lm_diagonal: the lower clamp of the LM diagonal.
        max_lm_diagonal: the upper clamp of the LM diagonal.
        min_relative_decrease: a step is accepted above this ratio of actual to model decrease.
        max_num_consecutive_invalid_steps: the solve ends (FAILURE) after this many invalid (non-finite) steps in a row.
        jacobi_scaling: scale the columns by their norms, as Ceres does.
        linear_solver: one of :data:`solvers.LINEAR_SOLVERS`.
        eta: the forcing tolerance of ``iterative_schur``'s conjugate gradients.
        max_linear_solver_iterations: the conjugate gradients' iteration limit.
        max_solver_time_in_seconds: stop after this much time.
        schur_backend: where the Schur complement's products run: ``"opencl"`` (the model's
            device; needs fp64), ``"numpy"``, or ``"auto"`` (OpenCL when possible).
        device_resident: None chooses (the device when it can), True requires the
            device-resident iterations, False keeps the host reference path.
        device_setup: where the observations are ordered before the iterations: None chooses
            (the device on GPUs from 100,000 observations), True the device, False the host.
        mixed_precision_solves: sparse_schur's and dense_schur's dense Cholesky on the device in
            float32, the solution refined in float64 to the float64 factorisation's accuracy (which
            takes over where the refinement stalls). None (the default) chooses: on GPUs and
            other accelerators from 8,192 unknowns, where the float32 copy of the reduced matrix
            fits; True: mixed wherever the device factorises; False: float64 throughout.
        profile_kernels: keep the device kernels' events and report their total time.
        checkpoint: write the best state to this file after iteration 0, every
            ``checkpoint_every`` iterations and at the end, atomically (None: no checkpoint).
        checkpoint_every: see ``checkpoint``.
        devices: split the points over several OpenCL devices of this host: a list of device
            specs, or ``"all"`` (every GPU of the chosen platform). None: one device.
        comm: an mpi4py communicator: one part per rank.
    """
    max_iterations: int = 50
    function_tolerance: float = 1e-6
    gradient_tolerance: float = 1e-10
    parameter_tolerance: float = 1e-8
    initial_trust_region_radius: float = 1e4
    max_trust_region_radius: float = 1e16
    min_trust_region_radius: float = 1e-32
    min_lm_diagonal: float = 1e-6
    max_lm_diagonal: float = 1e32
    min_relative_decrease: float = 1e-3
    max_num_consecutive_invalid_steps: int = 5
    jacobi_scaling: bool = True
    linear_solver: str = "sparse_schur"
    eta: float = 0.1
    max_linear_solver_iterations: int = 500
    max_solver_time_in_seconds: float = 1e9
    # Where the Schur complement's per-observation and per-pair products run: "opencl" (the
    # device of the camera model; needs fp64), "numpy", or "auto" (opencl when possible).
    schur_backend: str = "auto"
    # Whether the iterations' vectors and arithmetic stay on the device (solvers.ba.lm_device; a
    # split's parts on theirs, solvers.split.partitioned_device): None chooses (the device when it
    # can), True requires it, False keeps the host reference.
    device_resident: Optional[bool] = None
    # Where the observations are ordered before the iterations (solvers.ba.observations_device):
    # None chooses (the device on GPUs from 100,000 observations), True the device, False the host.
    device_setup: Optional[bool] = None
    # The device's dense Cholesky in float32, refined in float64 (solvers.linalg.mixed_cholesky_device):
    # True or False as asked; None chooses (GPUs and accelerators from 8,192 unknowns, where the
    # float32 copy fits).
    mixed_precision_solves: Optional[bool] = None
    # Keep the device kernels' events and report their total time (times["device_kernels"]).
    profile_kernels: bool = False
    # Write the best state found to this file (solvers.loop.checkpoint) after iteration 0, every
    # checkpoint_every iterations and at the end, atomically: a killed solve loses at most
    # checkpoint_every iterations. None writes nothing.
    checkpoint: Optional[str] = None
    checkpoint_every: int = 1
    # Split the points over several OpenCL devices of this host (a list of device specs, or
    # "all": every GPU of the chosen platform) or over the ranks of an mpi4py communicator
    # (``comm``; one part per rank, ``devices`` then lists the devices of a host's ranks):
    # solvers.split.partitioned. None: one device.
    devices: Optional[object] = None
    comm: Optional[object] = None

    def check(self):
        if self.linear_solver not in LINEAR_SOLVERS:
            raise ValueError(f"linear_solver={self.linear_solver!r} is not one of {LINEAR_SOLVERS}")
        for name in ("max_iterations", "max_num_consecutive_invalid_steps"):
            v = getattr(self, name)
            # Never rounded: 2.5 iterations or "10" is a mistake to name, not to guess at.
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {v!r}")
        for name in ("function_tolerance", "gradient_tolerance", "parameter_tolerance",
                     "initial_trust_region_radius", "eta", "max_solver_time_in_seconds"):
            v = getattr(self, name)
            if isinstance(v, (bool, str)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"{name} must be a number, got {v!r}")
            if not v >= 0 or (name != "max_solver_time_in_seconds" and not np.isfinite(v)):   # NaN too
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        if self.schur_backend not in ("auto", "opencl", "numpy"):
            raise ValueError(f"schur_backend={self.schur_backend!r} is not one of 'auto', 'opencl', 'numpy'")
        if self.device_resident not in (None, True, False):
            raise ValueError(f"device_resident must be None, True or False, got {self.device_resident!r}")
        if self.device_setup not in (None, True, False):
            raise ValueError(f"device_setup must be None, True or False, got {self.device_setup!r}")
        if self.mixed_precision_solves not in (None, True, False):
            raise ValueError("mixed_precision_solves must be None, True or False, "
                             f"got {self.mixed_precision_solves!r}")
        if not (0 < self.min_lm_diagonal <= self.max_lm_diagonal):
            raise ValueError("need 0 < min_lm_diagonal <= max_lm_diagonal")
        check_checkpoint_options(self.checkpoint, self.checkpoint_every)
        if self.split:
            if self.comm is not None and not hasattr(self.comm, "Allreduce"):
                raise TypeError(f"comm must be an mpi4py communicator (mpi4py.MPI.COMM_WORLD), "
                                f"got {type(self.comm).__name__}")
            if self.comm is not None and self.checkpoint is not None:
                raise ValueError("checkpoint= with comm=: not supported (every rank would write); "
                                 "write the result on rank 0 instead")

    @property
    def split(self) -> bool:
        """Whether the solve is split over devices or MPI ranks (solvers.split.partitioned)."""
        return self.devices is not None or self.comm is not None


class _LMStrategy:
    """Ceres' ``LevenbergMarquardtStrategy``: the radius and when the diagonal is recomputed (the
    step itself is the state's :meth:`solve_step`)."""

    def __init__(self, o: Options):
        self.radius = o.initial_trust_region_radius
        self.max_radius = o.max_trust_region_radius
        self.decrease_factor = 2.0
        self.reuse_diagonal = False

    def step_computed(self):
        self.reuse_diagonal = True

    def step_accepted(self, quality):
        self.radius = self.radius / max(1.0 / 3.0, 1.0 - (2.0 * quality - 1.0) ** 3)
        self.radius = min(self.max_radius, self.radius)
        self.decrease_factor = 2.0
        self.reuse_diagonal = False

    def step_rejected(self):
        self.radius = self.radius / self.decrease_factor
        self.decrease_factor *= 2.0
        self.reuse_diagonal = True


class StopFlag:
    """Set by Ctrl-C (or by the caller) to stop after the current iteration.

    Pass one as ``stop=`` to :func:`solvers.solve` or :func:`solvers.bundle_adjust` and call
    :meth:`set` from another thread (or a ``callback``): the solve ends after the iteration in
    progress with termination ``USER_SUCCESS`` and the best state found."""

    def __init__(self):
        self.is_set = False

    def set(self):
        self.is_set = True


class _SigintHandler:
    """First Ctrl-C sets the flag (the solve stops after the iteration in progress); a second one
    interrupts at once. Only installed from the main thread."""

    def __init__(self, flag: StopFlag):
        self.flag, self.previous = flag, None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.getsignal(signal.SIGINT)

            def handler(signum, frame):
                self.flag.set()
                signal.signal(signal.SIGINT, signal.default_int_handler)

            signal.signal(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


class Minimizer:
    """One Levenberg-Marquardt solve (use :func:`minimize`). ``make_state(evaluator, options,
    runtime, x0)`` builds the loop state (:class:`solvers.loop.step.LoopState`) that the plan chose
    (:mod:`solvers.plan`); the minimizer knows no concrete state."""

    def __init__(self, evaluator, options: Options, make_state, callback=None, stop: Optional[StopFlag] = None,
                 runtime=None, iteration_offset: int = 0):
        self.ev, self.o, self.callback = evaluator, options, callback
        self.state = None           # made in run(); None where making it failed
        self.make_state = make_state
        self.stop = stop or StopFlag()
        self.runtime = runtime
        self.strategy = _LMStrategy(options)
        self.summary = SolverSummary()
        self.num_linear_solves = 0
        self.checkpoints = None
        if options.checkpoint is not None:
            # A general problem's evaluator has its Layout; a bundle adjustment's has None.
            self.checkpoints = CheckpointWriter(options.checkpoint, options.checkpoint_every,
                                                evaluator.problem, iteration_offset, layout=evaluator.layout)

    # ------------------------------------------------------------------ evaluation
    def _evaluate_gradient_and_jacobian(self, it: IterationSummary) -> bool:
        res = self.state.evaluate_jacobian(first=it.iteration == 0)
        if res is None:
            self.summary.message = "Residual and Jacobian evaluation failed."
            self.summary.termination_type = "FAILURE"
            return False
        self.x_cost, it.gradient_max_norm, it.gradient_norm = res
        it.cost = self.x_cost
        return True

    # ------------------------------------------------------------------ the loop
    def run(self, x0):
        try:
            return self._run(x0)
        finally:
            if self.state is not None:
                self.state.close()

    def _run(self, x0):
        o, s = self.o, self.summary
        self.start = time.perf_counter()
        self.iteration_start = self.start
        self.state = self.make_state(self.ev, self.o, self.runtime, x0)
        # The state's setup (orders, uploads, buffers, kernels) is reported apart, not as
        # iteration 0's time.
        s.setup_time = time.perf_counter() - self.start
        self.iteration_start = time.perf_counter()
        # Ceres leaves |x| at an invalid -1 until the first accepted step (the parameter tolerance
        # test therefore cannot trigger before it); kept for identical termination.
        self.x_norm = -1.0
        self.minimum_cost = np.inf
        self.num_consecutive_invalid_steps = 0
        s.termination_type, s.message = "NO_CONVERGENCE", ""

        it = IterationSummary(iteration=0, eta=o.eta)
        if not self._evaluate_gradient_and_jacobian(it):
            return self._finish()
        s.initial_cost = self.x_cost
        it.step_is_valid = it.step_is_successful = True
        self.it = it
        # TrustRegionStepEvaluator with monotonic steps reduces to the plain relative decrease.
        self.current_cost = self.x_cost

        while self._finalize_iteration_and_check_if_can_continue():
            self.iteration_start = time.perf_counter()
            it = self.it = IterationSummary(iteration=s.iterations[-1].iteration + 1)
            self._compute_trust_region_step()
            if not it.step_is_valid:
                if not self._handle_invalid_step():
                    return self._finish()
                continue
            self._compute_candidate_point_and_evaluate_cost()
            if self._parameter_tolerance_reached() or self._function_tolerance_reached():
                return self._finish()
            if self._is_step_successful():
                if not self._handle_successful_step():
                    return self._finish()
                continue
            self._handle_unsuccessful_step()
        return self._finish()

    def _finalize_iteration_and_check_if_can_continue(self) -> bool:
        it, s, o = self.it, self.summary, self.o
        if it.step_is_successful:
            s.num_successful_steps += 1
            if self.x_cost < self.minimum_cost:
                self.minimum_cost = self.x_cost
                self.state.remember_best()
        else:
            s.num_unsuccessful_steps += 1
        it.trust_region_radius = self.strategy.radius
        now = time.perf_counter()
        it.iteration_time = now - self.iteration_start
        it.cumulative_time = now - self.start
        s.iterations.append(it)
        if self.callback is not None:
            try:
                self.callback(it)
            except Exception as exc:        # the caller's: it ends the solve, the best state kept
                s.callback_error = exc
                s.message = (f"The callback raised {type(exc).__name__} after iteration {it.iteration}; "
                             "the best state found is kept.")
                s.termination_type = "USER_FAILURE"
                return False
        if self.stop.is_set:
            s.message = (f"Interrupted (Ctrl-C) after iteration {it.iteration}; "
                         "the best state found is returned.")
            s.termination_type = "USER_SUCCESS"
            return False
        total = now - self.start
        if total >= o.max_solver_time_in_seconds:
            s.message = f"Maximum solver time reached. Total solver time: {total:e} >= {o.max_solver_time_in_seconds:e}."
            s.termination_type = "NO_CONVERGENCE"
            return False
        if it.iteration >= o.max_iterations:
            s.message = f"Maximum number of iterations reached. Number of iterations: {it.iteration}."
            s.termination_type = "NO_CONVERGENCE"
            return False
        if it.step_is_successful and it.gradient_max_norm <= o.gradient_tolerance:
            s.message = (f"Gradient tolerance reached. Gradient max norm: {it.gradient_max_norm:e} "
                         f"<= {o.gradient_tolerance:e}")
            s.termination_type = "CONVERGENCE"
            return False
        if it.trust_region_radius <= o.min_trust_region_radius:
            s.message = (f"Minimum trust region radius reached. Trust region radius: "
                         f"{it.trust_region_radius:e} <= {o.min_trust_region_radius:e}")
            s.termination_type = "CONVERGENCE"
            return False
        # Only when the solve goes on: the last iteration's checkpoint is _finish's.
        if self.checkpoints is not None and self.checkpoints.due(it.iteration):
            self._write_checkpoint(self.state.best(final=False))
        return True

    def _write_checkpoint(self, x, termination_type: str = ""):
        # With monotonic steps the best point is the last accepted one, so the radius (the next
        # step's) goes with it; only a FAILURE ends with an accepted point that is not the best.
        iteration = self.summary.iterations[-1].iteration if self.summary.iterations else 0
        self.checkpoints.write(x, iteration, self.minimum_cost, self.strategy.radius, termination_type)

    def _compute_trust_region_step(self):
        it = self.it
        t0 = time.perf_counter()
        sol = self.state.solve_step(self.strategy.radius, self.strategy.reuse_diagonal)
        self.strategy.step_computed()
        it.step_solver_time = time.perf_counter() - t0
        self.num_linear_solves += 1
        it.linear_solver_iterations = sol.iterations
        it.linear_solver_message = sol.message
        it.step_is_valid = False
        if not sol.ok:
            return
        self.model_cost_change = sol.model_cost_change
        it.step_is_valid = self.model_cost_change > 0.0
        if it.step_is_valid:
            self.num_consecutive_invalid_steps = 0

    def _handle_invalid_step(self) -> bool:
        o, s, it = self.o, self.summary, self.it
        self.num_consecutive_invalid_steps += 1
        if self.num_consecutive_invalid_steps >= o.max_num_consecutive_invalid_steps:
            s.message = ("Number of consecutive invalid steps more than "
                         f"max_num_consecutive_invalid_steps: {o.max_num_consecutive_invalid_steps}"
                         f" (last linear solver message: {it.linear_solver_message})")
            s.termination_type = "FAILURE"
            return False
        self.strategy.step_rejected()
        it.cost = self.x_cost
        it.cost_change = 0.0
        it.gradient_max_norm = s.iterations[-1].gradient_max_norm
        it.gradient_norm = s.iterations[-1].gradient_norm
        it.step_norm = 0.0
        it.relative_decrease = 0.0
        it.eta = o.eta
        return True

    def _compute_candidate_point_and_evaluate_cost(self):
        c, self.candidate_step_norm = self.state.evaluate_candidate()
        self.candidate_cost = DBL_MAX if c is None else c

    def _parameter_tolerance_reached(self) -> bool:
        it, o, s = self.it, self.o, self.summary
        it.step_norm = self.candidate_step_norm
        if self.x_norm is None:
            self.x_norm = self.state.x_norm
        tol = o.parameter_tolerance * (self.x_norm + o.parameter_tolerance)
        if it.step_norm > tol:
            return False
        s.message = (f"Parameter tolerance reached. Relative step_norm: "
                     f"{it.step_norm / (self.x_norm + o.parameter_tolerance):e} <= {o.parameter_tolerance:e}.")
        s.termination_type = "CONVERGENCE"
        return True

    def _function_tolerance_reached(self) -> bool:
        it, o, s = self.it, self.o, self.summary
        it.cost_change = self.x_cost - self.candidate_cost
        if abs(it.cost_change) > o.function_tolerance * self.x_cost:
            return False
        s.message = (f"Function tolerance reached. |cost_change|/cost: "
                     f"{abs(it.cost_change) / self.x_cost:e} <= {o.function_tolerance:e}")
        s.termination_type = "CONVERGENCE"
        return True

    def _is_step_successful(self) -> bool:
        it = self.it
        if self.candidate_cost >= DBL_MAX:
            it.relative_decrease = -DBL_MAX
        else:
            it.relative_decrease = (self.current_cost - self.candidate_cost) / self.model_cost_change
        return it.relative_decrease > self.o.min_relative_decrease

    def _handle_successful_step(self) -> bool:
        self.state.accept()
        self.x_norm = None              # |x|, read from the state when a tolerance test needs it
        if not self._evaluate_gradient_and_jacobian(self.it):
            return False
        self.it.step_is_successful = True
        self.strategy.step_accepted(self.it.relative_decrease)
        self.current_cost = self.candidate_cost
        return True

    def _handle_unsuccessful_step(self):
        self.it.step_is_successful = False
        self.strategy.step_rejected()
        self.it.cost = self.candidate_cost

    def _finish(self) -> SolverSummary:
        s = self.summary
        s.x = self.state.best()
        if self.checkpoints is not None and np.isfinite(self.minimum_cost):
            self._write_checkpoint(s.x, s.termination_type)
        if self.checkpoints is not None:
            s.checkpoint_time = self.checkpoints.time
            s.checkpoint_iteration = self.checkpoints.last_iteration
        s.final_cost = self.minimum_cost if np.isfinite(self.minimum_cost) else s.initial_cost
        s.total_time = time.perf_counter() - self.start
        s.linear_solver_time = self.state.linear_solver_time
        s.state = self.state.where
        s.linear_solver_detail = self.state.linear_solver_detail
        s.transfers = self.state.transfers()
        if self.o.profile_kernels and s.state == "device":
            s.kernel_time = self.state.kernel_time()
        s.num_linear_solves = self.num_linear_solves
        s.jacobian_time = self.ev.jacobian_time
        s.num_jacobian_evaluations = self.ev.num_jacobian_evaluations
        s.residual_time = self.ev.residual_time
        s.num_residual_evaluations = self.ev.num_residual_evaluations
        return s


def minimize(evaluator, x0, options: Options, callback: Optional[Callable] = None,
             stop: Optional[StopFlag] = None, handle_sigint: bool = True, runtime=None,
             iteration_offset: int = 0, *, make_state) -> SolverSummary:
    """Run Levenberg-Marquardt from ``x0`` on the loop state ``make_state(evaluator, options,
    runtime, x0)`` builds; ``callback(iteration_summary)`` after each iteration.
    With ``handle_sigint`` (main thread only), Ctrl-C stops after the current iteration.
    ``iteration_offset``: the iterations done before ``x0`` (a solve resumed from a checkpoint);
    only the checkpoints count them, the log and the summary start at iteration 0."""
    options.check()
    stop = stop or StopFlag()
    m = Minimizer(evaluator, options, make_state, callback, stop, runtime, iteration_offset)
    if handle_sigint:
        with _SigintHandler(stop):
            return m.run(x0)
    return m.run(x0)
