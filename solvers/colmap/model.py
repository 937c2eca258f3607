"""The COLMAP model itself, apart from its files: the camera models' ids and sizes, the
:class:`Reconstruction` arrays (see :mod:`solvers.colmap` for their layout) and :func:`validate`,
the one list of checks that reading and writing both apply (unique ids within their binary
fields, references that exist, positive sizes, finite values), so a model that COLMAP would
refuse is neither read nor written."""
from __future__ import annotations

import dataclasses
from typing import Dict, Tuple

import numpy as np

from ..checks import first_not_finite
from ..models import cameras

# COLMAP's camera models: name -> (model id, number of parameters), from the one table of
# models (solvers.models.cameras.MODELS, which also holds their projections).
CAMERA_MODELS: Dict[str, Tuple[int, int]] = {
    m.name: (m.colmap_id, m.num_params)
    for m in sorted(cameras.MODELS.values(), key=lambda m: -1 if m.colmap_id is None else m.colmap_id)
    if m.colmap_id is not None}
"""COLMAP's camera models: name -> (COLMAP model id, number of intrinsic parameters)."""
MODEL_NAMES = {mid: name for name, (mid, _) in CAMERA_MODELS.items()}
INVALID_U64 = np.uint64(2 ** 64 - 1)
SENSOR_TYPES = {"CAMERA": 0, "IMU": 1}
SENSOR_NAMES = {v: k for k, v in SENSOR_TYPES.items()}
CAMERA_SENSOR = SENSOR_TYPES["CAMERA"]
# Ids as the binary files hold them: camera, image, rig, frame and sensor ids are uint32; point
# ids uint64 with 2**64 - 1 meaning none, and this module holds them as int64 (-1 for none).
U32_MAX = 2 ** 32 - 1
I64_MAX = 2 ** 63 - 1
MODEL_FILES = ("cameras", "images", "points3D", "rigs", "frames")


