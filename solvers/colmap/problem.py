"""A COLMAP reconstruction as a :class:`solvers.Problem`, and the solution written back.

Groups: ``poses`` (one row per image: ``cam_from_world`` as angle-axis and translation),
``intrinsics`` (one row per camera, in COLMAP's parameter order; ``intrinsics_<MODEL>`` per model
when the cameras use several), ``points`` (one row per 3-D point). One reprojection residual kind
per camera model (:mod:`solvers.models.cameras`), one residual block per observation of a 3-D point.

    from solvers import colmap
    rec = colmap.read_model("sparse/0")
    prob = colmap.problem_from_reconstruction(rec, refine_principal_point=False)
    result = solvers.solve(prob)
    colmap.update_reconstruction(rec, result)
    colmap.write_model(rec, "sparse/refined")

Rigs of COLMAP 4 with one camera each: the camera is the rig's reference sensor, so its
``cam_from_world`` is the frame's ``rig_from_world``; both are written back.
"""
from __future__ import annotations

import numpy as np

from ..models import cameras
from . import priors as pose_prior
from .model import CAMERA_SENSOR, id_rows
from .rotations import (angle_axis_to_quaternion, matrix_to_quaternion, quaternion_multiply,
                        quaternion_to_angle_axis, quaternion_to_matrix)

_MODEL_IDS = {m.colmap_id: m for m in cameras.MODELS.values() if m.colmap_id is not None}
FIX_CHOICES = ("gauge", "first-two-poses", "none")


def _parameter_kinds(model: cameras.CameraModel):
    """Indices of the focal lengths, principal point, extra parameters and image metadata
    (COLMAP's split; the metadata, EQUIRECTANGULAR's width and height, is never refined)."""
    focal = [i for i, p in enumerate(model.params) if p in ("f", "fx", "fy")]
    pp = [i for i, p in enumerate(model.params) if p in ("cx", "cy")]
    metadata = [i for i, p in enumerate(model.params) if p in model.metadata]
    extra = [i for i in range(model.num_params) if i not in focal and i not in pp and i not in metadata]
    return focal, pp, extra, metadata


def _rows_of(ids, wanted):
    """``(rows, missing)``: the rows of the ids ``wanted`` in ``ids``, and those not there."""
    wanted = np.asarray(wanted, np.int64)
    rows, found = id_rows(ids, wanted)
    return rows, wanted[~found]


def _intrinsics_groups(rec):
    """``(model, group name, camera rows)`` per camera model of ``rec``, by model name: one group
    ``intrinsics``, or ``intrinsics_<MODEL>`` each when the cameras use several."""
    models = [_MODEL_IDS[int(m)] for m in rec.camera_models]
    names = sorted({m.name for m in models})
    return [(cameras.get(name), "intrinsics" if len(names) == 1 else f"intrinsics_{name}",
             np.array([k for k, m in enumerate(models) if m.name == name], np.int64)) for name in names]


def _intrinsics_by_model(rec, image_row):
    """Per camera model of ``rec`` (:func:`_intrinsics_groups`): ``(model, group name, its
    intrinsics table, each observation's row in it or -1 for another model's camera)``, for the
    observations of images ``image_row``. ValueError naming an image's camera that is missing."""
    image_cam, missing = _rows_of(rec.camera_ids, rec.image_camera_ids)
    if missing.size:
        raise ValueError(f"an image uses camera {int(missing[0])}, which the reconstruction does not have")
    obs_cam = image_cam[image_row]
    for m, group, rows in _intrinsics_groups(rec):
        local = np.full(rec.camera_ids.size, -1, np.int64)
        local[rows] = np.arange(rows.size)
        yield m, group, np.array([rec.camera_params[k] for k in rows], np.float64).reshape(rows.size, -1), local[obs_cam]


