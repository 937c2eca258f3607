"""Seeded synthetic BAL problems of any size, for tests and scaling runs.

Cameras stand on a circle looking at the origin-centred scene (the BAL convention: a camera looks
down its -z axis, the image point is ``f r(p) p`` with ``p = -P.xy / P.z``); points fill a ball;
each point is observed by ``obs_per_point`` cameras chosen among the ones nearest along the circle
(a banded reduced camera matrix, like a real sequence). Observations are the exact projections plus
Gaussian pixel noise; the initial cameras and points are perturbed, so the problem needs solving.
"""
from __future__ import annotations

import numpy as np

from . import BALProblem
from ..models.rotation import angle_axis_from_matrix, rotate


def _look_at_angle_axis(centers):
    """Angle-axis rotations of cameras at ``centers`` looking at the origin (camera -z towards it)."""
    z = centers / np.linalg.norm(centers, axis=1, keepdims=True)       # camera +z points away
    x = np.cross(np.array([0.0, 0.0, 1.0]), z)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.cross(z, x)
    R = np.stack([x, y, z], axis=1)                                    # rows: world -> camera
    # The convention of ceres::AngleAxisRotatePoint (R(w) X).
    return angle_axis_from_matrix(R)


def synthetic_problem(num_cameras: int = 20, num_points: int = 2000, obs_per_point: float = 4,
                      noise_px: float = 0.5, perturb_rotation: float = 5e-3, perturb_translation: float = 5e-2,
                      perturb_point: float = 5e-2, seed: int = 0, name: str = None) -> BALProblem:
    """A seeded random BAL problem with about ``num_points * obs_per_point`` observations.

    Cameras on a circle look at points in a cube; each point is seen by consecutive cameras,
    with Gaussian pixel noise, and the returned starting cameras and points are the true ones
    perturbed. Everything is vectorised numpy: 29M observations take seconds.

    Args:
        num_cameras: cameras (at least 2).
        num_points: points (at least 1).
        obs_per_point: cameras that see each point, between 2 and ``num_cameras``; may be
            fractional: each point is then seen by ``floor`` or ``ceil`` of it cameras, at random,
            so the mean is as asked (a venice-size problem: 1778 cameras, 993923 points, 5.07).
        noise_px: the standard deviation of the observations' noise, in pixels.
        perturb_rotation: the standard deviation of the starting rotations' error (radians).
        perturb_translation: the standard deviation of the starting translations' error.
        perturb_point: the standard deviation of the starting points' error.
        seed: the random seed; the same arguments give the same problem.
        name: the problem's name (default from its sizes and seed).

    Returns:
        A :class:`BALProblem`.

    Raises:
        ValueError: sizes outside the ranges above.

    Example::

        problem = solvers.synthetic_problem(20, 2000, 4, seed=0)    # 8,000 observations
    """
    nc, npt, mean_k = int(num_cameras), int(num_points), float(obs_per_point)
    k = int(np.floor(mean_k))
    if nc < 2 or npt < 1 or not (2 <= k and np.ceil(mean_k) <= nc):
        raise ValueError(f"need num_cameras >= 2, num_points >= 1 and 2 <= obs_per_point <= num_cameras; "
                         f"got {nc}, {npt}, {obs_per_point}")
    rng = np.random.default_rng(seed)
    angles = 2 * np.pi * np.arange(nc) / nc
    centers = np.stack([10 * np.cos(angles), 10 * np.sin(angles), 0.5 * rng.standard_normal(nc)], axis=1)
    w = _look_at_angle_axis(centers)
    t = -rotate(w, centers)
    f = 500.0 + 20.0 * rng.standard_normal(nc)
    k1 = 1e-2 * rng.standard_normal(nc)
    k2 = 1e-3 * rng.standard_normal(nc)
    cameras = np.column_stack([w, t, f, k1, k2])
    points = rng.uniform(-1, 1, size=(npt, 3)) * 2.5
    # Each point is seen by k consecutive cameras around the circle (start at a random camera).
    first = rng.integers(0, nc, size=npt)
    if mean_k == k:
        cam_idx = ((first[:, None] + np.arange(k)[None, :]) % nc).ravel()
        pt_idx = np.repeat(np.arange(npt), k)
    else:
        # Drawn after everything an integer count draws, so integer counts keep their problems.
        counts = k + (rng.random(npt) < mean_k - k)
        pt_idx = np.repeat(np.arange(npt), counts)
        within = np.arange(pt_idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
        cam_idx = (first[pt_idx] + within) % nc
    P = rotate(cameras[cam_idx, 0:3], points[pt_idx]) + cameras[cam_idx, 3:6]
    p = -P[:, :2] / P[:, 2:3]
    r2 = np.sum(p * p, axis=1)
    c = cameras[cam_idx]
    obs = (c[:, 6] * (1 + c[:, 7] * r2 + c[:, 8] * r2 * r2))[:, None] * p
    obs = obs + noise_px * rng.standard_normal(obs.shape)
    # Observations in BAL files are grouped by point, as here; shuffle a little within the file
    # order as real files are sorted by camera: sort by camera to match.
    order = np.lexsort((pt_idx, cam_idx))
    cam_idx, pt_idx, obs = cam_idx[order], pt_idx[order], obs[order]
    init_cams = cameras.copy()
    init_cams[:, 0:3] += perturb_rotation * rng.standard_normal((nc, 3))
    init_cams[:, 3:6] += perturb_translation * rng.standard_normal((nc, 3))
    init_pts = points + perturb_point * rng.standard_normal(points.shape)
    return BALProblem(init_cams, init_pts, cam_idx, pt_idx, obs,
                      name=name or f"synthetic-{nc}-{npt}-{obs_per_point:g}-seed{seed}")