class ColmapModelError(ValueError):
    """A :class:`Reconstruction` that is not a valid COLMAP model (:func:`validate`); the message
    names the record. ``kind`` is the file the record belongs in (``"images"``, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass
class Reconstruction:
    """A COLMAP sparse model as numpy arrays: what :func:`read_model` and :func:`from_pycolmap`
    return and :func:`write_model` writes. Variable-length parts are concatenated, with
    ``*_start`` offsets (entry ``i`` spans ``start[i]:start[i + 1]``).

    Attributes:
        camera_ids: ``(nc,)`` int64.
        camera_models: ``(nc,)`` int64, COLMAP model ids (:data:`CAMERA_MODELS`).
        camera_sizes: ``(nc, 2)`` int64: width, height.
        camera_params: ``nc`` float64 arrays, their lengths those of the models.
        image_ids: ``(ni,)`` int64.
        image_qvec: ``(ni, 4)`` ``cam_from_world`` rotation as a quaternion (qw, qx, qy, qz).
        image_tvec: ``(ni, 3)`` ``cam_from_world`` translation.
        image_camera_ids: ``(ni,)`` int64.
        image_names: ``ni`` file names.
        image_points_start: ``(ni + 1,)`` offsets of each image's 2-D points.
        points2d_xy: ``(n2d, 2)`` float64 pixel positions.
        points2d_point3d_ids: ``(n2d,)`` int64, -1 where a 2-D point observes no 3-D point.
        point_ids: ``(np,)`` int64.
        point_xyz: ``(np, 3)`` positions.
        point_rgb: ``(np, 3)`` uint8 colours.
        point_error: ``(np,)`` mean reprojection errors (recomputed after a solve).
        track_start: ``(np + 1,)`` offsets of each point's track.
        track_image_ids: ``(nt,)`` int64, the image of each track element.
        track_point2d_idx: ``(nt,)`` int64, the 2-D point's index within its image.
        rig_ids: ``(nr,)`` int64; None for a classic three-file model (no rigs or frames).
        rig_ref_sensors: ``(nr, 2)`` int64: each rig's reference sensor (type, id; type 0 is a camera).
        frame_ids: ``(nf,)`` int64.
        frame_rig_ids: ``(nf,)`` int64.
        frame_qvec: ``(nf, 4)`` ``rig_from_world`` rotation.
        frame_tvec: ``(nf, 3)`` ``rig_from_world`` translation.
        frame_data_start: ``(nf + 1,)`` offsets of each frame's data.
        frame_data: ``(nd, 3)`` int64: sensor type, sensor id, data id (an image id).
        rig_sensor_start: ``(nr + 1,)`` offsets of each rig's non-reference sensors; None when
            no rig has any.
        rig_sensors: ``(ns, 2)`` int64: sensor type, sensor id.
        rig_sensor_has_pose: ``(ns,)`` bool: whether ``sensor_from_rig`` is known.
        rig_sensor_qvec: ``(ns, 4)`` ``sensor_from_rig`` rotation (zeros where unknown).
        rig_sensor_tvec: ``(ns, 3)`` ``sensor_from_rig`` translation.
    """
    camera_ids: np.ndarray          # (nc,) int64
    camera_models: np.ndarray       # (nc,) int64, COLMAP model ids
    camera_sizes: np.ndarray        # (nc, 2) int64: width, height
    camera_params: list             # nc float64 arrays (their lengths follow the models)
    image_ids: np.ndarray           # (ni,) int64
    image_qvec: np.ndarray          # (ni, 4) cam_from_world rotation (qw, qx, qy, qz)
    image_tvec: np.ndarray          # (ni, 3) cam_from_world translation
    image_camera_ids: np.ndarray    # (ni,) int64
    image_names: list               # ni str
    image_points_start: np.ndarray  # (ni + 1,) int64
    points2d_xy: np.ndarray         # (n2d, 2) float64
    points2d_point3d_ids: np.ndarray  # (n2d,) int64, -1 where none
    point_ids: np.ndarray           # (np,) int64
    point_xyz: np.ndarray           # (np, 3)
    point_rgb: np.ndarray           # (np, 3) uint8
    point_error: np.ndarray         # (np,)
    track_start: np.ndarray         # (np + 1,) int64
    track_image_ids: np.ndarray     # (nt,) int64
    track_point2d_idx: np.ndarray   # (nt,) int64
    rig_ids: np.ndarray = None      # (nr,) int64; None: a classic three-file model
    rig_ref_sensors: np.ndarray = None   # (nr, 2) int64: sensor type (0 camera), sensor id
    frame_ids: np.ndarray = None    # (nf,) int64
    frame_rig_ids: np.ndarray = None
    frame_qvec: np.ndarray = None   # (nf, 4) rig_from_world
    frame_tvec: np.ndarray = None   # (nf, 3)
    frame_data_start: np.ndarray = None  # (nf + 1,) int64
    frame_data: np.ndarray = None   # (nd, 3) int64: sensor type, sensor id, data id (image id)
    # Each rig's sensors besides the reference one (a stereo pair's second camera, an IMU), with
    # their sensor_from_rig poses where known; None (with rigs): no rig has any.
    rig_sensor_start: np.ndarray = None  # (nr + 1,) int64
    rig_sensors: np.ndarray = None       # (ns, 2) int64: sensor type, sensor id
    rig_sensor_has_pose: np.ndarray = None  # (ns,) bool
    rig_sensor_qvec: np.ndarray = None   # (ns, 4) sensor_from_rig (zeros where no pose)
    rig_sensor_tvec: np.ndarray = None   # (ns, 3)

    @property
    def num_observations(self) -> int:
        return int(self.track_image_ids.size)

    @property
    def has_rigs(self) -> bool:
        return self.rig_ids is not None

    @property
    def has_multi_sensor_rigs(self) -> bool:
        """Whether a rig has a sensor besides its reference one."""
        return self.has_rigs and self.rig_sensor_start is not None and int(self.rig_sensor_start[-1]) > 0

    def non_ref_sensors(self):
        """``(start (nr + 1), sensors (ns, 2), has_pose (ns,), qvec (ns, 4), tvec (ns, 3))``: each
        rig's sensors besides its reference one (empty tables where the fields are None)."""
        if self.rig_sensor_start is None:
            nr = 0 if self.rig_ids is None else len(self.rig_ids)
            return (np.zeros(nr + 1, np.int64), np.zeros((0, 2), np.int64), np.zeros(0, bool),
                    np.zeros((0, 4)), np.zeros((0, 3)))
        return (self.rig_sensor_start, self.rig_sensors, self.rig_sensor_has_pose, self.rig_sensor_qvec,
                self.rig_sensor_tvec)