def observations(rec):
    """``(image_row, point_row, xy)``: every 2-D point that observes a 3-D point, by image."""
    ids = rec.points2d_point3d_ids
    has = np.flatnonzero(ids >= 0)
    # Each observation's image from where the images' 2-D points start: most 2-D points of a
    # model observe nothing (2.4 million of them, 96,000 observations for 200 images).
    image_row = np.searchsorted(rec.image_points_start, has, side="right") - 1
    point_row, missing = _rows_of(rec.point_ids, ids[has])
    if missing.size:
        raise ValueError(f"a 2-D point observes 3-D point {int(missing[0])}, which the reconstruction does not have")
    return image_row, point_row, rec.points2d_xy[has]


def problem_from_reconstruction(model, refine_focal_length: bool = True, refine_principal_point: bool = False,
                                refine_extra_params: bool = True, fix="gauge", loss=None, loss_scale: float = 1.0,
                                dtype=np.float64, device=None, backend: str = "auto",
                                refine_rig_from_world: bool = True, refine_sensor_from_rig: bool = True,
                                constant_rig_from_world_rotation: bool = False, pose_priors=None,
                                prior_loss=None, prior_loss_scale: float = pose_prior.DEFAULT_LOSS_SCALE,
                                prior_fallback_stddev: float = 1.0, prior_seed: int = 0):
    """The bundle adjustment of a COLMAP reconstruction (a :class:`solvers.colmap.Reconstruction`
    or a model folder) as a :class:`solvers.Problem` (module docstring).

    - ``refine_focal_length``, ``refine_principal_point``, ``refine_extra_params``: which
      intrinsics move (COLMAP's ``BundleAdjustmentOptions`` defaults); the others are constant
      entries of every row.
    - ``dtype``, ``device``, ``backend``: as :class:`solvers.Problem` takes them (the type the
      residuals are evaluated in, the OpenCL device, pyclad's backend).
    - ``fix``: ``"gauge"`` removes the 7 gauge degrees of freedom as COLMAP's default
      ``TWO_CAMS_FROM_WORLD`` gauge does: the first image's pose (by id), and one coordinate of
      the translation of the next image whose centre differs: the one along which their
      baseline (the translation of ``first_from_world * inverse(second_from_world)``) is
      largest. ``"first-two-poses"`` holds both poses; a list of image ids
      holds those; ``"none"`` or None nothing (the gauge then stays free: LM's diagonal keeps the
      steps finite).
    - ``loss`` / ``loss_scale``: the robust loss of every observation.
    - Rigs of several sensors: groups ``frames`` (each frame's
      ``rig_from_world``) and ``sensors`` (each non-reference camera's ``sensor_from_rig``);
      ``refine_rig_from_world``, ``refine_sensor_from_rig`` and
      ``constant_rig_from_world_rotation`` are pycolmap's options, with its defaults.
    - ``pose_priors`` (:mod:`solvers.colmap.priors`: a ``PosePriors``, a prior file or pycolmap
      ``PosePrior`` objects): images' positions with covariances, as COLMAP's pose-prior bundle
      adjuster takes them. The problem starts from the reconstruction moved into the priors'
      frame by a robustly estimated similarity (said in ``problem.notes``, which the solve's log
      prints); the priors fix the gauge (``fix="gauge"`` then holds nothing). ``prior_loss``
      (None: trivial, or ``"cauchy"``...) and ``prior_loss_scale`` are their loss's (COLMAP's
      default scale: sqrt(7.815)); ``prior_fallback_stddev`` stands in for a missing covariance;
      ``prior_seed`` seeds the alignment's RANSAC. ``update_reconstruction`` then writes the
      solution, in the priors' frame.
    """
    from .io import read_model
    rec = read_model(model) if isinstance(model, str) else model
    priors_used = None
    notes = []
    if pose_priors is not None:
        rec, priors_used, note = _aligned_to_priors(rec, pose_prior.as_pose_priors(pose_priors),
                                                    prior_fallback_stddev, prior_seed)
        notes.append(note)
        if priors_used is not None and isinstance(fix, str) and fix == "gauge":
            fix = "none"            # the priors fix the 7 degrees of freedom (COLMAP holds nothing)
    for k, mid in enumerate(rec.camera_models):
        if int(mid) not in _MODEL_IDS:
            raise ValueError(f"camera {int(rec.camera_ids[k])} uses COLMAP camera model id {int(mid)}, which "
                             f"solvers.models.cameras does not have; supported: "
                             f"{', '.join(m.name for m in _MODEL_IDS.values())}")
    image_row, point_row, xy = observations(rec)
    # Observations by point: the Schur complement's device kernels read them in that order, so
    # none is gathered per iteration (solvers.general.implicit_schur_device).
    by_point = np.argsort(point_row, kind="stable")
    image_row, point_row, xy = image_row[by_point], point_row[by_point], xy[by_point]
    from ..general.problem import Problem
    prob = Problem(dtype=dtype, device=device, backend=backend, name="colmap")
    prob.notes.extend(notes)
    refine = (refine_focal_length, refine_principal_point, refine_extra_params)
    prior_loss = dict(loss=prior_loss, loss_scale=prior_loss_scale)
    if rec.has_multi_sensor_rigs:
        _rig_problem(prob, rec, image_row, point_row, xy, refine, fix, loss, loss_scale, refine_rig_from_world,
                     refine_sensor_from_rig, constant_rig_from_world_rotation)
        if priors_used is not None:
            rows, data = _prior_rows(rec, priors_used, prior_fallback_stddev, image_row)
            frame_of, sensor_of = image_frames(rec)
            _, srow = sensor_rows(sensor_of, image_row)
            if rows.size:
                prob.add_residual_block(pose_prior.rig_position_prior, ["sensors", "frames"],
                                        index=(srow[rows], frame_of[rows]), data=data,
                                        name="position_prior", **prior_loss)
        return prob
    poses = np.concatenate([quaternion_to_angle_axis(rec.image_qvec), rec.image_tvec], axis=1)
    prob.add_parameter_block("poses", poses)
    prob.add_parameter_block("points", rec.point_xyz)
    for m, group, table, obs_row in _intrinsics_by_model(rec, image_row):
        prob.add_parameter_block(group, table)
        mine = obs_row >= 0
        prob.add_residual_block(m.residual, ["poses", group, "points"],
                                index=(image_row[mine], obs_row[mine], point_row[mine]), data=xy[mine],
                                loss=loss, loss_scale=loss_scale, name=f"reprojection_{m.name}")
        _hold_intrinsics(prob, m, group, refine)
    if priors_used is not None:
        rows, data = _prior_rows(rec, priors_used, prior_fallback_stddev, image_row)
        if rows.size:
            prob.add_residual_block(pose_prior.position_prior, ["poses"], index=(rows,), data=data,
                                    name="position_prior", **prior_loss)
    _fix(prob, rec, fix)
    return prob


