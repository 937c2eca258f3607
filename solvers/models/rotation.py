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


def angle_axis_from_matrix(R):
    """The angle-axis vectors (n, 3) of rotation matrices ``R`` (n, 3, 3), angles in [0, pi]:
    through the unit quaternion, taken from the largest of the trace and the diagonal entries
    (Shepperd's choice, well conditioned for every rotation), then ``w = theta * axis`` with
    ``theta = 2 atan2(|v|, s)``; near zero ``theta / sin(theta / 2)`` by its series."""
    R = np.asarray(R, dtype=np.float64).reshape(-1, 3, 3)
    n = R.shape[0]
    diag = np.stack([R[:, 0, 0], R[:, 1, 1], R[:, 2, 2]], axis=1)
    trace = diag.sum(axis=1)
    choice = np.argmax(np.column_stack([diag, trace]), axis=1)
    q = np.empty((n, 4))                            # (x, y, z, w)
    rows = np.arange(n)
    at_trace = choice == 3
    q[at_trace, 0] = R[at_trace, 2, 1] - R[at_trace, 1, 2]
    q[at_trace, 1] = R[at_trace, 0, 2] - R[at_trace, 2, 0]
    q[at_trace, 2] = R[at_trace, 1, 0] - R[at_trace, 0, 1]
    q[at_trace, 3] = 1.0 + trace[at_trace]
    r = rows[~at_trace]
    i = choice[r]
    j, k = (i + 1) % 3, (i + 2) % 3
    q[r, i] = 1.0 - trace[r] + 2.0 * R[r, i, i]
    q[r, j] = R[r, j, i] + R[r, i, j]
    q[r, k] = R[r, k, i] + R[r, i, k]
    q[r, 3] = R[r, k, j] - R[r, j, k]
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[q[:, 3] < 0] *= -1.0                          # the angle in [0, pi]
    v = np.linalg.norm(q[:, :3], axis=1)
    theta = 2.0 * np.arctan2(v, q[:, 3])
    small = theta <= 1e-3
    t2 = theta * theta
    scale = np.where(small, 2.0 + t2 / 12.0 + 7.0 * t2 * t2 / 2880.0,
                     theta / np.sin(np.where(small, 1.0, theta) / 2.0))
    return scale[:, None] * q[:, :3]
