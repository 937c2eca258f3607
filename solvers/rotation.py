"""Angle-axis rotation of many points at once (numpy), as ``ceres::AngleAxisRotatePoint`` does it."""
import numpy as np

_EPS = np.finfo(np.float64).eps


def rotate(w, x):
    """``R(w) x`` row by row for angle-axis ``w`` (n, 3) and points ``x`` (n, 3) (broadcasting).

    Rodrigues' formula where ``|w|^2 > DBL_EPSILON``; the first-order form ``x + w x x`` below it
    (exact to rounding there, and free of 0/0).
    """
    w, x = np.broadcast_arrays(np.asarray(w, dtype=np.float64), np.asarray(x, dtype=np.float64))
    theta2 = np.einsum("ij,ij->i", w, w)
    full = theta2 > _EPS
    theta = np.sqrt(np.where(full, theta2, 1.0))
    u = w / theta[:, None]
    c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
    ux = np.einsum("ij,ij->i", u, x)[:, None]
    out = x * c + np.cross(u, x) * s + u * ux * (1.0 - c)
    small = ~full
    if small.any():
        out[small] = x[small] + np.cross(w[small], x[small])
    return out
