"""``solve(problem, ...)``: Levenberg-Marquardt with Ceres' semantics on a :class:`solvers.Problem`.

The call plans the solve once (:mod:`solvers.plan`: the eliminated group, the linear solver, the
core and its loop state), runs the minimizer (:mod:`solvers.loop.lm`) on the planned state, and
gathers the result and the report.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, List, Optional

import numpy as np

from .loop.checkpoint import Checkpoint, ProblemCheckpoint, load_checkpoint
from .loop.lm import Options, StopFlag, minimize
from .plan import choose_core, choose_linear_solver, resolve_device
from .loop.summary import LOG_HEADER, IterationSummary, full_report

@dataclasses.dataclass
class SolveResult:
    """The outcome of :func:`solve`.

    ``parameters`` maps every group's name to its optimised table (the best state found; constant
    rows and entries as given). ``history`` holds the per-iteration records (Ceres' log columns);
    ``times`` splits the wall time into ``jacobian_evaluation``, ``residual_evaluation``,
    ``linear_solver`` and ``other``, with ``preprocessor``, ``minimizer`` and ``total``.
    ``termination_type`` is one of CONVERGENCE, NO_CONVERGENCE, FAILURE, USER_SUCCESS (Ctrl-C).
    ``core`` says which iterations ran: ``"bundle-adjustment"`` or ``"general"`` (:mod:`solvers.plan`);
    ``state`` whether they stayed on the device (``"device"``) or ran on the host.
    """
    parameters: dict
    initial_cost: float
    final_cost: float
    termination_type: str
    message: str
    history: List[IterationSummary]
    num_successful_steps: int
    num_unsuccessful_steps: int
    times: dict
    options: Options
    num_parameter_blocks: int = 0
    num_parameters: int = 0
    num_effective_parameters: int = 0     # in the tangent space: constant entries left out
    num_parameter_blocks_reduced: int = 0
    num_parameters_reduced: int = 0
    num_residual_blocks: int = 0
    num_residuals: int = 0
    eliminated: Optional[str] = None
    schur_structure: str = ""             # Ceres': residual rows, eliminated block, other blocks
    ordering: str = ""                    # eliminated rows, other rows
    core: str = "general"
    num_jacobian_evaluations: int = 0
    num_residual_evaluations: int = 0
    num_linear_solves: int = 0
    loss_name: str = "TRIVIAL"
    model_name: str = ""
    dtype: str = "float64"
    device: str = ""
    state: str = "host"
    transfers: dict = dataclasses.field(default_factory=dict)
    resumed_from: str = ""
    resumed_iteration: int = 0
    checkpoint_iteration: Optional[int] = None
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


def solve(problem, linear_solver: str = "sparse_schur", eliminate="auto", max_iterations: int = 50,
          function_tolerance: float = 1e-6, gradient_tolerance: float = 1e-10,
          parameter_tolerance: float = 1e-8, callback: Optional[Callable] = None, verbose: bool = False,
          stop: Optional[StopFlag] = None, handle_sigint: bool = True, out=None, model=None,
          resume=None, **options) -> SolveResult:
    """Minimise ``problem``'s cost with Levenberg-Marquardt (Ceres' semantics) -> :class:`SolveResult`.

    - ``linear_solver``: a name of :data:`solvers.LINEAR_SOLVERS` (each is described in
      :mod:`solvers.linalg.linear_solver`). The Schur methods eliminate a group; when nothing can
      be eliminated the step is solved by ``sparse_normal_cholesky`` (and the log says so).
    - ``max_iterations``, ``function_tolerance``, ``gradient_tolerance``,
      ``parameter_tolerance``: Ceres' stopping rules with Ceres' defaults: at most that many
      iterations; stop when a step changes the cost by less than ``function_tolerance`` of
      it, when the largest entry of the projected gradient is at most ``gradient_tolerance``,
      or when a step is shorter than ``parameter_tolerance`` times (the parameters' norm +
      ``parameter_tolerance``).
    - ``eliminate``: the group's name, ``"auto"`` (Ceres' choice: the largest group in which no
      residual block touches two rows) or None.
    - ``callback(iteration_summary)`` after every iteration (an exception it raises ends the
      solve and reaches the caller with ``exc.result``, the best state; a checkpoint holds the last
      completed iteration); ``verbose`` prints Ceres' log to ``out`` (default stdout). Ctrl-C
      (main thread, ``handle_sigint``) or ``stop.set()`` stops
      after the current iteration with the best state found.
    - ``model``: for the bundle-adjustment core only, a camera model (class or instance, as
      :func:`solvers.bundle_adjust` takes) evaluating the residual instead of pyclad.
    - ``resume`` / ``checkpoint=`` (see :func:`solvers.bundle_adjust`): on either core; a general
      problem's checkpoint holds every group's table (:class:`solvers.loop.checkpoint.ProblemCheckpoint`)
      and resumes only a problem of the same structure.
    - Other keyword options: fields of :class:`solvers.Options`.

    Returns a :class:`SolveResult` (the solved parameters per group, Ceres' summary fields,
    ``times`` with ``setup`` apart from the iterations). Raises ``TypeError`` for a problem
    that is not a :class:`solvers.Problem` or an unknown option, ``ValueError`` for an option
    out of range or a problem that does not check (the message names the argument), and
    :class:`solvers.CheckpointError` for a ``resume`` checkpoint of another problem.
    """
    from .general.problem import Problem
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a solvers.Problem, got {type(problem).__name__}")
    t_start = time.perf_counter()
    unknown = set(options) - {f.name for f in dataclasses.fields(Options)}
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; see solvers.Options")
    problem.check()
    out = out or sys.stdout
    eliminated, linear_solver, notes = choose_linear_solver(problem, linear_solver, eliminate)
    ck = None
    if resume is not None:
        ck = resume if isinstance(resume, (Checkpoint, ProblemCheckpoint)) else load_checkpoint(resume)
        options.setdefault("initial_trust_region_radius", ck.trust_region_radius)
    opts = Options(max_iterations=max_iterations, function_tolerance=function_tolerance,
                   gradient_tolerance=gradient_tolerance, parameter_tolerance=parameter_tolerance,
                   linear_solver=linear_solver, **options)
    opts.check()
    # The device, once: everything after gets this runtime (a name not found fails here, at once).
    runtime = resolve_device(problem, opts)
    if opts.comm is not None:
        # Before anything is set up or split: ranks holding different problems (or starting
        # points) would sum numbers of different problems, or fail inside a reduction.
        from .split.rank_consistency import check_same_problem
        check_same_problem(opts.comm, problem, ck)
    core = choose_core(problem, eliminated, opts, model, resuming=ck is not None, runtime=runtime)
    if ck is not None:
        ck.check_problem(core.checkpoint_problem)

    def report(it: IterationSummary):
        if verbose:
            if it.iteration == 0:
                print(LOG_HEADER, file=out)
            print(it.log_line(), file=out, flush=True)
        if callback is not None:
            callback(it)

    if verbose:
        for n in list(problem.notes) + notes:
            print(n, file=out)
        if ck is not None:
            ended = f" (its solve had ended: {ck.termination_type})" if ck.finished else ""
            print(f"Resuming from checkpoint {ck.path or '(given)'}: iteration {ck.iteration}, cost {ck.cost:e}, "
                  f"trust region radius {opts.initial_trust_region_radius:e}{ended}", file=out)
        if opts.checkpoint is not None:
            print(f"Checkpoints: the best state to {opts.checkpoint} every {opts.checkpoint_every} "
                  f"iteration{'s' if opts.checkpoint_every != 1 else ''} and at the end", file=out)
    x0 = core.x0() if ck is None else core.x_from_checkpoint(ck)
    t_pre = time.perf_counter() - t_start
    s = minimize(core.evaluator, x0, opts, callback=report, stop=stop, handle_sigint=handle_sigint,
                 runtime=core.runtime, iteration_offset=ck.iteration if ck is not None else 0,
                 make_state=core.make_state)
    if verbose and s.linear_solver_detail:
        print(f"\n{s.linear_solver_detail}", file=out)      # apart from Ceres' log rows
    if not np.isfinite(s.initial_cost):
        c = core.evaluator.cost(x0)
        s.initial_cost = s.final_cost = float("inf") if c is None else c
    t_total = time.perf_counter() - t_start
    other = max(0.0, s.total_time - s.setup_time - s.jacobian_time - s.residual_time - s.linear_solver_time)
    # setup: everything before iteration 0 (the preprocessor and the loop state's setup, which the
    # minimizer's time holds too); other: the rest of the iterations' time.
    times = {"preprocessor": t_pre, "setup": t_pre + s.setup_time, "jacobian_evaluation": s.jacobian_time,
             "residual_evaluation": s.residual_time, "linear_solver": s.linear_solver_time,
             "other": other, "minimizer": s.total_time, "total": t_total}
    if s.kernel_time is not None:
        times["device_kernels"] = s.kernel_time
    if s.checkpoint_time is not None:
        times["checkpoint"] = s.checkpoint_time
    result = SolveResult(
        parameters=core.parameters(s.x), initial_cost=float(s.initial_cost), final_cost=float(s.final_cost),
        termination_type=s.termination_type, message=s.message, history=s.iterations,
        num_successful_steps=s.num_successful_steps, num_unsuccessful_steps=s.num_unsuccessful_steps,
        times=times, options=opts, eliminated=eliminated, core=core.name,
        num_jacobian_evaluations=s.num_jacobian_evaluations, num_residual_evaluations=s.num_residual_evaluations,
        num_linear_solves=s.num_linear_solves, loss_name=core.loss_name, model_name=core.model_name,
        dtype=problem.dtype.name, device=core.device_name, state=s.state, transfers=s.transfers,
        resumed_from=(ck.path if ck is not None else ""), resumed_iteration=(ck.iteration if ck is not None else 0),
        checkpoint_iteration=s.checkpoint_iteration,
        linear_solver_detail="; ".join(notes + ([s.linear_solver_detail] if s.linear_solver_detail else [])),
        **core.counts(problem))
    if s.callback_error is not None:
        # The caller's exception reaches the caller, with the solve's result on it: nothing of
        # the finished iterations is lost (and the checkpoint holds the last one).
        raise attach_result(s.callback_error, result)
    return result


def attach_result(exc: BaseException, result) -> BaseException:
    """``exc`` with ``exc.result = result`` and a note saying where the result is."""
    exc.result = result
    note = (f"pyclad: the solve ended here with its best state kept in this exception's .result "
            f"({result.termination_type}, final cost {result.final_cost:e})")
    if note not in getattr(exc, "__notes__", []):
        exc.add_note(note)
    return exc