def _aligned_to_priors(rec, priors, fallback_stddev, seed):
    """``(reconstruction, priors or None, note)``: ``rec`` moved into the priors' frame (a copy)
    with the priors to use, or ``rec`` as it is and None where fewer than three priors, or no
    similarity with three inliers, leave them unused (COLMAP then solves without them)."""
    rows, missing = _rows_of(rec.image_ids, priors.image_ids)
    if missing.size:
        raise ValueError(f"pose_priors: image {int(missing[0])} is not in the reconstruction ({missing.size} "
                         f"such priors); a prior names a registered image by its id")
    if priors.image_ids.size < 3:
        return rec, None, (f"{priors.image_ids.size} pose priors: fewer than 3, solved without them "
                           f"(with COLMAP's gauge)")
    R = quaternion_to_matrix(rec.image_qvec[rows])
    centres = -np.einsum("nji,nj->ni", R, rec.image_tvec[rows])
    threshold = pose_prior.inlier_threshold(priors.covariances, fallback_stddev)
    found = pose_prior.align(centres, priors.positions, threshold, seed=seed)
    if found is None:
        return rec, None, (f"{priors.image_ids.size} pose priors: no similarity brings 3 camera centres within "
                           f"{threshold:.3g} of their priors; solved without them (with COLMAP's gauge)")
    s, Rs, t, inliers = found
    note = (f"Aligned to {priors.image_ids.size} pose priors: scale {s:.6g}, {int(inliers.sum())} inliers within "
            f"{threshold:.3g}; the priors fix the gauge")
    return transformed(rec, s, Rs, t), priors, note


