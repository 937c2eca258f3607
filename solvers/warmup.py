"""The bundle adjuster's recipes for ``python -m clkernels warmup`` (:mod:`clkernels.warmup`).

Each recipe lists tiny solves that make the programs a real solve of that family makes: the
programs do not depend on the problem's size (sizes are kernel arguments), only on the family:
the linear solver, the dtype, the camera model, a camera per image or shared, the loss. The
solves' results are thrown away; what stays is the binary cache.
"""
from __future__ import annotations

import numpy as np

from .linalg.linear_solver import SCHUR_METHODS, linear_solver

# The losses a command line offers; the loss is a render parameter of the device iterations.
LOSSES = ("trivial", "huber", "cauchy", "soft_l1")


def _dtypes(rt):
    """float64 where the device has fp64, and float32; the skipped ones with why."""
    if rt.info.fp64:
        return [np.float64, np.float32], []
    return [np.float32], [("float64", f"{rt.info.name!r} has no fp64 (cl_khr_fp64)")]


def bal(rt):
    """BAL problems (the Snavely camera): each linear solver, dtype and loss."""
    from .bal.synthetic import synthetic_problem
    from .ba import observations_device as dobs
    from . import bundle_adjust
    problem = synthetic_problem(8, 200, 3, seed=0)
    dtypes, skipped = _dtypes(rt)
    tasks = []
    for dt in dtypes:
        for ls in (m for m in SCHUR_METHODS if dt in linear_solver(m).dtypes):   # the device's dtypes
            for loss in LOSSES:
                tasks.append((f"{ls} {np.dtype(dt).name} {loss}",
                              lambda ls=ls, dt=dt, loss=loss: bundle_adjust(
                                  problem, linear_solver=ls, dtype=dt, loss=loss, max_iterations=1,
                                  device=rt.device, handle_sigint=False)))
    if not rt.info.is_cpu and rt.info.fp64:
        # The mixed-precision solve's programs, which GPUs take from 8,192 unknowns on (size is
        # no render parameter: a tiny solve with it forced builds what a large one uses).
        tasks.append(("sparse_schur float64 mixed-precision solves",
                      lambda: bundle_adjust(problem, linear_solver="sparse_schur", max_iterations=1,
                                            mixed_precision_solves=True, device=rt.device, handle_sigint=False)))
    if dobs.wanted(rt, dobs.MIN_OBSERVATIONS, None):
        # The device setup's programs (the observations ordered on the device, the Schur pattern
        # made there), which a device like this one takes for large problems: forced on a tiny solve.
        for dt in dtypes:
            ls = "sparse_schur" if dt in linear_solver("sparse_schur").dtypes else "iterative_schur"
            tasks.append((f"{ls} {np.dtype(dt).name} observations ordered on the device",
                          lambda dt=dt, ls=ls: bundle_adjust(problem, linear_solver=ls, dtype=dt, max_iterations=1,
                                                             device_setup=True, device=rt.device,
                                                             handle_sigint=False)))
    return tasks, skipped


def tiny_reconstruction(model: str, per_image: bool, n_images: int = 5, n_points: int = 30, seed: int = 0):
    """A small :class:`solvers.colmap.Reconstruction` of ``model`` cameras (one per image, or one
    shared) seeing every point: images in a row looking along +z at points about 5 units away.
    The observations are the pinhole projections plus noise: good enough to solve, not to test."""
    from .models.cameras import MODELS
    from .colmap import CAMERA_MODELS, Reconstruction
    rng = np.random.default_rng(seed)
    mid = CAMERA_MODELS[model][0]
    nc = n_images if per_image else 1
    f, cx, cy = 400.0, 320.0, 240.0
    values = {"f": f, "fx": f, "fy": f, "cx": cx, "cy": cy}      # distortion terms 0
    one = np.array([values.get(name, 0.0) for name in MODELS[model].params])
    params = [one.copy() for _ in range(nc)]
    xyz = rng.uniform(-1, 1, (n_points, 3))
    centres = np.stack([np.linspace(-1, 1, n_images), np.zeros(n_images), np.full(n_images, -5.0)], axis=1)
    uv = (xyz[None, :, :2] - centres[:, None, :2]) / (xyz[None, :, 2:] - centres[:, None, 2:])
    xy = np.stack([f * uv[..., 0] + cx, f * uv[..., 1] + cy], axis=-1) + rng.normal(0, 0.5, uv.shape)
    ids = np.arange(1, n_images + 1)
    return Reconstruction(
        camera_ids=np.arange(1, nc + 1), camera_models=np.full(nc, mid), camera_sizes=np.tile([640, 480], (nc, 1)),
        camera_params=params, image_ids=ids, image_qvec=np.tile([1.0, 0, 0, 0], (n_images, 1)),
        image_tvec=-centres, image_camera_ids=ids if per_image else np.ones(n_images, np.int64),
        image_names=[f"{i}.png" for i in ids], image_points_start=np.arange(0, (n_images + 1) * n_points, n_points),
        points2d_xy=xy.reshape(-1, 2), points2d_point3d_ids=np.tile(np.arange(1, n_points + 1), n_images),
        point_ids=np.arange(1, n_points + 1), point_xyz=xyz, point_rgb=np.zeros((n_points, 3), np.uint8),
        point_error=np.zeros(n_points), track_start=np.arange(0, (n_points + 1) * n_images, n_images),
        track_image_ids=np.repeat(ids[None, :], n_points, axis=0).ravel(),
        track_point2d_idx=np.repeat(np.arange(n_points)[:, None], n_images, axis=1).ravel())


def colmap(rt):
    """COLMAP reconstructions: each supported camera model, a camera per image and shared, both
    linear solvers, the trivial and Cauchy losses, in float64 (float32 where the device lacks fp64)."""
    from .models.cameras import MODELS
    from .colmap.problem import problem_from_reconstruction
    from .solve import solve
    dtypes, skipped = _dtypes(rt)
    dt = dtypes[0]
    tasks = []
    for model in (m for m, cm in MODELS.items() if cm.colmap_id is not None):
        for per_image in (True, False):
            rec = tiny_reconstruction(model, per_image)
            for loss in ("trivial", "cauchy"):
                prob = problem_from_reconstruction(rec, loss=loss, dtype=dt, device=rt.device)
                for ls in SCHUR_METHODS:
                    tasks.append((f"{model} {'per-image' if per_image else 'shared'} {loss} {ls}",
                                  lambda prob=prob, ls=ls: solve(prob, linear_solver=ls, max_iterations=1,
                                                                 handle_sigint=False)))
    return tasks, skipped
