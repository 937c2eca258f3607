"""Per-iteration records, the Ceres-style iteration log and the final report."""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

from ..linalg.linear_solver import linear_solver

LOG_HEADER = ("iter      cost      cost_change  |gradient|   |step|    tr_ratio  tr_radius  ls_iter  "
              "iter_time  total_time")
"""The header line of the iteration log, Ceres' columns (one :class:`IterationSummary` per row)."""


def _c(fmt, v):
    """C printf formatting (Ceres' log uses flags like '% 3.2e')."""
    return fmt % v


@dataclasses.dataclass
class IterationSummary:
    """One minimizer iteration, with the fields of Ceres' ``IterationSummary``
    (``SolveResult.history`` holds one per iteration, iteration 0 first).

    Attributes:
        iteration: the iteration's number.
        cost: the cost at the iteration's end (the accepted state's).
        cost_change: the cost's decrease by the step (0 for a rejected step).
        gradient_max_norm: the gradient's max norm.
        gradient_norm: the gradient's 2-norm.
        step_norm: the step's 2-norm.
        relative_decrease: actual over the model's predicted decrease (``tr_ratio`` in the log).
        trust_region_radius: the radius for the next step.
        eta: the conjugate gradients' forcing tolerance (``iterative_schur``).
        linear_solver_iterations: the linear solver's iterations (the CG steps of ``iterative_schur``).
        linear_solver_message: what the linear solver said.
        step_is_valid: the step was finite.
        step_is_successful: the step was accepted.
        step_solver_time: seconds in the linear solver.
        iteration_time: seconds of this iteration.
        cumulative_time: seconds since the solve began.
    """
    iteration: int = 0
    cost: float = 0.0
    cost_change: float = 0.0
    gradient_max_norm: float = 0.0
    gradient_norm: float = 0.0
    step_norm: float = 0.0
    relative_decrease: float = 0.0
    trust_region_radius: float = 0.0
    eta: float = 0.0
    linear_solver_iterations: int = 0
    linear_solver_message: str = ""
    step_is_valid: bool = False
    step_is_successful: bool = False
    step_solver_time: float = 0.0
    iteration_time: float = 0.0
    cumulative_time: float = 0.0

    def log_line(self) -> str:
        """The row Ceres prints for this iteration (same columns and printf formats)."""
        return (_c("% 4d", self.iteration) + " " + _c("% 8e", self.cost) + "   " +
                _c("% 3.2e", self.cost_change) + "   " + _c("% 3.2e", self.gradient_max_norm) + "  " +
                _c("% 3.2e", self.step_norm) + "  " + _c("% 3.2e", self.relative_decrease) + " " +
                _c("% 3.2e", self.trust_region_radius) + "     " + _c("% 4d", self.linear_solver_iterations) +
                "   " + _c("% 3.2e", self.iteration_time) + "   " + _c("% 3.2e", self.cumulative_time))

    def as_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass
class SolverSummary:
    """What the minimizer reports (see :class:`solvers.BundleAdjustResult` for the user's view)."""
    iterations: List[IterationSummary] = dataclasses.field(default_factory=list)
    initial_cost: float = float("nan")
    final_cost: float = float("nan")
    termination_type: str = "NO_CONVERGENCE"
    message: str = ""
    num_successful_steps: int = 0
    num_unsuccessful_steps: int = 0
    x: Optional[np.ndarray] = None
    total_time: float = 0.0
    setup_time: float = 0.0          # the loop state's setup (orderings, uploads, kernels) before iteration 0
    linear_solver_time: float = 0.0
    num_linear_solves: int = 0
    jacobian_time: float = 0.0
    num_jacobian_evaluations: int = 0
    residual_time: float = 0.0
    num_residual_evaluations: int = 0
    state: str = "host"              # where the iterations ran: "host" or "device"
    transfers: dict = dataclasses.field(default_factory=dict)   # bytes to and from the device
    kernel_time: Optional[dict] = None    # seconds per device kernel (Options.profile_kernels)
    checkpoint_time: Optional[float] = None   # seconds writing checkpoints (Options.checkpoint)
    checkpoint_iteration: Optional[int] = None    # of the last checkpoint written; None: none
    linear_solver_detail: str = ""        # sparse_schur: S's size and where it is factorised
    callback_error: Optional[BaseException] = None   # what the callback raised, which ended the solve


