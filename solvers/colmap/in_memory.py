"""pycolmap reconstructions in memory: converted to and from :class:`Reconstruction` without a
file, and bundle-adjusted in place.

    import pycolmap
    from solvers import colmap
    rec = pycolmap.Reconstruction("sparse/0")
    result = colmap.bundle_adjust(rec)         # solved; rec's poses, intrinsics, points updated

pycolmap is imported here only, when one of these functions is called: the rest of
:mod:`solvers.colmap` works without it. What :func:`from_pycolmap` takes is what pycolmap's own
writer would write: the cameras, the rigs, the registered frames and their images, the 3-D points.
"""
from __future__ import annotations

import numpy as np

from .model import CAMERA_SENSOR, Reconstruction, validate


def _pycolmap():
    try:
        import pycolmap
    except ImportError as e:            # optional: named with how to get it
        raise ImportError(f"solvers.colmap's pycolmap functions need pycolmap ({e}); "
                          f"pip install pycolmap") from e
    return pycolmap


def _qt(pose):
    """A pycolmap Rigid3d as COLMAP's files store it: ``(qw, qx, qy, qz)`` and the translation."""
    x, y, z, w = pose.rotation.quat
    return [w, x, y, z], list(pose.translation)


def _rigid(pycolmap, q, t):
    qw, qx, qy, qz = (float(v) for v in q)
    return pycolmap.Rigid3d(pycolmap.Rotation3d([qx, qy, qz, qw]), np.asarray(t, np.float64))


def _member(enum, value):
    """The member of a pycolmap enum (SensorType, CameraModelId) whose value is ``value``."""
    return next(m for m in enum.__members__.values() if int(m.value) == int(value))


def _sensor_type(pycolmap, value):
    return _member(pycolmap.SensorType, value)


