"""Rotations as COLMAP stores them, unit quaternions ``(qw, qx, qy, qz)``, and as the problems hold
them, angle-axis vectors; batched over rows (n, ...)."""
from __future__ import annotations

import numpy as np


def quaternion_to_angle_axis(q) -> np.ndarray:
    """(n, 4) unit quaternions ``(qw, qx, qy, qz)`` -> (n, 3) angle-axis vectors."""
    q = np.asarray(q, np.float64)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    q = np.where(q[:, :1] < 0, -q, q)                  # the rotation angle in [0, pi]
    v = q[:, 1:]
    s = np.linalg.norm(v, axis=1)
    angle = 2.0 * np.arctan2(s, q[:, 0])
    # angle / s -> 2 / qw as s -> 0 (first order), free of 0/0
    k = np.where(s > 1e-12, angle / np.where(s > 1e-12, s, 1.0), 2.0 / q[:, 0])
    return v * k[:, None]


def angle_axis_to_quaternion(w) -> np.ndarray:
    """(n, 3) angle-axis vectors -> (n, 4) unit quaternions ``(qw, qx, qy, qz)``, qw >= 0."""
    w = np.asarray(w, np.float64)
    theta = np.linalg.norm(w, axis=1)
    half = 0.5 * theta
    k = np.where(theta > 1e-12, np.sin(half) / np.where(theta > 1e-12, theta, 1.0), 0.5)
    q = np.concatenate([np.cos(half)[:, None], w * k[:, None]], axis=1)
    return np.where(q[:, :1] < 0, -q, q)


def quaternion_to_matrix(q) -> np.ndarray:
    """(n, 4) quaternions ``(qw, qx, qy, qz)`` (normalised here) -> (n, 3, 3) rotation matrices."""
    q = np.asarray(q, np.float64)
    w, x, y, z = (q / np.linalg.norm(q, axis=1, keepdims=True)).T
    return np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], 1),
                     np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], 1),
                     np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], 1)], 1)


def quaternion_multiply(a, b) -> np.ndarray:
    """Hamilton products ``a * b`` of (n, 4) quaternions ``(qw, qx, qy, qz)``: the rotation of
    ``b`` followed by that of ``a``."""
    aw, ax, ay, az = np.asarray(a, np.float64).T
    bw, bx, by, bz = np.asarray(b, np.float64).T
    return np.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], 1)


def matrix_to_quaternion(R) -> np.ndarray:
    """(n, 3, 3) rotation matrices -> (n, 4) unit quaternions ``(qw, qx, qy, qz)``, qw >= 0
    (Shepperd's method: from the largest of the four squared components)."""
    R = np.asarray(R, np.float64).reshape(-1, 3, 3)
    tr = np.trace(R, axis1=1, axis2=2)
    d = np.stack([tr, R[:, 0, 0], R[:, 1, 1], R[:, 2, 2]], 1)
    k = np.argmax(d, axis=1)
    q = np.empty((len(R), 4))
    for i in range(len(R)):
        m = R[i]
        if k[i] == 0:
            r = np.sqrt(1.0 + tr[i]) * 2
            q[i] = [0.25 * r, (m[2, 1] - m[1, 2]) / r, (m[0, 2] - m[2, 0]) / r, (m[1, 0] - m[0, 1]) / r]
        elif k[i] == 1:
            r = np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
            q[i] = [(m[2, 1] - m[1, 2]) / r, 0.25 * r, (m[0, 1] + m[1, 0]) / r, (m[0, 2] + m[2, 0]) / r]
        elif k[i] == 2:
            r = np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
            q[i] = [(m[0, 2] - m[2, 0]) / r, (m[0, 1] + m[1, 0]) / r, 0.25 * r, (m[1, 2] + m[2, 1]) / r]
        else:
            r = np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
            q[i] = [(m[1, 0] - m[0, 1]) / r, (m[0, 2] + m[2, 0]) / r, (m[1, 2] + m[2, 1]) / r, 0.25 * r]
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return np.where(q[:, :1] < 0, -q, q)