# ---------------------------------------------------------------------------------- checking

def validate(rec: Reconstruction) -> None:
    """Raise :class:`ColmapModelError` naming the first record that COLMAP would refuse or that
    the files cannot hold: ids unique and within their binary fields (uint32 for cameras, images,
    rigs, frames and sensors; points 0..2**63 - 1, as int64 holds them), known camera models with
    their number of parameters, positive sizes, finite parameters, poses, 2-D and 3-D points and
    errors, and references that exist: an image's camera, a 2-D point's 3-D point (or -1), a
    track's image and 2-D point (which observes that 3-D point, or none, as pycolmap requires), a
    rig's camera, a frame's rig and images. Vectorised: no Python loop over images, points or
    observations (about a second for 4 million observations on one core)."""
    cam_ids = _validate_cameras(rec)
    image_ids, start, on = _validate_images(rec, cam_ids)
    _validate_points(rec, image_ids, start, on)
    if rec.has_rigs:
        _validate_rigs(rec, cam_ids, image_ids)


def _validate_cameras(rec):
    ids = _ids(rec, "camera_ids", "cameras", "camera", U32_MAX)
    models = _column(rec, "camera_models", "cameras", (ids.size,), int)
    sizes = _column(rec, "camera_sizes", "cameras", (ids.size, 2), int)
    if len(rec.camera_params) != ids.size:
        raise ColmapModelError("cameras", f"camera_params has {len(rec.camera_params)} entries for {ids.size} cameras")
    for cid, mid, params in zip(ids, models, rec.camera_params):
        if int(mid) not in MODEL_NAMES:
            raise ColmapModelError("cameras", f"camera {cid}: unknown COLMAP camera model id {mid}")
        name = MODEL_NAMES[int(mid)]
        try:
            params = np.asarray(params, np.float64)
        except (TypeError, ValueError) as e:
            raise ColmapModelError("cameras", f"camera {cid}: parameters are not numbers ({e})") from None
        if params.ndim != 1 or params.size != CAMERA_MODELS[name][1]:
            raise ColmapModelError("cameras", f"camera {cid}: {name} takes {CAMERA_MODELS[name][1]} parameters, "
                                              f"not {params.size}")
        if not np.isfinite(params).all():
            raise ColmapModelError("cameras", f"camera {cid}: parameters are not finite ({params.tolist()})")
    # pycolmap reads a width of 0 too; but no image has one, and the binary field is unsigned
    k = _first((sizes <= 0).any(axis=1))
    if k is not None:
        raise ColmapModelError("cameras", f"camera {ids[k]}: width and height must be positive, "
                                          f"not {sizes[k, 0]} x {sizes[k, 1]}")
    return ids