def from_pycolmap(reconstruction, observed_only: bool = False) -> Reconstruction:
    """A :class:`Reconstruction` of a ``pycolmap.Reconstruction`` (nothing shared: the arrays are
    copies); validated as :func:`solvers.colmap.read_model` validates what it reads.

    ``observed_only``: each image keeps only its 2-D points that observe a 3-D point (the tracks
    renumbered to match), what a bundle adjustment reads: reading a 2-D point from pycolmap costs
    about a microsecond, and images often hold ten times more keypoints than observations. Such a
    model updates its reconstruction in place (:func:`to_pycolmap`), but is no whole model to
    write."""
    pycolmap = _pycolmap()
    rec = reconstruction
    if not isinstance(rec, pycolmap.Reconstruction):
        raise TypeError(f"reconstruction must be a pycolmap.Reconstruction, got {type(rec).__name__}")
    cameras, all_images, all_points = rec.cameras, rec.images, rec.points3D
    cams = [cameras[c] for c in sorted(cameras)]
    image_ids = sorted(int(i) for i in rec.reg_image_ids())
    images = [all_images[i] for i in image_ids]
    xy, ids, counts, qvec, tvec, kept = [], [], [], [], [], {}
    for iid, im in zip(image_ids, images):
        if observed_only:
            kept[iid] = np.asarray(im.get_observation_point2D_idxs(), np.int64)
            pts = im.get_observation_points2D()
        else:
            pts = im.points2D
        # x(), y() and the id per point: cheaper than an array per point (p.xy). An id of
        # 2**64 - 1 (none) reads as -1 in int64, as the files' readers hold it.
        flat = np.array([v for p in pts for v in (p.x(), p.y())], np.float64).reshape(-1, 2)
        counts.append(len(flat))
        xy.append(flat)
        ids.append(np.array([p.point3D_id for p in pts], np.uint64).view(np.int64))
        q, t = _qt(im.cam_from_world())
        qvec.append(q)
        tvec.append(t)
    point_ids = sorted(int(p) for p in all_points)
    points = [all_points[p] for p in point_ids]
    tracks = [[(e.image_id, e.point2D_idx) for e in p.track.elements] for p in points]
    track = np.array([e for t in tracks for e in t], np.int64).reshape(-1, 2)
    if observed_only and track.size:        # point2D_idx into each image's kept points
        width = int(max([int(k.max()) + 1 for k in kept.values() if k.size] + [1]))
        image_row = np.searchsorted(np.array(image_ids, np.int64), track[:, 0])
        keys = np.concatenate([r * width + kept[i] for r, i in enumerate(image_ids)])   # (row, old index)
        order = np.argsort(keys, kind="stable")
        position = order[np.searchsorted(keys, image_row * width + track[:, 1], sorter=order)]
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        track[:, 1] = position - first[image_row]

    def starts(n):
        return np.concatenate([[0], np.cumsum(n, dtype=np.int64)]).astype(np.int64)
    out = Reconstruction(
        camera_ids=np.array([c.camera_id for c in cams], np.int64),
        camera_models=np.array([int(c.model.value) for c in cams], np.int64),
        camera_sizes=np.array([(c.width, c.height) for c in cams], np.int64).reshape(-1, 2),
        camera_params=[np.array(c.params, np.float64) for c in cams],
        image_ids=np.array(image_ids, np.int64), image_qvec=np.array(qvec, np.float64).reshape(-1, 4),
        image_tvec=np.array(tvec, np.float64).reshape(-1, 3),
        image_camera_ids=np.array([im.camera_id for im in images], np.int64),
        image_names=[im.name for im in images], image_points_start=starts(counts),
        points2d_xy=np.concatenate(xy) if xy else np.zeros((0, 2)),
        points2d_point3d_ids=np.concatenate(ids) if ids else np.zeros(0, np.int64),
        point_ids=np.array(point_ids, np.int64),
        point_xyz=np.array([p.xyz for p in points], np.float64).reshape(-1, 3),
        point_rgb=np.array([p.color for p in points], np.int64).reshape(-1, 3).astype(np.uint8),
        point_error=np.array([p.error for p in points], np.float64),
        track_start=starts([len(t) for t in tracks]), track_image_ids=track[:, 0].copy(),
        track_point2d_idx=track[:, 1].copy())
    rigs = [rec.rigs[r] for r in sorted(rec.rigs)]
    frames = [rec.frames[f] for f in sorted(int(f) for f in rec.reg_frame_ids())]
    out.rig_ids = np.array([r.rig_id for r in rigs], np.int64)
    out.rig_ref_sensors = np.array([(int(r.ref_sensor_id.type.value), r.ref_sensor_id.id) for r in rigs],
                                   np.int64).reshape(-1, 2)
    # Sensors and frame data sorted by (type, id), as pycolmap's writer orders them.
    others = [sorted(r.non_ref_sensors.items(), key=lambda sp: (int(sp[0].type.value), sp[0].id)) for r in rigs]
    flat = [s for o in others for s in o]
    out.rig_sensor_start = starts([len(o) for o in others])
    out.rig_sensors = np.array([(int(s.type.value), s.id) for s, _ in flat], np.int64).reshape(-1, 2)
    out.rig_sensor_has_pose = np.array([pose is not None for _, pose in flat], bool)
    poses = [_qt(pose) if pose is not None else ([0.0] * 4, [0.0] * 3) for _, pose in flat]
    out.rig_sensor_qvec = np.array([q for q, _ in poses], np.float64).reshape(-1, 4)
    out.rig_sensor_tvec = np.array([t for _, t in poses], np.float64).reshape(-1, 3)
    out.frame_ids = np.array([f.frame_id for f in frames], np.int64)
    out.frame_rig_ids = np.array([f.rig_id for f in frames], np.int64)
    fq = [_qt(f.rig_from_world) for f in frames]
    out.frame_qvec = np.array([q for q, _ in fq], np.float64).reshape(-1, 4)
    out.frame_tvec = np.array([t for _, t in fq], np.float64).reshape(-1, 3)
    data = [sorted((int(d.sensor_id.type.value), d.sensor_id.id, d.id) for d in f.data_ids) for f in frames]
    out.frame_data_start = starts([len(d) for d in data])
    out.frame_data = np.array([d for fd in data for d in fd], np.int64).reshape(-1, 3)
    validate(out)
    return out


