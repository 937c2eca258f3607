"""Camera models, each one pyclad-traceable reprojection residual plus its parameter layout.

Every model takes a pose row, an intrinsics row, a point row and the observed pixel, and
returns ``projected - observed`` (2,), as COLMAP's and Ceres' reprojection costs do:

- pose (6): ``cam_from_world`` as an angle-axis rotation ``w`` and a translation ``t``; a world
  point ``X`` is ``P = R(w) X + t`` in the camera's frame (COLMAP's convention: the camera looks
  along +z, so ``u = P.x / P.z``, ``v = P.y / P.z``);
- intrinsics: the model's parameters in COLMAP's order (:attr:`CameraModel.params`);
- point (3), observed (2).

Models: COLMAP's ``SIMPLE_PINHOLE``, ``PINHOLE``, ``SIMPLE_RADIAL``, ``RADIAL`` and ``OPENCV``
with COLMAP's distortion formulas (``src/colmap/sensor/models.h``), and ``SNAVELY``, the BAL
camera split into the same pose and intrinsics ``(f, k1, k2)`` (it looks along -z:
``p = -P.xy / P.z``, ``f (1 + k1 |p|^2 + k2 |p|^4) p``, as :mod:`solvers.models.snavely`).

    from solvers import cameras
    model = cameras.get("OPENCV")
    f = model.batch_function(device=None)          # pyclad.BatchFunction, params (6, 8, 3), data 2
    residuals, (J_pose, J_intrinsics, J_point) = f.values_and_jacobians(
        [poses, intrinsics, points], index=np.stack([image_of_obs, camera_of_obs, point_of_obs], 1),
        data=observed)
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import numpy as np

import pyclad as pc

POSE_SIZE = 6
POINT_SIZE = 3


def _pinhole(k, u, v):
    return k[0] * u + k[1], k[0] * v + k[2]


def _pinhole_xy(k, u, v):
    return k[0] * u + k[2], k[1] * v + k[3]


def _simple_radial(k, u, v):
    radial = k[3] * (u * u + v * v)
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _radial(k, u, v):
    r2 = u * u + v * v
    radial = k[3] * r2 + k[4] * r2 * r2
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _opencv(k, u, v):
    fx, fy, cx, cy, k1, k2, p1, p2 = (k[i] for i in range(8))
    u2, v2, uv = u * u, v * v, u * v
    r2 = u2 + v2
    radial = k1 * r2 + k2 * r2 * r2
    du = u * radial + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u2)
    dv = v * radial + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v2)
    return fx * (u + du) + cx, fy * (v + dv) + cy


def _snavely(k, u, v):
    r2 = u * u + v * v
    distortion = 1.0 + r2 * (k[1] + k[2] * r2)
    return k[0] * distortion * u, k[0] * distortion * v


@dataclasses.dataclass(frozen=True)
class CameraModel:
    """One camera model: its name, COLMAP's model id (None for SNAVELY), the intrinsics' names
    in order, and the map from the normalised image plane to pixels."""
    name: str
    colmap_id: Optional[int]
    params: Tuple[str, ...]
    _to_pixels: Callable = dataclasses.field(repr=False)
    looks_along_minus_z: bool = False   # SNAVELY (BAL): p = -P.xy / P.z

    @property
    def num_params(self) -> int:
        return len(self.params)

    def residual(self, pose, intrinsics, point, observed):
        """``projected - observed`` (2,) of one observation; pyclad-traceable."""
        p = pc.rotate_angle_axis(pose[0:3], point) + pose[3:6]
        u, v = p[0] / p[2], p[1] / p[2]
        if self.looks_along_minus_z:
            u, v = -u, -v
        x, y = self._to_pixels(intrinsics, u, v)
        return [x - observed[0], y - observed[1]]

    def batch_function(self, dtype=np.float64, backend: str = "auto", device=None) -> pc.BatchFunction:
        """The batched residual: ``params=(6, num_params, 3)``, ``data=2`` (traced once per
        model, dtype, backend and device)."""
        return cached_batch_function(self.name, self.residual, (POSE_SIZE, self.num_params, POINT_SIZE), 2,
                                     dtype, backend, device)


_functions: Dict[tuple, pc.BatchFunction] = {}


def cached_batch_function(name: str, fn, params, data: int, dtype, backend: str, device) -> pc.BatchFunction:
    """One ``pyclad.BatchFunction`` of ``fn`` per (function, sizes, dtype, backend, device), so a
    residual is traced, and its kernels built, once per process. The key holds ``fn`` itself (two
    lambdas share a name, not an identity); ``name`` labels it."""
    key = (name, fn, tuple(params), int(data), np.dtype(dtype), backend,
           device if isinstance(device, (str, type(None))) else id(device))
    if key not in _functions:
        _functions[key] = pc.BatchFunction(fn, params=params, data=data, dtype=dtype, backend=backend, device=device)
    return _functions[key]

MODELS: Dict[str, CameraModel] = {m.name: m for m in (
    CameraModel("SIMPLE_PINHOLE", 0, ("f", "cx", "cy"), _pinhole),
    CameraModel("PINHOLE", 1, ("fx", "fy", "cx", "cy"), _pinhole_xy),
    CameraModel("SIMPLE_RADIAL", 2, ("f", "cx", "cy", "k"), _simple_radial),
    CameraModel("RADIAL", 3, ("f", "cx", "cy", "k1", "k2"), _radial),
    CameraModel("OPENCV", 4, ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"), _opencv),
    CameraModel("SNAVELY", None, ("f", "k1", "k2"), _snavely, looks_along_minus_z=True),
)}


def get(name) -> CameraModel:
    """The model of a name (``"OPENCV"``, case-insensitive) or of a COLMAP model id (``4``)."""
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        for m in MODELS.values():
            if m.colmap_id == int(name):
                return m
        ids = sorted(m.colmap_id for m in MODELS.values() if m.colmap_id is not None)
        raise ValueError(f"camera model id {int(name)} is not supported; supported COLMAP ids: {ids} "
                         f"({', '.join(m.name for m in MODELS.values() if m.colmap_id is not None)})")
    if isinstance(name, str) and name.upper() in MODELS:
        return MODELS[name.upper()]
    raise ValueError(f"camera model {name!r} is not supported; supported: {', '.join(MODELS)}")