def _validate_images(rec, cam_ids):
    """The image ids, where each image's 2-D points start, and the 3-D point each observes."""
    ids = _ids(rec, "image_ids", "images", "image", U32_MAX)
    cams = _column(rec, "image_camera_ids", "images", (ids.size,), int)
    k = _first(~id_rows(cam_ids, cams)[1])
    if k is not None:
        raise ColmapModelError("images", f"image {ids[k]}: camera {cams[k]} does not exist")
    if len(rec.image_names) != ids.size:
        raise ColmapModelError("images", f"image_names has {len(rec.image_names)} entries for {ids.size} images")
    _finite("images", "image", ids, np.concatenate([_column(rec, "image_qvec", "images", (ids.size, 4), float),
                                                    _column(rec, "image_tvec", "images", (ids.size, 3), float)],
                                                   axis=1), "cam_from_world")
    xy = _column(rec, "points2d_xy", "images", (None, 2), float)
    start = _starts(rec, "image_points_start", "images", ids.size, xy.shape[0])
    on = _column(rec, "points2d_point3d_ids", "images", (xy.shape[0],), int)
    k = first_not_finite(xy)
    if k is not None:
        i = np.searchsorted(start, k, side="right") - 1
        raise ColmapModelError("images", f"image {ids[i]}: point2D {k - start[i]} is not finite "
                                         f"({xy[k, 0]}, {xy[k, 1]})")
    return ids, start, on


def _validate_points(rec, image_ids, start, on):
    ids = _ids(rec, "point_ids", "points3D", "point", I64_MAX)
    k = _first(~id_rows(ids, on)[1] & (on != -1))
    if k is not None:
        i = np.searchsorted(start, k, side="right") - 1
        raise ColmapModelError("images", f"image {image_ids[i]}: point2D {k - start[i]} names 3-D point {on[k]}, "
                                         f"which does not exist (-1 for none)")
    _finite("points3D", "point", ids, _column(rec, "point_xyz", "points3D", (ids.size, 3), float), "X Y Z")
    _finite("points3D", "point", ids, _column(rec, "point_error", "points3D", (ids.size,), float)[:, None], "error")
    rgb = _column(rec, "point_rgb", "points3D", (ids.size, 3), int)
    k = _first(((rgb < 0) | (rgb > 255)).any(axis=1))
    if k is not None:
        raise ColmapModelError("points3D", f"point {ids[k]}: R G B must be in 0..255, not {rgb[k].tolist()}")
    image = _column(rec, "track_image_ids", "points3D", (None,), int)
    t_start = _starts(rec, "track_start", "points3D", ids.size, image.size)
    idx = _column(rec, "track_point2d_idx", "points3D", (image.size,), int)
    point = np.repeat(np.arange(ids.size), np.diff(t_start))
    rows, found = id_rows(image_ids, image)
    count = np.diff(start)[rows] if image_ids.size else np.zeros(image.size, np.int64)
    # Never wrapped as the binary file's uint32 would wrap them: -3 is not point2D 4294967293.
    k = _first(~found | (idx < 0) | (idx >= count))
    if k is not None:
        what = "which does not exist" if not found[k] else \
            f"point2D_idx {idx[k]}, which is not one of its {count[k]} 2-D points"
        raise ColmapModelError("points3D", f"point {ids[point[k]]}: track element {k - t_start[point[k]]} names "
                                           f"image {image[k]}, {what}")
    observed = on[start[rows] + idx] if idx.size else np.zeros(0, np.int64)
    k = _first((observed != -1) & (observed != ids[point]))
    if k is not None:
        raise ColmapModelError("points3D", f"point {ids[point[k]]}: track element {k - t_start[point[k]]} names "
                                           f"point2D {idx[k]} of image {image[k]}, which observes 3-D point "
                                           f"{observed[k]}")


