"""Independent numpy reference for the Snavely (BAL) camera model, written from the BAL spec.

Camera (9 parameters): ``[w(3) angle-axis rotation, t(3) translation, f, k1, k2]``; point ``X(3)``::

    P = R(w) X + t        R(w) by Rodrigues' formula, with Ceres' first-order branch:
                          if |w|^2 > DBL_EPSILON:  R X = X cos(th) + (u x X) sin(th) + u (u.X)(1 - cos(th)),
                                                   th = |w|, u = w / th
                          else:                    R X = X + w x X
    p = -P.xy / P.z       (Bundler cameras look down -z)
    r = 1 + k1 |p|^2 + k2 |p|^4
    residual = f r p - observed

``ReferenceSnavelyModel`` has the interface of ``solvers.models.snavely.SnavelyModel``; its Jacobians come
from the complex-step method: ``d f / d x_k = Im f(x + i h e_k) / h`` with ``h = 1e-30``, exact to
machine precision (no subtractive cancellation). Every complex evaluation is vectorised over all
observations: 9 + 3 = 12 complex evaluations in all. Branch tests and the square root's argument
use the real part so the imaginary perturbation only carries the derivative.

This file is a test reference (also used by the AD tests); it does not import the code under test.
"""
import numpy as np

DBL_EPSILON = np.finfo(np.float64).eps
COMPLEX_STEP = 1e-30


def rotate_point(w, x):
    """``R(w) x`` for angle-axis rows ``w`` (n, 3) and points ``x`` (n, 3); real or complex.

    The branch between the full Rodrigues formula and the first-order one is chosen per row on the
    real part of ``|w|^2``, exactly as ``ceres::AngleAxisRotatePoint`` does with ``theta2 > eps``.
    """
    theta2 = np.sum(w * w, axis=1)
    full = theta2.real > DBL_EPSILON
    # Evaluate the full formula only where it is defined (theta > 0): a safe angle elsewhere keeps
    # the discarded branch free of 0/0 (whose NaN would otherwise leak into complex arithmetic).
    safe2 = np.where(full, theta2, 1.0)
    theta = np.sqrt(safe2)
    u = w / theta[:, None]
    cos_t, sin_t = np.cos(theta)[:, None], np.sin(theta)[:, None]
    u_dot_x = np.sum(u * x, axis=1)[:, None]
    rodrigues = x * cos_t + np.cross(u, x) * sin_t + u * u_dot_x * (1.0 - cos_t)
    first_order = x + np.cross(w, x)
    return np.where(full[:, None], rodrigues, first_order)


def project(cameras_per_obs, points_per_obs):
    """Predicted image position ``f r p`` (n, 2) for per-observation camera (n, 9) and point (n, 3)."""
    c, x = cameras_per_obs, points_per_obs
    P = rotate_point(c[:, 0:3], x) + c[:, 3:6]
    p = -P[:, 0:2] / P[:, 2:3]
    r2 = np.sum(p * p, axis=1)
    f, k1, k2 = c[:, 6], c[:, 7], c[:, 8]
    distortion = 1.0 + k1 * r2 + k2 * r2 * r2
    return (f * distortion)[:, None] * p


class ReferenceSnavelyModel:
    """Residuals and Jacobians of the BAL reprojection error, in numpy (float64 throughout).

    Same interface as ``solvers.models.snavely.SnavelyModel``:
    ``residuals(cameras, points) -> (n_obs, 2)`` and
    ``residuals_and_jacobians(cameras, points) -> r (n_obs, 2), Jc (n_obs, 2, 9), Jp (n_obs, 2, 3)``.
    ``dtype`` sets the dtype of the outputs (computation is always float64); ``device`` and
    ``backend`` are accepted for interface compatibility and ignored.
    """

    def __init__(self, cam_idx, pt_idx, observations, dtype=np.float64, device=None, backend=None):
        self.cam_idx = np.asarray(cam_idx, dtype=np.int64)
        self.pt_idx = np.asarray(pt_idx, dtype=np.int64)
        self.observations = np.asarray(observations, dtype=np.float64)
        n = self.cam_idx.shape[0]
        if self.cam_idx.shape != (n,) or self.pt_idx.shape != (n,) or self.observations.shape != (n, 2):
            raise ValueError("cam_idx, pt_idx must be (n_obs,) and observations (n_obs, 2); got "
                             f"{self.cam_idx.shape}, {self.pt_idx.shape}, {self.observations.shape}")
        self.dtype = np.dtype(dtype)

    def _gather(self, cameras, points):
        cameras = np.asarray(cameras, dtype=np.float64)
        points = np.asarray(points, dtype=np.float64)
        if cameras.ndim != 2 or cameras.shape[1] != 9:
            raise ValueError(f"cameras must be (n_cameras, 9), got {cameras.shape}")
        if points.ndim != 2 or points.shape[1] != 3:
            raise ValueError(f"points must be (n_points, 3), got {points.shape}")
        if self.cam_idx.size and (self.cam_idx.min() < 0 or self.cam_idx.max() >= len(cameras)):
            raise IndexError("a camera index is out of range for the cameras given")
        if self.pt_idx.size and (self.pt_idx.min() < 0 or self.pt_idx.max() >= len(points)):
            raise IndexError("a point index is out of range for the points given")
        return cameras[self.cam_idx], points[self.pt_idx]

    def residuals(self, cameras, points):
        c, x = self._gather(cameras, points)
        return (project(c, x) - self.observations).astype(self.dtype, copy=False)

    def residuals_and_jacobians(self, cameras, points):
        c, x = self._gather(cameras, points)
        n = c.shape[0]
        r = project(c, x) - self.observations
        jc = np.empty((n, 2, 9))
        jp = np.empty((n, 2, 3))
        cc = c.astype(np.complex128)
        xc = x.astype(np.complex128)
        for k in range(9):
            cc[:, k] += 1j * COMPLEX_STEP
            jc[:, :, k] = project(cc, xc).imag / COMPLEX_STEP
            cc[:, k] = c[:, k]
        for k in range(3):
            xc[:, k] += 1j * COMPLEX_STEP
            jp[:, :, k] = project(cc, xc).imag / COMPLEX_STEP
            xc[:, k] = x[:, k]
        dt = self.dtype
        return r.astype(dt, copy=False), jc.astype(dt, copy=False), jp.astype(dt, copy=False)