def transformed(rec, s, R, t):
    """A copy of ``rec`` moved by the similarity ``x -> s R x + t``: points moved, poses'
    rotations turned by ``R^T`` and translations scaled (``cam_from_new_world``), rigs'
    sensor_from_rig translations scaled; the images see the same pixels."""
    import dataclasses
    q_inv = matrix_to_quaternion(R.T[None])[0]

    def poses(qvec, tvec):
        if qvec is None:
            return None, None
        q = quaternion_multiply(qvec, np.broadcast_to(q_inv, qvec.shape))
        Rn = quaternion_to_matrix(q)
        return q, s * tvec - np.einsum("nij,j->ni", Rn, t)
    iq, it = poses(rec.image_qvec, rec.image_tvec)
    fq, ft = poses(rec.frame_qvec, rec.frame_tvec)
    out = dataclasses.replace(rec, point_xyz=s * rec.point_xyz @ R.T + t, image_qvec=iq, image_tvec=it,
                              frame_qvec=fq, frame_tvec=ft, camera_params=[p.copy() for p in rec.camera_params])
    if rec.rig_sensor_tvec is not None:
        out.rig_sensor_tvec = s * rec.rig_sensor_tvec
    return out


def _prior_rows(rec, priors, fallback_stddev, image_row):
    """``(image rows, data)`` of the priors whose images have observations (COLMAP leaves the
    others out): data = the position and the rows of L (12 per prior)."""
    rows, _ = _rows_of(rec.image_ids, priors.image_ids)
    seen = np.zeros(rec.image_ids.size, bool)
    seen[image_row] = True
    keep = seen[rows]
    L = pose_prior.sqrt_information(priors.covariances[keep], fallback_stddev)
    return rows[keep], np.concatenate([priors.positions[keep], L.reshape(-1, 9)], axis=1)


def _hold_intrinsics(prob, m, group, refine):
    """The intrinsics COLMAP holds: those the ``refine`` flags (focal, principal point, extra) leave
    out, and the image metadata always."""
    focal, pp, extra, metadata = _parameter_kinds(m)
    constant = ([] if refine[0] else focal) + ([] if refine[1] else pp) + ([] if refine[2] else extra) + metadata
    if constant:
        prob.set_constant(group, columns=sorted(constant))


def image_frames(rec):
    """``(frame row, non-reference sensor row or -1)`` of every image of a model with rigs: the
    frame holding it, and where its camera is not its rig's reference sensor, the row of that
    sensor in :meth:`Reconstruction.non_ref_sensors`. ValueError naming an image in no frame."""
    n = rec.image_ids.size
    frame_of = np.full(n, -1, np.int64)
    image_rows, _ = _rows_of(rec.image_ids, rec.frame_data[:, 2])
    owner = np.repeat(np.arange(rec.frame_ids.size), np.diff(rec.frame_data_start))
    hit = (rec.frame_data[:, 0] == CAMERA_SENSOR) & np.isin(rec.frame_data[:, 2], rec.image_ids)
    frame_of[image_rows[hit]] = owner[hit]
    if (frame_of < 0).any():
        k = int(np.flatnonzero(frame_of < 0)[0])
        raise ValueError(f"image {int(rec.image_ids[k])} is in no frame: every image of a model with rigs "
                         f"belongs to a frame (frames.txt / frames.bin)")
    start, sensors, _, _, _ = rec.non_ref_sensors()
    sensor_of = np.full(n, -1, np.int64)
    rig_row, _ = _rows_of(rec.rig_ids, rec.frame_rig_ids[frame_of])
    for j in range(sensors.shape[0]):
        rig = int(np.searchsorted(start, j, side="right") - 1)
        mine = (rig_row == rig) & (rec.image_camera_ids == sensors[j, 1]) & (sensors[j, 0] == CAMERA_SENSOR)
        sensor_of[mine] = j
    return frame_of, sensor_of