def _validate_rigs(rec, cam_ids, image_ids) -> None:
    rig_ids = _ids(rec, "rig_ids", "rigs", "rig", U32_MAX)
    ref = _column(rec, "rig_ref_sensors", "rigs", (rig_ids.size, 2), int)
    found = id_rows(cam_ids, ref[:, 1])[1]
    k = _first(~np.isin(ref[:, 0], list(SENSOR_NAMES)) | (ref[:, 1] < 0) | (ref[:, 1] > U32_MAX)
               | ((ref[:, 0] == CAMERA_SENSOR) & ~found))
    if k is not None:
        t, sid = ref[k].tolist()
        raise ColmapModelError("rigs", f"rig {rig_ids[k]}: reference sensor ({SENSOR_NAMES.get(t, t)} {sid}) "
                                       f"is no camera or IMU of this model")
    _validate_rig_sensors(rec, rig_ids, ref, cam_ids)
    frame_ids = _ids(rec, "frame_ids", "frames", "frame", U32_MAX)
    frame_rigs = _column(rec, "frame_rig_ids", "frames", (frame_ids.size,), int)
    k = _first(~id_rows(rig_ids, frame_rigs)[1])
    if k is not None:
        raise ColmapModelError("frames", f"frame {frame_ids[k]}: rig {frame_rigs[k]} does not exist")
    _finite("frames", "frame", frame_ids, np.concatenate(
        [_column(rec, "frame_qvec", "frames", (frame_ids.size, 4), float),
         _column(rec, "frame_tvec", "frames", (frame_ids.size, 3), float)], axis=1), "rig_from_world")
    data = _column(rec, "frame_data", "frames", (None, 3), int)
    start = _starts(rec, "frame_data_start", "frames", frame_ids.size, data.shape[0])
    bad = ~np.isin(data[:, 0], list(SENSOR_NAMES)) | (data[:, 1] < 0) | (data[:, 1] > U32_MAX) | (data[:, 2] < 0)
    k = _first(bad | ((data[:, 0] == CAMERA_SENSOR) & ~id_rows(image_ids, data[:, 2])[1]))
    if k is not None:
        f = np.searchsorted(start, k, side="right") - 1
        t, sid, did = data[k].tolist()
        what = "is no (sensor type, sensor id, data id)" if bad[k] else f"names image {did}, which does not exist"
        raise ColmapModelError("frames", f"frame {frame_ids[f]}: data {k - start[f]} ({SENSOR_NAMES.get(t, t)} "
                                         f"{sid} {did}) {what}")


def _validate_rig_sensors(rec, rig_ids, ref, cam_ids) -> None:
    """Each rig's other sensors: known types, cameras that exist, no sensor in two rigs or twice
    in one (the reference included), finite sensor_from_rig poses."""
    if rec.rig_sensor_start is None:
        return
    sensors = _column(rec, "rig_sensors", "rigs", (None, 2), int)
    start = _starts(rec, "rig_sensor_start", "rigs", rig_ids.size, sensors.shape[0])
    has_pose = np.asarray(rec.rig_sensor_has_pose)
    if has_pose.shape != (sensors.shape[0],) or has_pose.dtype.kind not in "biu":
        raise ColmapModelError("rigs", f"Reconstruction.rig_sensor_has_pose must be ({sensors.shape[0]},) bools, "
                                       f"not {has_pose.shape} {has_pose.dtype}")
    pose = np.concatenate([_column(rec, "rig_sensor_qvec", "rigs", (sensors.shape[0], 4), float),
                           _column(rec, "rig_sensor_tvec", "rigs", (sensors.shape[0], 3), float)], axis=1)
    owner = np.repeat(np.arange(rig_ids.size), np.diff(start))
    bad = ~np.isin(sensors[:, 0], list(SENSOR_NAMES)) | (sensors[:, 1] < 0) | (sensors[:, 1] > U32_MAX) | \
        ((sensors[:, 0] == CAMERA_SENSOR) & ~id_rows(cam_ids, sensors[:, 1])[1])
    k = _first(bad)
    if k is not None:
        t, sid = sensors[k].tolist()
        raise ColmapModelError("rigs", f"rig {rig_ids[owner[k]]}: sensor ({SENSOR_NAMES.get(t, t)} {sid}) is no "
                                       f"camera or IMU of this model")
    k = _first((has_pose != 0) & ~np.isfinite(pose).all(axis=1))
    if k is not None:
        raise ColmapModelError("rigs", f"rig {rig_ids[owner[k]]}: sensor_from_rig of sensor {sensors[k, 1]} is "
                                       f"not finite ({pose[k].tolist()})")
    every = np.concatenate([ref, sensors])              # (type, id) of every sensor of every rig
    key = every[:, 0] * (U32_MAX + 1) + every[:, 1]
    order = np.argsort(key, kind="stable")
    k = _first(key[order[1:]] == key[order[:-1]])
    if k is not None:
        t, sid = every[order[k]].tolist()
        rigs = np.concatenate([np.arange(rig_ids.size), owner])[[order[k], order[k + 1]]]
        raise ColmapModelError("rigs", f"sensor ({SENSOR_NAMES.get(t, t)} {sid}) belongs to rigs "
                                       f"{rig_ids[rigs[0]]} and {rig_ids[rigs[1]]} (or twice to one): a sensor "
                                       f"is in one rig, once")


