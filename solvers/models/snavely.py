"""The Snavely camera of the BAL dataset, written once with pyclad; nothing is
differentiated by hand.

Camera: 9 parameters ``[w (angle-axis, 3), t (3), f, k1, k2]``. A point X projects as
``P = R(w) X + t``, ``p = -P.xy / P.z``, ``r = 1 + k1 |p|^2 + k2 |p|^4``, and the residual
is ``f r p - observed`` (as Ceres' ``SnavelyReprojectionError``).
"""
from __future__ import annotations

import numpy as np

import pyclad as pc

from .batch_model import BatchModel
from .cameras import cached_batch_function


def snavely_residual(camera, point, observed):
    """Reprojection residual (2,) of one observation; a pyclad-traceable function."""
    p = pc.rotate_angle_axis(camera[0:3], point) + camera[3:6]
    xp = -p[0] / p[2]
    yp = -p[1] / p[2]
    r2 = xp * xp + yp * yp
    distortion = 1.0 + r2 * (camera[7] + camera[8] * r2)
    return [camera[6] * distortion * xp - observed[0],
            camera[6] * distortion * yp - observed[1]]


def snavely_function(dtype=np.float64, backend="codegen", device=None) -> pc.BatchFunction:
    """The batched residual of :func:`snavely_residual` (traced once per dtype/backend)."""
    return cached_batch_function("snavely_residual", snavely_residual, (9, 3), 2, dtype, backend, device)


class SnavelyModel(BatchModel):
    """Residuals and Jacobian blocks of every observation of a BAL problem (a
    :class:`solvers.models.batch_model.BatchModel` of :func:`snavely_function`).

    The observation index and the observed points go to the device once; each call sends
    only the current cameras and points. Arrays in and out are float64 numpy arrays; with
    ``dtype=np.float32`` the evaluation itself is in single precision.
    """

    def __init__(self, cam_idx, pt_idx, observations, dtype=np.float64, device=None,
                 backend="codegen", inputs=None):
        super().__init__(snavely_function(dtype, backend, device), cam_idx, pt_idx, observations,
                         device=device, inputs=inputs)