def _rig_problem(prob, rec, image_row, point_row, xy, refine, fix, loss, loss_scale, refine_rig_from_world,
                 refine_sensor_from_rig, constant_rig_from_world_rotation):
    """A model with rigs of several sensors (pycolmap's default bundle adjuster): an image sees
    through ``sensor_from_rig * rig_from_world``, the composition inside the residual
    (:meth:`solvers.models.cameras.CameraModel.rig_residual`); the reference camera's
    ``sensor_from_rig`` is the identity."""
    frame_of, sensor_of = image_frames(rec)
    start, sensors, has_pose, sq, st = rec.non_ref_sensors()
    used, image_sensor_row = sensor_rows(sensor_of, image_row)
    no_pose = used[~has_pose[used]]
    if no_pose.size:
        rig = int(np.searchsorted(start, no_pose[0], side="right") - 1)
        raise ValueError(f"rig {int(rec.rig_ids[rig])}: camera {int(sensors[no_pose[0], 1])} has images but no "
                         f"sensor_from_rig pose; give it one (rigs.txt) before bundle adjustment")
    prob.add_parameter_block("frames", np.concatenate([quaternion_to_angle_axis(rec.frame_qvec), rec.frame_tvec], 1))
    # Row 0 of "sensors" is the reference cameras' sensor_from_rig, the identity, held: every
    # observation is then one residual kind over (sensor, frame, intrinsics, point), whose rows
    # the plan merges into one camera group for the device-resident core (solvers.general.merged_groups;
    # rotating by a zero angle-axis is exact, so the reference images' residuals are unchanged).
    prob.add_parameter_block("sensors", np.concatenate([np.zeros((1, 6)), np.concatenate(
        [quaternion_to_angle_axis(sq[used]), st[used]], 1)]))
    prob.set_constant("sensors", rows=[0])
    prob.add_parameter_block("points", rec.point_xyz)
    obs_frame, obs_sensor_row = frame_of[image_row], image_sensor_row[image_row]
    for m, group, table, obs_row in _intrinsics_by_model(rec, image_row):
        prob.add_parameter_block(group, table)
        mine = obs_row >= 0
        prob.add_residual_block(m.rig_residual, ["sensors", "frames", group, "points"],
                                index=(obs_sensor_row[mine], obs_frame[mine], obs_row[mine], point_row[mine]),
                                data=xy[mine], loss=loss, loss_scale=loss_scale, name=f"rig_reprojection_{m.name}")
        _hold_intrinsics(prob, m, group, refine)
    if not refine_sensor_from_rig:
        prob.set_constant("sensors")
    if not refine_rig_from_world:
        prob.set_constant("frames")
    elif constant_rig_from_world_rotation:
        prob.set_constant("frames", columns=[0, 1, 2])
    _fix_rig_gauge(prob, rec, fix, frame_of, sensor_of, refine_rig_from_world, refine_sensor_from_rig)


