"""Camera models, each one pyclad-traceable reprojection residual plus its parameter layout.

Every model takes a pose row, an intrinsics row, a point row and the observed pixel, and
returns ``projected - observed`` (2,), as COLMAP's and Ceres' reprojection costs do:

- pose (6): ``cam_from_world`` as an angle-axis rotation ``w`` and a translation ``t``; a world
  point ``X`` is ``P = R(w) X + t`` in the camera's frame (COLMAP's convention: the camera looks
  along +z, so ``u = P.x / P.z``, ``v = P.y / P.z``);
- intrinsics: the model's parameters in COLMAP's order (:attr:`CameraModel.params`);
- point (3), observed (2).

Models: every camera model of COLMAP 4 (pycolmap 4.2's 18, ids 0-17: the pinhole, radial and
OpenCV models, the fisheye, thin-prism, FOV, division, EUCM and equirectangular ones) with
COLMAP's projection formulas (``src/colmap/sensor/models.h``; only the projection: bundle
adjustment never undistorts, where COLMAP iterates), and ``SNAVELY``, the BAL
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


# Each map takes the intrinsics ``k`` and the point in the camera's frame ``p`` (3,) and gives
# the pixel. Pinhole-type models first divide by the depth (:func:`_normal`); fisheye-type ones
# then map the normalised point to its angle (:func:`_fisheye`); the division, EUCM and
# equirectangular models work on the 3-D point. The formulas and their order of operations are
# COLMAP's (src/colmap/sensor/models.h); the tests hold them to pycolmap's img_from_cam.
# Like COLMAP's reprojection cost, none refuses a point behind the camera.
EPS = float(np.finfo(np.float64).eps)


def _normal(p):
    return p[0] / p[2], p[1] / p[2]


def _fisheye(u, v):
    """COLMAP's fisheye mapping of a normalised point: scaled by ``atan(r) / r`` (r > eps)."""
    r = pc.sqrt(u * u + v * v)
    far = r > EPS
    safe = pc.where(far, r, 1.0)          # keeps the untaken branch's derivative finite at r = 0
    scale = pc.atan(safe) / safe
    return pc.where(far, u * scale, u), pc.where(far, v * scale, v)


def _pinhole(k, p):
    u, v = _normal(p)
    return k[0] * u + k[1], k[0] * v + k[2]


def _pinhole_xy(k, p):
    u, v = _normal(p)
    return k[0] * u + k[2], k[1] * v + k[3]


def _simple_radial(k, p):
    u, v = _normal(p)
    radial = k[3] * (u * u + v * v)
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _radial(k, p):
    u, v = _normal(p)
    r2 = u * u + v * v
    radial = k[3] * r2 + k[4] * r2 * r2
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _opencv(k, p):
    u, v = _normal(p)
    fx, fy, cx, cy, k1, k2, p1, p2 = (k[i] for i in range(8))
    u2, v2, uv = u * u, v * v, u * v
    r2 = u2 + v2
    radial = k1 * r2 + k2 * r2 * r2
    du = u * radial + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u2)
    dv = v * radial + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v2)
    return fx * (u + du) + cx, fy * (v + dv) + cy


def _full_opencv(k, p):
    u, v = _normal(p)
    fx, fy, cx, cy, k1, k2, p1, p2, k3, k4, k5, k6 = (k[i] for i in range(12))
    u2, v2, uv = u * u, v * v, u * v
    r2 = u2 + v2
    r4 = r2 * r2
    r6 = r4 * r2
    radial = (1.0 + k1 * r2 + k2 * r4 + k3 * r6) / (1.0 + k4 * r2 + k5 * r4 + k6 * r6)
    du = u * radial + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u2) - u
    dv = v * radial + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v2) - v
    return fx * (u + du) + cx, fy * (v + dv) + cy


def _fov(k, p):
    u, v = _normal(p)
    fx, fy, cx, cy, omega = (k[i] for i in range(5))
    r2 = u * u + v * v
    o2 = omega * omega
    small_omega = o2 < 1e-4
    small_r = r2 < 1e-4
    # Each branch on safe operands, so the untaken ones stay finite (and their derivatives 0).
    w_safe = pc.where(small_omega, 1.0, omega)
    t = pc.tan(w_safe / 2.0)
    near_axis = (-2.0 * t * (4.0 * r2 * t * t - 3.0)) / (3.0 * w_safe)
    r = pc.sqrt(pc.where(small_r, 1.0, r2))
    general = pc.atan(r * 2.0 * t) / (r * w_safe)
    factor = pc.where(small_omega, (o2 * r2) / 3.0 - o2 / 12.0 + 1.0, pc.where(small_r, near_axis, general))
    return fx * (u * factor) + cx, fy * (v * factor) + cy