def _first(bad):
    where = np.flatnonzero(bad)
    return int(where[0]) if where.size else None


def _column(rec, field, kind, shape, number):
    """``rec.<field>`` as an int64 (``number`` int) or float64 array of ``shape`` (None: any)."""
    a = np.asarray(getattr(rec, field))
    if a.size == 0 and shape[0] in (None, 0) and None not in shape[1:]:
        a = a.reshape((0,) + tuple(shape[1:]))         # an empty list for an empty table
    if a.ndim != len(shape) or any(n is not None and n != m for n, m in zip(shape, a.shape)):
        want = " x ".join("n" if n is None else str(n) for n in shape)
        raise ColmapModelError(kind, f"Reconstruction.{field} has shape {a.shape}, not ({want})")
    if a.dtype.kind not in ("iu" if number is int else "iuf"):
        raise ColmapModelError(kind, f"Reconstruction.{field} holds {a.dtype}, not {number.__name__}s")
    if a.dtype.kind == "u" and a.size and a.max() > I64_MAX:
        raise ColmapModelError(kind, f"Reconstruction.{field}: {a.max()} is beyond 2^63 - 1")
    return a.astype(np.int64 if number is int else np.float64, copy=False)


def _ids(rec, field, kind, label, largest):
    ids = _column(rec, field, kind, (None,), int)
    k = _first((ids < 0) | (ids > largest))
    if k is not None:
        raise ColmapModelError(kind, f"{label} {ids[k]}: the id is out of range 0..{largest}")
    order = np.argsort(ids, kind="stable")
    k = _first(ids[order[1:]] == ids[order[:-1]])
    if k is not None:
        raise ColmapModelError(kind, f"{label} {ids[order[k]]}: the id appears twice (records {order[k]} "
                                     f"and {order[k + 1]})")
    return ids


def id_rows(ids, wanted):
    """``(rows, found)``: the row in ``ids`` (unique ids, any order) of each of ``wanted``, and
    whether it is there at all (the row of one that is not is meaningless)."""
    wanted = np.asarray(wanted, np.int64)
    if ids.size == 0:
        return np.zeros(wanted.shape, np.int64), np.zeros(wanted.shape, bool)
    if ids[-1] - ids[0] == ids.size - 1 and (np.diff(ids) == 1).all():
        # ids 1..n in order, as COLMAP numbers them: the row is an offset. A search costs
        # 30 ms for the 2.4 million 2-D points of a 200-image model, this 3 ms.
        rows = wanted - ids[0]
        found = (rows >= 0) & (rows < ids.size)
        return np.where(found, rows, 0), found
    order = np.argsort(ids, kind="stable")
    rows = order[np.minimum(np.searchsorted(ids, wanted, sorter=order), ids.size - 1)]
    return rows, ids[rows] == wanted


def _starts(rec, field, kind, n, total):
    start = _column(rec, field, kind, (n + 1,), int)
    if start[0] != 0 or start[-1] != total or (np.diff(start) < 0).any():
        raise ColmapModelError(kind, f"Reconstruction.{field} must run from 0 to {total} without decreasing")
    return start


def _finite(kind, label, ids, values, what):
    k = first_not_finite(values)
    if k is not None:
        raise ColmapModelError(kind, f"{label} {ids[k]}: {what} is not finite ({values[k].tolist()})")