def sensor_rows(sensor_of, image_row):
    """``(used, row of each image)``: the non-reference sensors that observations use (rows of
    :meth:`Reconstruction.non_ref_sensors`), and each image's row in the problem's ``sensors``
    group: 0, the reference cameras' identity, else 1 + the sensor's place among ``used``."""
    used = np.unique(sensor_of[image_row][sensor_of[image_row] >= 0])
    place = np.zeros(int(sensor_of.max()) + 1 if sensor_of.size and sensor_of.max() >= 0 else 1, np.int64)
    place[used] = 1 + np.arange(used.size)
    return used, np.where(sensor_of >= 0, place[np.maximum(sensor_of, 0)], 0)


def _fix_rig_gauge(prob, rec, fix, frame_of, sensor_of, refine_rig_from_world, refine_sensor_from_rig):
    """COLMAP 4's TWO_CAMS_FROM_WORLD with rigs: the frame of the first image (by id) whose camera
    is its rig's reference (any image when sensor_from_rig is held) is held; of the next such image
    in another frame whose baseline from it is not zero, the frame's translation coordinate
    along which that baseline is largest. ``fix``: ``"gauge"``, ``"none"``/None, or frame ids."""
    if fix is None or (isinstance(fix, str) and fix == "none"):
        return
    if not isinstance(fix, str):
        rows, missing = _rows_of(rec.frame_ids, np.atleast_1d(np.asarray(fix, np.int64)))
        if missing.size:
            raise ValueError(f"fix: frame ids {missing.tolist()[:8]} are not in the reconstruction (with rigs, "
                             f"fix names frames)")
        prob.set_constant("frames", rows=rows)
        return
    if fix != "gauge":
        raise ValueError(f"fix={fix!r}: a model with rigs of several sensors takes 'gauge', 'none' or frame ids")
    if not refine_rig_from_world:
        return
    with_obs = np.zeros(rec.image_ids.size, bool)
    with_obs[observations(rec)[0]] = True
    order = [k for k in np.argsort(rec.image_ids, kind="stable") if with_obs[k]
             and (sensor_of[k] < 0 or not refine_sensor_from_rig)]
    if not order:
        return
    f1 = int(frame_of[order[0]])
    prob.set_constant("frames", rows=[f1])
    second = _second_gauge_pose(quaternion_to_matrix(rec.frame_qvec), rec.frame_tvec, f1, frame_of[order[1:]])
    if second is not None:      # (else COLMAP holds three points instead)
        prob.set_constant("frames", rows=[second[0]], columns=[3 + second[1]])


def _second_gauge_pose(R, t, first, candidates):
    """COLMAP's TWO_CAMS_FROM_WORLD, its second pose: of the ``candidates`` (rows of the poses
    ``R``, ``t``, in order; ``first`` among them skipped), the first whose baseline from
    ``first``, the translation of ``first_from_world * inverse(candidate_from_world)``, is not
    zero: ``(row, the coordinate along which the baseline is largest)``, or None where every
    centre is the first's."""
    cand = np.asarray([c for c in candidates if c != first], np.int64)
    if not cand.size:
        return None
    baseline = t[first] - np.einsum("ij,njk,nk->ni", R[first], R[cand].transpose(0, 2, 1), t[cand])
    later = np.flatnonzero(np.abs(baseline).max(axis=1) > 1e-9)
    if not later.size:
        return None
    k = int(later[0])
    return int(cand[k]), int(np.argmax(np.abs(baseline[k])))


def _fix(prob, rec, fix):
    n = rec.image_ids.size
    if fix is None or (isinstance(fix, str) and fix == "none"):
        return
    if isinstance(fix, str):
        if fix not in FIX_CHOICES:
            raise ValueError(f"fix={fix!r} is not one of {FIX_CHOICES} or a list of image ids")
        order = np.argsort(rec.image_ids, kind="stable")
        if n == 0:
            return
        first = int(order[0])
        prob.set_constant("poses", rows=[first])
        if n > 1 and fix == "first-two-poses":
            prob.set_constant("poses", rows=[int(order[1])])
        elif n > 1:
            second = _second_gauge_pose(quaternion_to_matrix(rec.image_qvec), rec.image_tvec, first, order[1:])
            if second is not None:     # else every centre is the first's: the scale is not observable
                prob.set_constant("poses", rows=[second[0]], columns=[3 + second[1]])
        return
    rows, missing = _rows_of(rec.image_ids, np.atleast_1d(np.asarray(fix, np.int64)))
    if missing.size:
        raise ValueError(f"fix: image ids {missing.tolist()[:8]} are not in the reconstruction")
    prob.set_constant("poses", rows=rows)