def _simple_radial_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    radial = k[3] * (u * u + v * v)
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _radial_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    t2 = u * u + v * v
    t4 = t2 * t2
    radial = k[3] * t2 + k[4] * t4
    return k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]


def _opencv_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    fx, fy, cx, cy, k1, k2, k3, k4 = (k[i] for i in range(8))
    t2 = u * u + v * v
    t4 = t2 * t2
    t6 = t4 * t2
    t8 = t4 * t4
    radial = k1 * t2 + k2 * t4 + k3 * t6 + k4 * t8
    return fx * (u + u * radial) + cx, fy * (v + v * radial) + cy


def _thin_prism_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    fx, fy, cx, cy, k1, k2, p1, p2, k3, k4, sx1, sy1 = (k[i] for i in range(12))
    u2, v2, uv = u * u, v * v, u * v
    r2 = u2 + v2
    r4 = r2 * r2
    r6 = r4 * r2
    r8 = r6 * r2
    radial = k1 * r2 + k2 * r4 + k3 * r6 + k4 * r8
    du = u * radial + 2.0 * p1 * uv + p2 * (r2 + 2.0 * u2) + sx1 * r2
    dv = v * radial + 2.0 * p2 * uv + p1 * (r2 + 2.0 * v2) + sy1 * r2
    return fx * (u + du) + cx, fy * (v + dv) + cy


def _rad_tan_thin_prism_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    fx, fy, cx, cy = (k[i] for i in range(4))
    t2 = u * u + v * v
    theta, power = 1.0, 1.0
    for i in range(6):                  # 1 + k0 t^2 + k1 t^4 + ... + k5 t^12
        power = power * t2
        theta = theta + k[4 + i] * power
    p0, p1, s0, s1, s2, s3 = (k[i] for i in range(10, 16))
    X, Y = theta * u, theta * v
    x2, y2, xy = X * X, Y * Y, X * Y
    r2 = x2 + y2
    r4 = r2 * r2
    du = (X + (2.0 * p1 * xy + p0 * (r2 + 2.0 * x2)) + (s0 * r2 + s1 * r4)) - u
    dv = (Y + (2.0 * p0 * xy + p1 * (r2 + 2.0 * y2)) + (s2 * r2 + s3 * r4)) - v
    return fx * (u + du) + cx, fy * (v + dv) + cy


def _division_scale(k, p):
    """The division model's ``2 / (w + sqrt(w^2 - 4 k rho^2))`` on the 3-D point (no division by
    the depth first; COLMAP refuses a negative discriminant, whose square root here is NaN)."""
    rho2 = p[0] * p[0] + p[1] * p[1]
    return 2.0 / (p[2] + pc.sqrt(p[2] * p[2] - 4.0 * rho2 * k))


def _simple_division(k, p):
    r = _division_scale(k[3], p)
    return k[0] * r * p[0] + k[1], k[0] * r * p[1] + k[2]


def _division(k, p):
    r = _division_scale(k[4], p)
    return k[0] * r * p[0] + k[2], k[1] * r * p[1] + k[3]


def _simple_fisheye(k, p):
    u, v = _fisheye(*_normal(p))
    return k[0] * u + k[1], k[0] * v + k[2]


def _fisheye_xy(k, p):
    u, v = _fisheye(*_normal(p))
    return k[0] * u + k[2], k[1] * v + k[3]


def _eucm(k, p):
    fx, fy, cx, cy, alpha, beta = (k[i] for i in range(6))
    rho = pc.sqrt(beta * (p[0] * p[0] + p[1] * p[1]) + p[2] * p[2])
    den = alpha * rho + (1.0 - alpha) * p[2]
    return fx * (p[0] / den) + cx, fy * (p[1] / den) + cy


def _equirectangular(k, p):
    horizontal = pc.sqrt(p[0] * p[0] + p[2] * p[2])
    theta = pc.atan2(p[0], p[2])
    phi = pc.atan2(-p[1], horizontal)
    return (theta / (2.0 * np.pi) + 0.5) * k[0], (0.5 - phi / np.pi) * k[1]


def _snavely(k, p):
    u, v = _normal(p)
    u, v = -u, -v                       # BAL's camera looks along -z
    r2 = u * u + v * v
    distortion = 1.0 + r2 * (k[1] + k[2] * r2)
    return k[0] * distortion * u, k[0] * distortion * v