def to_pycolmap(model: Reconstruction, reconstruction=None):
    """``model`` as a ``pycolmap.Reconstruction``: written into ``reconstruction`` (the one it was
    read from, or one with the same cameras, rigs, frames, images and points) in place, or a new
    one. In place, what a bundle adjustment changes is set: camera parameters, rigs' sensor poses,
    frames' (or, without rigs, images') poses, the points' positions and errors. Returns it."""
    pycolmap = _pycolmap()
    validate(model)
    if reconstruction is None:
        return _new(pycolmap, model)
    rec = reconstruction
    if not isinstance(rec, pycolmap.Reconstruction):
        raise TypeError(f"reconstruction must be a pycolmap.Reconstruction or None, got {type(rec).__name__}")
    # The maps read once: each read of one is a call into pycolmap.
    cameras, images, points, rigs, frames = rec.cameras, rec.images, rec.points3D, rec.rigs, rec.frames
    missing = [("camera", int(c)) for c in model.camera_ids if int(c) not in cameras] + \
        [("image", int(i)) for i in model.image_ids if int(i) not in images] + \
        [("3-D point", int(p)) for p in model.point_ids if int(p) not in points]
    if missing:
        raise ValueError(f"reconstruction has no {missing[0][0]} {missing[0][1]} of the model ({len(missing)} "
                         f"missing): pass the reconstruction the model came from, or None for a new one")
    for k, cid in enumerate(model.camera_ids):
        cameras[int(cid)].params = model.camera_params[k]
    if model.has_rigs:
        start, sensors, has_pose, qvec, tvec = model.non_ref_sensors()
        for k, rid in enumerate(model.rig_ids):
            rig = rigs[int(rid)]
            for j in range(start[k], start[k + 1]):
                if has_pose[j]:
                    sensor = pycolmap.sensor_t(_sensor_type(pycolmap, sensors[j, 0]), int(sensors[j, 1]))
                    rig.set_sensor_from_rig(sensor, _rigid(pycolmap, qvec[j], tvec[j]))
        for k, fid in enumerate(model.frame_ids):
            frames[int(fid)].rig_from_world = _rigid(pycolmap, model.frame_qvec[k], model.frame_tvec[k])
    else:
        for k, iid in enumerate(model.image_ids):
            im = images[int(iid)]
            frames[im.frame_id].set_cam_from_world(im.camera_id, _rigid(pycolmap, model.image_qvec[k],
                                                                            model.image_tvec[k]))
    for k, pid in enumerate(model.point_ids):
        p = points[int(pid)]
        p.xyz, p.error = model.point_xyz[k], float(model.point_error[k])
    return rec