# What COLMAP counts for an observation it cannot project (CalculateSquaredReprojectionError):
# the largest double, whose square root then enters the point's mean.
_UNPROJECTABLE = float(np.sqrt(np.finfo(np.float64).max))


def point_errors(rec, backend: str = "numpy", device=None) -> np.ndarray:
    """Every 3-D point's mean reprojection error in pixels over its track, as COLMAP's
    ``Reconstruction::UpdatePoint3DErrors`` computes it from ``rec``'s current poses, intrinsics
    and points: 0 for a point without observations; an observation that cannot be projected
    (behind the camera, for the models that check its depth; no real projection) counts
    ``sqrt(DBL_MAX)``, as there.

    The residuals are evaluated by the camera model's batched function with ``backend`` (default
    "numpy": on the host) on ``device``; :func:`problem_from_reconstruction`'s ``backend`` and
    ``device`` reuse the solve's own function and kernels (on the host they took 0.10 s of a
    200-image, 96,000-observation command line on the GPU machine). A device without float64 falls
    back to the host. Both round to within a few units in the last place of each other."""
    backend, device, _ = _errors_on(backend, device)
    image_row, point_row, xy = observations(rec)
    poses = np.concatenate([quaternion_to_angle_axis(rec.image_qvec), rec.image_tvec], axis=1)
    R = quaternion_to_matrix(rec.image_qvec)
    depth = np.einsum("nj,nj->n", R[image_row, 2], rec.point_xyz[point_row]) + rec.image_tvec[image_row, 2]
    err = np.empty(image_row.size)
    for m, _, intrinsics, obs_row in _intrinsics_by_model(rec, image_row):
        mine = np.flatnonzero(obs_row >= 0)
        index = np.stack([image_row[mine], obs_row[mine], point_row[mine]], 1).astype(np.int32)
        with np.errstate(all="ignore"):
            r = m.batch_function(np.float64, backend, device).values([poses, intrinsics, rec.point_xyz], index,
                                                                      data=xy[mine])
            e = np.sqrt(r[:, 0] * r[:, 0] + r[:, 1] * r[:, 1])
        bad = ~np.isfinite(e)
        if m.checks_depth:
            bad |= depth[mine] < cameras.EPS
        err[mine] = np.where(bad, _UNPROJECTABLE, e)
    n = rec.point_ids.size
    counts = np.bincount(point_row, minlength=n)
    sums = np.bincount(point_row, weights=err, minlength=n)
    return np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)


def _errors_on(backend: str, device):
    """``(backend, device, runtime)`` that :func:`point_errors` evaluates with: the host (numpy,
    runtime None) where asked, or where there is no OpenCL device (the solve ran on the host then)
    or it has no float64."""
    if backend == "numpy":
        return "numpy", None, None
    from clkernels import NoPlatformError, get_runtime
    try:
        rt = get_runtime(device)
    except NoPlatformError:
        return "numpy", None, None
    return (backend, device, rt) if rt.info.fp64 else ("numpy", None, None)


def point_error_requests(rec, backend: str = "auto", device=None) -> list:
    """The programs :func:`point_errors` with ``backend`` and ``device`` will build, as requests for
    :func:`clkernels.templates.prefetch` (none on the host): a caller that will write a model
    after a solve hands them to the build workers beside the solve's own."""
    backend, device, rt = _errors_on(backend, device)
    if rt is None:
        return []
    return [m.batch_function(np.float64, backend, device).program_request(rt, jacobians=False)
            for m, _, _ in _intrinsics_groups(rec)]