@dataclasses.dataclass(frozen=True)
class CameraModel:
    """One camera model: its name, COLMAP's model id (None for SNAVELY), the intrinsics' names
    in order (pycolmap's ``params_info``), and the map from the camera's frame to pixels."""
    name: str
    colmap_id: Optional[int]
    params: Tuple[str, ...]
    _to_pixels: Callable = dataclasses.field(repr=False)
    looks_along_minus_z: bool = False   # SNAVELY (BAL): p = -P.xy / P.z
    # Parameters that describe the image, not the lens (EQUIRECTANGULAR's width and height):
    # COLMAP's bundle adjustment never refines them.
    metadata: Tuple[str, ...] = ()
    # Whether COLMAP refuses to project a point whose depth is below machine epsilon (all but
    # the division and equirectangular models, which project the 3-D point as it is).
    checks_depth: bool = True

    @property
    def num_params(self) -> int:
        return len(self.params)

    def residual(self, pose, intrinsics, point, observed):
        """``projected - observed`` (2,) of one observation; pyclad-traceable."""
        p = pc.rotate_angle_axis(pose[0:3], point) + pose[3:6]
        return self.pixel_residual(intrinsics, p, observed)

    def rig_residual(self, sensor, frame, intrinsics, point, observed):
        """The residual of an image of a rig's non-reference camera: the point moved by its
        frame's ``rig_from_world``, then by the camera's ``sensor_from_rig`` (COLMAP 4's
        ``cam_from_world = sensor_from_rig * rig_from_world``); both poses angle-axis and t."""
        in_rig = pc.rotate_angle_axis(frame[0:3], point) + frame[3:6]
        p = pc.rotate_angle_axis(sensor[0:3], in_rig) + sensor[3:6]
        return self.pixel_residual(intrinsics, p, observed)

    def pixel_residual(self, intrinsics, p, observed):
        """``projected - observed`` of the point ``p`` in the camera's frame; as COLMAP's
        reprojection cost, 0 (with zero derivatives) for a point the model cannot project:
        behind the camera (depth below machine epsilon), for the models that check the depth."""
        x, y = self._to_pixels(intrinsics, p)
        r = [x - observed[0], y - observed[1]]
        if self.checks_depth:
            front = p[2] >= EPS
            r = [pc.where(front, r[0], 0.0), pc.where(front, r[1], 0.0)]
        return r

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
    CameraModel("OPENCV_FISHEYE", 5, ("fx", "fy", "cx", "cy", "k1", "k2", "k3", "k4"), _opencv_fisheye),
    CameraModel("FULL_OPENCV", 6, ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
                _full_opencv),
    CameraModel("FOV", 7, ("fx", "fy", "cx", "cy", "omega"), _fov),
    CameraModel("SIMPLE_RADIAL_FISHEYE", 8, ("f", "cx", "cy", "k"), _simple_radial_fisheye),
    CameraModel("RADIAL_FISHEYE", 9, ("f", "cx", "cy", "k1", "k2"), _radial_fisheye),
    CameraModel("THIN_PRISM_FISHEYE", 10, ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3", "k4", "sx1", "sy1"),
                _thin_prism_fisheye),
    CameraModel("RAD_TAN_THIN_PRISM_FISHEYE", 11, ("fx", "fy", "cx", "cy", "k0", "k1", "k2", "k3", "k4", "k5",
                                                   "p0", "p1", "s0", "s1", "s2", "s3"), _rad_tan_thin_prism_fisheye),
    CameraModel("SIMPLE_DIVISION", 12, ("f", "cx", "cy", "k"), _simple_division, checks_depth=False),
    CameraModel("DIVISION", 13, ("fx", "fy", "cx", "cy", "k"), _division, checks_depth=False),
    CameraModel("SIMPLE_FISHEYE", 14, ("f", "cx", "cy"), _simple_fisheye),
    CameraModel("FISHEYE", 15, ("fx", "fy", "cx", "cy"), _fisheye_xy),
    CameraModel("EUCM", 16, ("fx", "fy", "cx", "cy", "alpha", "beta"), _eucm),
    CameraModel("EQUIRECTANGULAR", 17, ("w", "h"), _equirectangular, metadata=("w", "h"),
                checks_depth=False),
    # (BAL's camera: Ceres' residual, solvers.models.snavely, has no depth check.)
    CameraModel("SNAVELY", None, ("f", "k1", "k2"), _snavely, looks_along_minus_z=True, checks_depth=False),
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