def _new(pycolmap, model: Reconstruction):
    rec = pycolmap.Reconstruction()
    image_rows = {int(i): k for k, i in enumerate(model.image_ids)}
    cameras = []
    for k, cid in enumerate(model.camera_ids):
        cameras.append(pycolmap.Camera(camera_id=int(cid), model=_model_name(pycolmap, model.camera_models[k]),
                                       width=int(model.camera_sizes[k, 0]), height=int(model.camera_sizes[k, 1]),
                                       params=np.asarray(model.camera_params[k], np.float64)))

    def image(k):
        s, e = model.image_points_start[k], model.image_points_start[k + 1]
        return pycolmap.Image(name=model.image_names[k], keypoints=model.points2d_xy[s:e],
                              camera_id=int(model.image_camera_ids[k]), image_id=int(model.image_ids[k]))
    if not model.has_rigs:           # a classic model: a rig per camera, a frame per image
        for cam in cameras:
            rec.add_camera_with_trivial_rig(cam)
        for k in range(model.image_ids.size):
            rec.add_image_with_trivial_frame(image(k), _rigid(pycolmap, model.image_qvec[k], model.image_tvec[k]))
    else:
        for cam in cameras:
            rec.add_camera(cam)
        start, sensors, has_pose, qvec, tvec = model.non_ref_sensors()
        for k, rid in enumerate(model.rig_ids):
            rig = pycolmap.Rig(rig_id=int(rid))
            t, sid = model.rig_ref_sensors[k]
            rig.add_ref_sensor(pycolmap.sensor_t(_sensor_type(pycolmap, t), int(sid)))
            for j in range(start[k], start[k + 1]):
                pose = _rigid(pycolmap, qvec[j], tvec[j]) if has_pose[j] else None
                rig.add_sensor(pycolmap.sensor_t(_sensor_type(pycolmap, sensors[j, 0]), int(sensors[j, 1])), pose)
            rec.add_rig(rig)
        s = model.frame_data_start
        for k, fid in enumerate(model.frame_ids):
            frame = pycolmap.Frame(frame_id=int(fid), rig_id=int(model.frame_rig_ids[k]))
            frame.rig_from_world = _rigid(pycolmap, model.frame_qvec[k], model.frame_tvec[k])
            for t, sid, did in model.frame_data[s[k]:s[k + 1]]:
                frame.add_data_id(pycolmap.data_t(pycolmap.sensor_t(_sensor_type(pycolmap, t), int(sid)), int(did)))
            rec.add_frame(frame)
        in_frames = set()
        for k, fid in enumerate(model.frame_ids):
            for t, _, did in model.frame_data[s[k]:s[k + 1]]:
                if int(t) == CAMERA_SENSOR and int(did) in image_rows:
                    im = image(image_rows[int(did)])
                    im.frame_id = int(fid)
                    rec.add_image(im)
                    in_frames.add(int(did))
            rec.register_frame(int(fid))
        lonely = sorted(set(image_rows) - in_frames)
        if lonely:
            raise ValueError(f"image {lonely[0]} is in no frame of the model ({len(lonely)} such images): "
                             f"every image of a model with rigs belongs to a frame")
    for k, pid in enumerate(model.point_ids):
        a, b = model.track_start[k], model.track_start[k + 1]
        track = pycolmap.Track([pycolmap.TrackElement(int(i), int(j))
                                for i, j in zip(model.track_image_ids[a:b], model.track_point2d_idx[a:b])])
        point = pycolmap.Point3D(xyz=model.point_xyz[k], track=track, color=model.point_rgb[k].astype(np.uint8),
                                 error=float(model.point_error[k]))
        rec.add_point3D_with_id(int(pid), point)
    return rec


def _model_name(pycolmap, model_id):
    return _member(pycolmap.CameraModelId, model_id).name


def bundle_adjust(reconstruction, **options):
    """Bundle-adjust a ``pycolmap.Reconstruction`` (updated in place: poses, rigs, intrinsics,
    points and their errors) or a model folder (read, solved and written back in the same
    format); returns the :class:`solvers.SolveResult`. Each of the keyword ``options`` goes to
    :func:`solvers.colmap.problem_from_reconstruction` where it takes it (``refine_*``, ``fix``,
    ``loss``, ``pose_priors``, ``device``, ...), else to :func:`solvers.solve`
    (``max_iterations``, ``linear_solver``, ``verbose``, ...). For a pycolmap reconstruction no
    file is written; a solve that fails (Ceres' FAILURE) leaves it as it was."""
    import inspect
    import solvers
    from .problem import problem_from_reconstruction, update_reconstruction
    takes = set(inspect.signature(problem_from_reconstruction).parameters) - {"model"}
    problem_options = {k: v for k, v in options.items() if k in takes}
    solve_options = {k: v for k, v in options.items() if k not in takes}
    if isinstance(reconstruction, str):
        from .io import is_binary_model, read_model, write_model
        model = read_model(reconstruction)
        binary = is_binary_model(reconstruction)
    else:
        model = from_pycolmap(reconstruction, observed_only=True)
    prob = problem_from_reconstruction(model, **problem_options)
    result = solvers.solve(prob, **solve_options)
    if result.usable:
        update_reconstruction(model, result)
        if isinstance(reconstruction, str):
            write_model(model, reconstruction, binary=binary)
        else:
            to_pycolmap(model, reconstruction)
    return result