def update_reconstruction(rec, result, backend: str = "numpy", device=None):
    """Write ``result``, a :class:`solvers.SolveResult` of :func:`problem_from_reconstruction`'s
    problem, back into ``rec`` (poses, frames of one-camera rigs, intrinsics, points) and recompute every
    point's error (:func:`point_errors`, with ``backend`` and ``device``), so a written model says
    what the solve reached; returns ``rec``."""
    p = result.parameters
    if "frames" in p:
        return _update_rigs(rec, p, backend, device)
    poses = p["poses"]
    if poses.shape != (rec.image_ids.size, 6) or p["points"].shape != rec.point_xyz.shape:
        raise ValueError("result is not a solve of this reconstruction's problem (its poses or points "
                         "have other shapes)")
    rec.image_qvec = angle_axis_to_quaternion(poses[:, :3])
    rec.image_tvec = poses[:, 3:].copy()
    rec.point_xyz = p["points"].copy()
    for _, group, rows in _intrinsics_groups(rec):
        for j, k in enumerate(rows):
            rec.camera_params[k] = p[group][j].copy()
    rec.point_error = point_errors(rec, backend, device)
    if rec.has_rigs:
        # One camera per rig: the image's cam_from_world is its frame's rig_from_world.
        row_of_image = {int(i): k for k, i in enumerate(rec.image_ids)}
        s = rec.frame_data_start
        for f in range(rec.frame_ids.size):
            for sensor_type, _, data_id in rec.frame_data[s[f]:s[f + 1]]:
                if int(sensor_type) == 0 and int(data_id) in row_of_image:
                    k = row_of_image[int(data_id)]
                    rec.frame_qvec[f] = rec.image_qvec[k]
                    rec.frame_tvec[f] = rec.image_tvec[k]
    return rec


def _update_rigs(rec, p, backend, device):
    """update_reconstruction of a model with rigs of several sensors: frames, sensors, and each
    image's ``cam_from_world`` composed from them."""
    frames = p["frames"]
    if frames.shape != (rec.frame_ids.size, 6) or p["points"].shape != rec.point_xyz.shape:
        raise ValueError("result is not a solve of this reconstruction's problem (its frames or points "
                         "have other shapes)")
    frame_of, sensor_of = image_frames(rec)
    rec.frame_qvec = angle_axis_to_quaternion(frames[:, :3])
    rec.frame_tvec = frames[:, 3:].copy()
    used, _ = sensor_rows(sensor_of, observations(rec)[0])
    solved = p["sensors"][1:]                   # (row 0: the reference cameras' identity)
    rec.rig_sensor_qvec = rec.rig_sensor_qvec.copy()
    rec.rig_sensor_tvec = rec.rig_sensor_tvec.copy()
    rec.rig_sensor_qvec[used] = angle_axis_to_quaternion(solved[:, :3])
    rec.rig_sensor_tvec[used] = solved[:, 3:]
    rec.point_xyz = p["points"].copy()
    for _, group, rows in _intrinsics_groups(rec):
        for j, k in enumerate(rows):
            rec.camera_params[k] = p[group][j].copy()
    # cam_from_world = sensor_from_rig * rig_from_world (the reference camera: rig_from_world).
    q, t = rec.frame_qvec[frame_of].copy(), rec.frame_tvec[frame_of].copy()
    other = sensor_of >= 0
    if other.any():
        s = sensor_of[other]
        Rs = quaternion_to_matrix(rec.rig_sensor_qvec[s])
        t[other] = np.einsum("nij,nj->ni", Rs, t[other]) + rec.rig_sensor_tvec[s]
        q[other] = quaternion_multiply(rec.rig_sensor_qvec[s], q[other])
    rec.image_qvec, rec.image_tvec = q, t
    rec.point_error = point_errors(rec, backend, device)
    return rec