def full_report(result) -> str:
    """A report in the spirit of Ceres' ``Solver::Summary::FullReport()`` for a
    :class:`solvers.SolveResult` (or :class:`solvers.BundleAdjustResult`)."""
    r = result
    o = r.options
    lines = [f"Solver Summary (pyclad {'bundle adjuster' if r.core == 'bundle-adjustment' else 'least squares'}; "
             f"model {r.model_name}, {r.dtype}, device {r.device})", ""]
    w = 30

    def row(label, a, b=None):
        if b is None:
            lines.append(f"{label:<{w}}{a:>20}")
        else:
            lines.append(f"{label:<{w}}{a:>20}{b:>25}")

    lines.append(" " * w + f"{'Original':>20}{'Reduced':>25}")
    row("Parameter blocks", r.num_parameter_blocks, r.num_parameter_blocks_reduced)
    row("Parameters", r.num_parameters, r.num_parameters_reduced)
    if r.num_effective_parameters != r.num_parameters_reduced:
        row("Effective parameters", r.num_parameters, r.num_effective_parameters)
    row("Residual blocks", r.num_residual_blocks, r.num_residual_blocks)
    row("Residuals", r.num_residuals, r.num_residuals)
    lines.append("")
    row("Minimizer", "TRUST_REGION")
    row("Iterations run on", r.state)
    if r.resumed_from:
        lines.append(f"{'Resumed from':<{w}}{r.resumed_from} (iteration {r.resumed_iteration})")
    if o.checkpoint is not None:
        lines.append(f"{'Checkpoint':<{w}}{o.checkpoint} (every {o.checkpoint_every})")
    lines.append("")
    detail = r.linear_solver_detail
    row("Sparse linear algebra library", "SUITE_SPARSE" if "CHOLMOD" in detail or "cholespy" in detail else "SCIPY")
    row("Trust region strategy", "LEVENBERG_MARQUARDT")
    lines.append("")
    lines.append(" " * w + f"{'Given':>20}{'Used':>25}")
    row("Linear solver", o.linear_solver.upper(), o.linear_solver.upper())
    preconditioner = linear_solver(o.linear_solver).preconditioner
    if preconditioner:
        row("Preconditioner", preconditioner, preconditioner)
    if detail:
        label, _, how = detail.partition(": ")
        lines.append(f"{label:<{w}}{how}")
    row("Linear solver ordering", "AUTOMATIC", r.ordering)
    if r.schur_structure:
        row("Schur structure", r.schur_structure, r.schur_structure)
    row("Loss", r.loss_name, r.loss_name)
    lines.append("")
    lines.append("Cost:")
    row("Initial", f"{r.initial_cost:e}")
    row("Final", f"{r.final_cost:e}")
    row("Change", f"{r.initial_cost - r.final_cost:e}")
    lines.append("")
    row("Minimizer iterations", len(r.history))
    row("Successful steps", r.num_successful_steps)
    row("Unsuccessful steps", r.num_unsuccessful_steps)
    lines.append("")
    t = r.times
    lines.append("Time (in seconds):")
    row("Preprocessor", f"{t['preprocessor']:.6f}")
    if "setup" in t:            # the preprocessor and the state's setup: all before iteration 0
        row("Setup", f"{t['setup']:.6f}")
    lines.append("")
    row("  Residual only evaluation", f"{t['residual_evaluation']:.6f} ({r.num_residual_evaluations})")
    row("  Jacobian & residual evaluation", f"{t['jacobian_evaluation']:.6f} ({r.num_jacobian_evaluations})")
    row("  Linear solver", f"{t['linear_solver']:.6f} ({r.num_linear_solves})")
    row("  Other", f"{t['other']:.6f}")
    row("Minimizer", f"{t['minimizer']:.6f}")
    lines.append("")
    row("Total", f"{t['total']:.6f}")
    lines.append("")
    lines.append(f"{'Termination:':<{w}}{r.termination_type:>20} ({r.message})")
    return "\n".join(lines)
