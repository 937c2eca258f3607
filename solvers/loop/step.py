"""What the minimizer (:mod:`solvers.loop.lm`) asks of a loop state, and what a state's linear solve
returns. Every state declares :class:`LoopState` as its base and defines each of its members
itself (``tests/test_state_protocol.py`` holds them to it): the host reference
(:class:`solvers.ba.host_state.HostState`), the device-resident state
(:class:`solvers.ba.lm_device.DeviceState`), the general core's (:class:`solvers.general.sparse_state.SparseState`)
and the two splits (:class:`solvers.split.partitioned.PartitionedState`,
:class:`solvers.split.partitioned_device.PartitionedDeviceState`)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Protocol, Tuple

import numpy as np


@dataclasses.dataclass
class StepSolution:
    """A linear solve's outcome for the minimizer: ``model_cost_change`` is None when not ok."""
    ok: bool
    iterations: int
    message: str
    model_cost_change: Optional[float] = None


class LoopState(Protocol):
    """The iterate, its evaluations and the LM step, wherever they live."""

    where: str                      # for the report: "host", "device", "partitioned", ...
    linear_solver_time: float       # seconds in the linear solves so far

    def evaluate_jacobian(self, first: bool) -> Optional[Tuple[float, float, float]]:
        """Residuals and Jacobian at the iterate: ``(cost, max |gradient|, |gradient|)``, or None
        where the evaluation failed. ``first``: the first evaluation of the solve."""

    def solve_step(self, radius: float, reuse_diagonal: bool) -> StepSolution:
        """The LM step for the trust-region ``radius`` (the diagonal reused when asked)."""

    def evaluate_candidate(self) -> Tuple[Optional[float], float]:
        """``(cost at iterate + step, or None where it failed, |step|)``."""

    def accept(self) -> None:
        """The candidate becomes the iterate."""

    @property
    def x_norm(self) -> float:
        """``|x|`` of the iterate."""

    def remember_best(self) -> None:
        """Keep the iterate as the best state found."""

    def best(self, final: bool = True) -> np.ndarray:
        """The best state found as one host vector (``final``: the last read of the solve)."""

    def transfers(self) -> dict:
        """Bytes moved to and from devices (empty on the host)."""

    def kernel_time(self) -> Optional[dict]:
        """Seconds per device kernel where the state profiles them, else None."""

    @property
    def linear_solver_detail(self) -> str:
        """How the linear solver works for the report ("" when there is nothing to say)."""

    def close(self) -> None:
        """Release what the state holds (device buffers, kernels, threads)."""
