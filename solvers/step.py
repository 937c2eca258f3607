"""What a loop state's linear solve tells the minimizer (every state returns it)."""
from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class StepSolution:
    """A linear solve's outcome for the minimizer: ``model_cost_change`` is None when not ok."""
    ok: bool
    iterations: int
    message: str
    model_cost_change: Optional[float] = None
