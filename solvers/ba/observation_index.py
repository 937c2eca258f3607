"""The bundle-adjustment core's view of its observations: which camera and point each one
reads, the observed values, the sizes (what :class:`solvers.ba.evaluator.Evaluator`, the
checkpoints and a split's parts read). Its own module so that the solve and the split import it
without importing each other."""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np


@dataclasses.dataclass
class ObservationIndex:
    """The index fields of :class:`solvers.BALProblem` for the bundle-adjustment core (what
    :class:`solvers.ba.evaluator.Evaluator` and the checkpoints read)."""
    camera_index: np.ndarray
    point_index: np.ndarray
    observations: Optional[np.ndarray]
    num_cameras: int
    num_points: int
    name: str
    camera_size: int = 9            # parameters per camera and per point (a checkpoint's widths)
    point_size: int = 3

    @property
    def num_observations(self) -> int:
        return self.camera_index.size
