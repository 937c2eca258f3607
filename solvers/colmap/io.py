"""COLMAP sparse reconstructions: read and write the models COLMAP 4 (and pycolmap 4.2) writes,
in text (``cameras.txt``, ``images.txt``, ``points3D.txt``, with ``rigs.txt`` and ``frames.txt``
when present) and binary (the same names, ``.bin``), and the classic three-file models.

:func:`read_model` returns a :class:`Reconstruction` of numpy arrays, a row per camera, image,
point, rig and frame; the variable-length parts (each image's 2-D points, each point's track)
are concatenated with offsets (``image_points_start``, ``track_start``: n + 1 entries each).
Poses are stored as COLMAP stores them: ``cam_from_world`` (images) and ``rig_from_world``
(frames) as quaternions ``(qw, qx, qy, qz)`` and translations. A 2-D point observes no 3-D point
where its id is -1 (COLMAP's invalid id; ``2**64 - 1`` in the binary files).

A malformed file raises :class:`ColmapFormatError` naming the file and the line (text) or the
record and byte offset (binary); nothing half-read is returned. What parses is then checked as a
model (:func:`validate`: unique ids, references to cameras, images, 2-D and 3-D points that exist,
positive image sizes, finite values, a sensor in one rig only), the error naming the file and
the record. Rigs hold any number of sensors (a stereo pair, a multi-camera car or 360 rig), each
besides the reference one with its ``sensor_from_rig`` pose where known.

:func:`write_model` validates the whole model before it touches the disk (an invalid one raises
:class:`ColmapModelError` naming the record), then writes a new folder beside the target and swaps
it in (:mod:`solvers.io.atomic`): the folder holds the old model or the new one, never a mix.

    from solvers import colmap                   # this module's names are there
    rec = colmap.read_model("sparse/0")          # text or binary, found by the files there
    colmap.write_model(rec, "out", binary=True)
"""
from __future__ import annotations

import io
import os
import shutil
import struct

import numpy as np

from ..io import atomic, progress
from .model import (CAMERA_MODELS, ColmapModelError, Reconstruction, validate,
                    I64_MAX as _I64_MAX, MODEL_FILES as _MODEL_FILES,
                    MODEL_NAMES as _MODEL_NAMES, SENSOR_NAMES as _SENSOR_NAMES, SENSOR_TYPES as _SENSOR_TYPES)



class ColmapFormatError(ValueError):
    """A COLMAP model file that cannot be read; the message names the file and where."""


# ---------------------------------------------------------------------------------- reading

def is_binary_model(path: str) -> bool:
    """Whether the model in folder ``path`` is binary (its ``cameras.bin`` is there): how
    :func:`read_model` reads it, and how a model read from there is written back."""
    return os.path.isfile(os.path.join(path, "cameras.bin"))


def read_model(path: str) -> Reconstruction:
    """Read the COLMAP model in folder ``path``: binary if ``cameras.bin`` is there, else text.

    Rigs and frames (COLMAP 4's ``rigs`` and ``frames`` files) are read where present; a classic
    three-file model reads too. What parses is then validated as a model (:func:`validate`).

    Args:
        path: the model's folder (``sparse/0``).

    Returns:
        The :class:`Reconstruction`.

    Raises:
        FileNotFoundError: ``path`` is not a folder, or holds neither ``cameras.bin`` nor
            ``cameras.txt``.
        ColmapFormatError: a file that does not parse, or a model that is not valid, naming the
            file and the line, or the record and byte.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is not a folder holding a COLMAP model")
    for ext, reader in ((".bin", _read_binary), (".txt", _read_text)):
        if os.path.isfile(os.path.join(path, "cameras" + ext)):
            rec = reader(path)
            try:
                validate(rec)
            except ColmapModelError as e:
                raise ColmapFormatError(f"{os.path.join(path, e.kind + ext)}: {e}") from None
            return rec
    raise FileNotFoundError(f"{path!r} holds neither cameras.bin nor cameras.txt: not a COLMAP model folder")


def _data_lines(file):
    """(line number, line) of a text file's data lines (no comments, no blank lines), with a
    progress bar on a terminal when the read takes over a second."""
    with open(file, "rb") as fh, \
            progress.bar(os.path.getsize(file), f"reading {os.path.basename(file)}") as bar:
        for number, raw in enumerate(fh, 1):
            bar.update(len(raw))
            s = _decode(file, raw, number).strip()
            if s and not s.startswith("#"):
                yield number, s


def _decode(file, raw: bytes, first_line: int = 1) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + raw.count(b"\n", 0, e.start)
        _fail(file, f"line {line}", f"not UTF-8 text ({e.reason})")


def _int(token: str) -> int:
    """A text field that must be an integer the model's int64 arrays can hold."""
    value = int(token)
    if not -_I64_MAX - 1 <= value <= _I64_MAX:
        raise ValueError(f"{token} is out of range")
    return value


def _fail(file, where, what):
    raise ColmapFormatError(f"{file}: {where}: {what}")


def _read_text(path) -> Reconstruction:
    f = os.path.join(path, "cameras.txt")
    cams = []
    for no, line in _data_lines(f):
        parts = line.split()
        try:
            cid, model, w, h = _int(parts[0]), parts[1], _int(parts[2]), _int(parts[3])
            params = np.array(parts[4:], np.float64)
        except (IndexError, ValueError) as e:
            _fail(f, f"line {no}", f"expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS[] ({e})")
        if model not in CAMERA_MODELS:
            _fail(f, f"line {no}", f"unknown camera model {model!r}")
        if params.size != CAMERA_MODELS[model][1]:
            _fail(f, f"line {no}", f"{model} takes {CAMERA_MODELS[model][1]} parameters, not {params.size}")
        cams.append((cid, CAMERA_MODELS[model][0], w, h, params))

    f = os.path.join(path, "images.txt")
    images, xy, ids = [], [], []
    # Two lines per image, the second empty for an image without 2-D points: so blank lines
    # count here (comments do not), and a trailing blank line does not.
    with open(f, "rb") as fh:        # newlines as a text-mode read would take them
        raw = _decode(f, fh.read()).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    body = [(n + 1, s) for n, s in enumerate(raw) if not s.lstrip().startswith("#")]
    while body and not body[-1][1].strip():
        body.pop()
    i = 0
    while i < len(body):
        no, line = body[i]
        parts = line.split()
        try:
            iid = _int(parts[0])
            q, t = np.array(parts[1:5], np.float64), np.array(parts[5:8], np.float64)
            cid, name = _int(parts[8]), " ".join(parts[9:])
            if q.size != 4 or t.size != 3 or not name:
                raise ValueError("too few fields")
        except (IndexError, ValueError) as e:
            _fail(f, f"line {no}", f"expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME ({e})")
        pts = body[i + 1][1] if i + 1 < len(body) else ""
        try:      # the whole line at once (sep=" " parses any whitespace)
            arr = np.fromstring(pts, dtype=np.float64, sep=" ") if pts.strip() else np.zeros(0)
        except ValueError as e:
            _fail(f, f"line {body[i + 1][0]}", f"POINTS2D: a token that is not a number ({e})")
        if arr.size % 3:
            _fail(f, f"line {body[i + 1][0]}", "POINTS2D must be triples X Y POINT3D_ID")
        arr = arr.reshape(-1, 3)
        point3d_ids = arr[:, 2]
        if not (np.abs(point3d_ids) < 2 ** 53).all() or (point3d_ids != np.round(point3d_ids)).any():
            try:        # beyond what a double holds exactly, or not an integer: token by token
                point3d_ids = np.array([_int(v) for v in pts.split()[2::3]], np.int64)
            except ValueError as e:
                _fail(f, f"line {body[i + 1][0]}", f"POINT3D_ID must be an integer ({e})")
        images.append((iid, q, t, cid, name, len(arr)))
        xy.append(arr[:, :2])
        ids.append(point3d_ids.astype(np.int64))
        i += 2

    pts3 = _read_points_text(os.path.join(path, "points3D.txt"))

    rigs = frames = None
    f = os.path.join(path, "rigs.txt")
    if os.path.isfile(f):
        rigs = []
        for no, line in _data_lines(f):
            parts = line.split()
            try:
                rid, ns, stype, sid = _int(parts[0]), _int(parts[1]), parts[2], _int(parts[3])
                others, k = [], 4
                for _ in range(ns - 1):     # (SENSOR_TYPE SENSOR_ID HAS_POSE [QW QX QY QZ TX TY TZ])
                    otype, oid, has = parts[k], _int(parts[k + 1]), _int(parts[k + 2])
                    if has not in (0, 1) or otype not in _SENSOR_TYPES:
                        raise ValueError(f"sensor {otype} {oid}: HAS_POSE must be 0 or 1 and the type "
                                         f"CAMERA or IMU")
                    pose = np.array(parts[k + 3:k + 3 + 7 * has], np.float64)
                    if pose.size != 7 * has:
                        raise ValueError(f"sensor {otype} {oid}: a pose takes 7 numbers")
                    others.append((_SENSOR_TYPES[otype], oid, has, pose))
                    k += 3 + 7 * has
                if ns < 1 or len(parts) != k:
                    raise ValueError(f"{len(parts)} fields for {ns} sensors")
            except (IndexError, ValueError) as e:
                _fail(f, f"line {no}", f"expected RIG_ID NUM_SENSORS REF_SENSOR_TYPE REF_SENSOR_ID, then per "
                                       f"other sensor SENSOR_TYPE SENSOR_ID HAS_POSE [QW QX QY QZ TX TY TZ] ({e})")
            if stype not in _SENSOR_TYPES:
                _fail(f, f"line {no}", f"unknown sensor type {stype!r}")
            rigs.append((rid, _SENSOR_TYPES[stype], sid, others))
        f = os.path.join(path, "frames.txt")
        frames = []
        for no, line in _data_lines(f):
            parts = line.split()
            try:
                fid, rid = _int(parts[0]), _int(parts[1])
                q, t = np.array(parts[2:6], np.float64), np.array(parts[6:9], np.float64)
                nd = _int(parts[9])
                data = parts[10:]
                if len(data) != 3 * nd or q.size != 4 or t.size != 3:
                    raise ValueError("wrong number of fields")
                data = np.array([(_SENSOR_TYPES[data[3 * k]], _int(data[3 * k + 1]), _int(data[3 * k + 2]))
                                 for k in range(nd)], np.int64).reshape(-1, 3)
            except (IndexError, ValueError, KeyError) as e:
                _fail(f, f"line {no}", f"expected FRAME_ID RIG_ID QW QX QY QZ TX TY TZ NUM_DATA_IDS "
                                       f"(SENSOR_TYPE SENSOR_ID DATA_ID)[] ({e})")
            frames.append((fid, rid, q, t, data))
    xy = np.concatenate(xy).reshape(-1, 2) if xy else np.zeros((0, 2))
    ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return _assemble(cams, images, xy, ids, pts3, rigs, frames)


def _read_points_text(f) -> "_Points":
    """points3D.txt as arrays: every number of the file parsed at once, the fields gathered by
    each line's offset. Anything that does not fit (a short line, a token that is not a number,
    a colour out of range) goes to the line-by-line reader, which names the line."""
    with open(f, "rb") as fh, progress.bar(os.path.getsize(f), f"reading {os.path.basename(f)}") as bar:
        text = fh.read()
        lines = [ln for ln in text.split(b"\n") if ln.strip() and not ln.lstrip().startswith(b"#")]
        n = len(lines)
        counts = np.fromiter((len(ln.split()) for ln in lines), np.int64, n)
        bar.update(len(text) // 2)
        if n and (counts.min() < 8 or ((counts - 8) % 2).any()):
            return _read_points_text_lines(f)
        try:
            values = np.fromstring(b" ".join(lines), dtype=np.float64, sep=" ") if n else np.zeros(0)
        except ValueError:          # a token that is not a number
            return _read_points_text_lines(f)
        bar.update(len(text) - len(text) // 2)
    if values.size != counts.sum():
        return _read_points_text_lines(f)
    if not n:                       # a model without 3-D points
        return _Points.from_rows([])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    head = values[starts[:, None] + np.arange(8)].reshape(-1, 8)
    lengths = (counts - 8) // 2
    track_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    k = np.arange(2 * track_start[-1]) - np.repeat(2 * track_start[:-1], 2 * lengths)
    pairs = values[np.repeat(starts + 8, 2 * lengths) + k]
    ints = np.concatenate([head[:, 0], head[:, 4:7].ravel(), pairs])
    rgb = head[:, 4:7]
    # ids beyond 2**53 lose digits as doubles (and nan/inf are no integers): read those exactly
    if not (np.abs(ints) < 2 ** 53).all() or not np.array_equal(ints, np.round(ints)) \
            or (rgb < 0).any() or (rgb > 255).any():
        return _read_points_text_lines(f)
    return _Points(head[:, 0].astype(np.int64), head[:, 1:4], rgb.astype(np.uint8), head[:, 7].copy(),
                   track_start, pairs.astype(np.int64).reshape(-1, 2))


def _read_points_text_lines(f) -> "_Points":
    pts3 = []
    for no, line in _data_lines(f):
        parts = line.split()
        try:
            pid = _int(parts[0])
            xyz, rgb, err = np.array(parts[1:4], np.float64), np.array(parts[4:7], np.int64), float(parts[7])
            track = np.array([_int(v) for v in parts[8:]], np.int64)
            if xyz.size != 3 or rgb.size != 3 or track.size % 2:
                raise ValueError("wrong number of fields")
        except (IndexError, ValueError, OverflowError) as e:
            _fail(f, f"line {no}", f"expected POINT3D_ID X Y Z R G B ERROR TRACK[] as pairs ({e})")
        if rgb.min(initial=0) < 0 or rgb.max(initial=0) > 255:
            _fail(f, f"line {no}", "R G B must be in 0..255")
        pts3.append((pid, xyz, rgb, err, track.reshape(-1, 2)))
    return _Points.from_rows(pts3)


def _assemble(cams, images, xy, ids, pts3, rigs, frames) -> Reconstruction:
    """The Reconstruction of what a reader parsed: ``xy`` (n, 2) and ``ids`` (n,) are every
    image's 2-D points and their 3-D points, joined in image order."""
    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    starts = lambda counts: np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)  # noqa: E731
    rec = Reconstruction(
        camera_ids=i64([c[0] for c in cams]), camera_models=i64([c[1] for c in cams]),
        camera_sizes=i64([(c[2], c[3]) for c in cams]).reshape(-1, 2), camera_params=[c[4] for c in cams],
        image_ids=i64([m[0] for m in images]), image_qvec=np.array([m[1] for m in images]).reshape(-1, 4),
        image_tvec=np.array([m[2] for m in images]).reshape(-1, 3), image_camera_ids=i64([m[3] for m in images]),
        image_names=[m[4] for m in images], image_points_start=starts([m[5] for m in images]),
        points2d_xy=xy, points2d_point3d_ids=ids,
        point_ids=pts3.ids, point_xyz=pts3.xyz, point_rgb=pts3.rgb, point_error=pts3.error,
        track_start=pts3.track_start, track_image_ids=pts3.pairs[:, 0].copy(),
        track_point2d_idx=pts3.pairs[:, 1].copy())
    if rigs is not None:
        rec.rig_ids = i64([r[0] for r in rigs])
        rec.rig_ref_sensors = i64([(r[1], r[2]) for r in rigs]).reshape(-1, 2)
        others = [o for r in rigs for o in r[3]]
        rec.rig_sensor_start = starts([len(r[3]) for r in rigs])
        rec.rig_sensors = i64([(o[0], o[1]) for o in others]).reshape(-1, 2)
        rec.rig_sensor_has_pose = np.array([bool(o[2]) for o in others], bool)
        poses = np.array([o[3] if o[2] else np.zeros(7) for o in others]).reshape(-1, 7)
        rec.rig_sensor_qvec, rec.rig_sensor_tvec = poses[:, :4].copy(), poses[:, 4:].copy()
        rec.frame_ids = i64([fr[0] for fr in frames])
        rec.frame_rig_ids = i64([fr[1] for fr in frames])
        rec.frame_qvec = np.array([fr[2] for fr in frames]).reshape(-1, 4)
        rec.frame_tvec = np.array([fr[3] for fr in frames]).reshape(-1, 3)
        rec.frame_data_start = starts([len(fr[4]) for fr in frames])
        rec.frame_data = np.concatenate([fr[4] for fr in frames]).reshape(-1, 3) if frames else np.zeros((0, 3), np.int64)
    return rec


class _Reader:
    """Sequential reads from a binary file's bytes, each failure naming the file, the record
    and the byte offset."""

    def __init__(self, file):
        self.file = file
        with open(file, "rb") as fh:
            self.buf = fh.read()
        self.pos = 0
        self.record = "the header"

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            _fail(self.file, f"{self.record} at byte {self.pos}", f"the file ends ({len(self.buf)} bytes) "
                  f"before the {size} bytes expected")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out

    def array(self, dtype, count, copy=True):
        """``count`` values of ``dtype`` at the read position; ``copy=False``: a read-only view
        into the file's bytes."""
        dtype = np.dtype(dtype)
        size = dtype.itemsize * count
        if self.pos + size > len(self.buf):
            _fail(self.file, f"{self.record} at byte {self.pos}", f"the file ends before {count} values")
        out = np.frombuffer(self.buf, dtype, count, self.pos)
        if copy:
            out = out.copy()
        self.pos += size
        return out

    def name(self):
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            _fail(self.file, f"{self.record} at byte {self.pos}", "an image name has no terminating NUL")
        try:
            out = self.buf[self.pos:end].decode("utf-8")
        except UnicodeDecodeError as e:
            _fail(self.file, f"{self.record} at byte {self.pos}", f"the image name is not UTF-8 ({e.reason})")
        self.pos = end + 1
        return out

    def done(self):
        if self.pos != len(self.buf):
            _fail(self.file, f"byte {self.pos}", f"{len(self.buf) - self.pos} bytes left after the last record")


_POINT2D = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<u8")])
_POINT_HEAD = np.dtype([("id", "<u8"), ("xyz", "<f8", 3), ("rgb", "u1", 3), ("error", "<f8"), ("length", "<u8")])


def _read_points_binary(r: "_Reader"):
    """points3D.bin as arrays: one pass that only follows the track lengths to each record's
    offset, then every field gathered at once (millions of points in about a second)."""
    (n,) = r.take("<Q")
    buf, head = r.buf, _POINT_HEAD.itemsize
    if n * head > len(buf) - r.pos:     # a count no file this size holds: no giant allocation
        _fail(r.file, "the header", f"{n} points cannot fit in the {len(buf) - r.pos} bytes that follow")
    offsets = np.empty(n, np.int64)
    lengths = np.empty(n, np.int64)
    pos, end, unpack = r.pos, len(buf), struct.Struct("<Q").unpack_from
    bar = progress.bar(n, f"reading {os.path.basename(r.file)}", unit="points")
    for k in range(n):
        if not k & 0xFFFF and k:
            bar.update(0x10000)
        if pos + head > end:
            _fail(r.file, f"point record {k} at byte {pos}", f"the file ends ({end} bytes) before the "
                  f"{head} bytes expected")
        (length,) = unpack(buf, pos + head - 8)
        if pos + head + 8 * length > end:
            _fail(r.file, f"point record {k} at byte {pos}", f"the file ends ({end} bytes) before "
                  f"its track of {length} elements")
        offsets[k], lengths[k] = pos, length
        pos += head + 8 * length
    bar.close()
    r.pos = pos
    r.done()
    raw = np.frombuffer(buf, np.uint8)
    heads = raw[offsets[:, None] + np.arange(head)].view(_POINT_HEAD).ravel() if n else np.zeros(0, _POINT_HEAD)
    track_start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # element j of point k's track: 8 bytes at offsets[k] + head + 8 j
    element = np.arange(track_start[-1]) - np.repeat(track_start[:-1], lengths)
    at = np.repeat(offsets + head, lengths) + 8 * element
    pairs = raw[at[:, None] + np.arange(8)].view("<u4").reshape(-1, 2).astype(np.int64) if at.size \
        else np.zeros((0, 2), np.int64)
    too_large = np.flatnonzero(heads["id"] > _I64_MAX)
    if too_large.size:
        k = int(too_large[0])
        _fail(r.file, f"point record {k} at byte {offsets[k]}", f"point id {heads['id'][k]} is beyond 2^63 - 1")
    return _Points(heads["id"].astype(np.int64), heads["xyz"], heads["rgb"], heads["error"].astype(np.float64),
                   track_start, pairs)


class _Points:
    """points3D as arrays (what _assemble takes besides a list of per-point tuples)."""

    def __init__(self, ids, xyz, rgb, error, track_start, pairs):
        self.ids, self.xyz, self.rgb, self.error = ids, np.asarray(xyz, np.float64).reshape(-1, 3), \
            np.asarray(rgb, np.uint8).reshape(-1, 3), error
        self.track_start, self.pairs = track_start, pairs.reshape(-1, 2)

    @classmethod
    def from_rows(cls, rows):
        lengths = [len(p[4]) for p in rows]
        pairs = np.concatenate([p[4] for p in rows]) if rows else np.zeros((0, 2), np.int64)
        return cls(np.array([p[0] for p in rows], np.int64), np.array([p[1] for p in rows]),
                   np.array([p[2] for p in rows]), np.array([p[3] for p in rows], np.float64),
                   np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), pairs)


def _read_binary(path) -> Reconstruction:
    r = _Reader(os.path.join(path, "cameras.bin"))
    cams = []
    (n,) = r.take("<Q")
    for k in range(n):
        r.record = f"camera record {k}"
        cid, mid, w, h = r.take("<IiQQ")
        if mid not in _MODEL_NAMES:
            _fail(r.file, r.record, f"unknown camera model id {mid}")
        if max(w, h) > _I64_MAX:
            _fail(r.file, r.record, f"width {w} or height {h} is beyond 2^63 - 1")
        cams.append((cid, mid, w, h, r.array("<f8", CAMERA_MODELS[_MODEL_NAMES[mid]][1])))
    r.done()

    r = _Reader(os.path.join(path, "images.bin"))
    images, points = [], []
    (n,) = r.take("<Q")
    for k in range(n):
        r.record = f"image record {k}"
        iid, qw, qx, qy, qz, tx, ty, tz, cid = r.take("<I7dI")
        name = r.name()
        (npts,) = r.take("<Q")
        # Views into the file's bytes, copied field by field into the joined arrays below:
        # per-image arrays, stacks and id conversions cost 0.1 s for the 2.4 million 2-D points
        # of a 200-image model, a joined copy of the records and a search for invalid ids 0.06 s.
        points.append(r.array(_POINT2D, npts, copy=False))
        images.append((iid, np.array([qw, qx, qy, qz]), np.array([tx, ty, tz]), cid, name, npts))
    r.done()
    total = sum(v.size for v in points)
    xy, ids = np.empty((total, 2)), np.empty(total, np.int64)
    at = 0
    for v in points:
        xy[at:at + v.size, 0], xy[at:at + v.size, 1] = v["x"], v["y"]
        # uint64 to int64 as C casts it: COLMAP's invalid id (2^64 - 1) becomes -1, ours
        ids[at:at + v.size] = v["id"]
        at += v.size
    del points

    pts3 = _read_points_binary(_Reader(os.path.join(path, "points3D.bin")))

    rigs = frames = None
    if os.path.isfile(os.path.join(path, "rigs.bin")):
        r = _Reader(os.path.join(path, "rigs.bin"))
        rigs = []
        (n,) = r.take("<Q")
        for k in range(n):
            r.record = f"rig record {k}"
            rid, ns = r.take("<II")
            if ns < 1:
                _fail(r.file, r.record, "a rig without sensors (it needs its reference sensor)")
            stype, sid = r.take("<iI")
            others = []
            for _ in range(ns - 1):         # type, id, has_pose (uint8), [qw qx qy qz tx ty tz]
                otype, oid, has = r.take("<iIB")
                if has not in (0, 1):
                    _fail(r.file, r.record, f"sensor {oid}: has_pose is {has}, not 0 or 1")
                others.append((otype, oid, has, np.array(r.take("<7d") if has else (), np.float64)))
            rigs.append((rid, stype, sid, others))
        r.done()
        r = _Reader(os.path.join(path, "frames.bin"))
        frames = []
        (n,) = r.take("<Q")
        for k in range(n):
            r.record = f"frame record {k}"
            fid, rid, qw, qx, qy, qz, tx, ty, tz, nd = r.take("<II7dI")
            rec = r.array(np.dtype([("type", "<i4"), ("id", "<u4"), ("data", "<u8")]), nd)
            # each column to int64 first: stacked as they are, they would meet in float64
            data = np.stack([rec[c].astype(np.int64) for c in ("type", "id", "data")], 1).reshape(-1, 3)
            frames.append((fid, rid, np.array([qw, qx, qy, qz]), np.array([tx, ty, tz]), data))
        r.done()
    return _assemble(cams, images, xy, ids, pts3, rigs, frames)


# ---------------------------------------------------------------------------------- writing

def write_model(rec: Reconstruction, path: str, binary: bool = False) -> None:
    """Write ``rec`` into folder ``path``, binary or text; rigs and frames too when ``rec`` has
    them. All or nothing: the whole model is validated first (:func:`validate`; an invalid one
    raises :class:`ColmapModelError` and nothing is written), then written into a new folder
    beside ``path`` that takes its place in one step (:func:`solvers.io.atomic.replacing_folder`):
    a write that fails or is killed part-way leaves the old folder as it was.

    The new folder keeps the old folder's other entries (a ``project.ini``, images, anything kept
    there), hard-linked where the file system allows, else copied; it drops the model files of
    the other format (``*.bin`` when writing text, ``*.txt`` when writing binary) and a
    ``rigs``/``frames`` file that the new model does not have: COLMAP reads ``.bin`` before
    ``.txt``, so a stale model left beside the new one would be the one read. ``path`` is made
    if missing (its parents too)."""
    validate(rec)
    for k, name in enumerate(rec.image_names):     # what the text and binary layouts cannot hold
        if not isinstance(name, str) or not name.strip() or any(c in name for c in "\0\n\r"):
            raise ColmapModelError("images", f"image {rec.image_ids[k]}: name {name!r} must be a non-empty "
                                             f"string without NUL or line breaks")
    ext, writers = (".bin", _BINARY_WRITERS) if binary else (".txt", _TEXT_WRITERS)
    names = ["cameras", "images", "points3D"] + (["rigs", "frames"] if rec.has_rigs else [])
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic.replacing_folder(path) as tmp:
        if os.path.isdir(path):
            _carry_over(path, tmp)
        for name in names:
            with open(os.path.join(tmp, name + ext), "wb", buffering=1 << 20) as fh:
                if binary:
                    # Written as made: a binary writer's small pieces land in the file's buffer
                    # and its large arrays go straight to the file, copied no more.
                    writers[name](rec, fh)
                else:
                    # Made in memory and written at once: thousands of small writes of a text
                    # file object cost more than the formatting (measured: 0.2 s of 0.4 s for
                    # 200 images).
                    buf = io.BytesIO()
                    writers[name](rec, buf)
                    fh.write(buf.getbuffer())


def _carry_over(old: str, new: str) -> None:
    """The old folder's entries that are not a model's files (of either format) nor a writer's
    temporaries into the new folder: hard links (no copy, no extra space) where possible."""
    model = {name + ext for name in _MODEL_FILES for ext in (".txt", ".bin")}
    with os.scandir(old) as entries:
        for entry in entries:
            n = entry.name
            if n in model or n.endswith((atomic.TMP, atomic.OLD)) or (n.endswith(".partial") and n[:-8] in model):
                continue            # .partial: what this module's earlier writer left when killed
            target = os.path.join(new, n)
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir():
                shutil.copytree(entry.path, target, symlinks=True, copy_function=_link_or_copy)
            else:
                _link_or_copy(entry.path, target)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:             # another file system, or one without hard links
        shutil.copy2(src, dst)


def _g(v) -> str:
    return repr(float(v))           # shortest text that reads back to the same double


def _text_cameras(rec, fh):
    lines = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]",
             f"# Number of cameras: {rec.camera_ids.size}"]
    for cid, mid, (w, h), params in zip(rec.camera_ids, rec.camera_models, rec.camera_sizes, rec.camera_params):
        lines.append(" ".join([str(cid), _MODEL_NAMES[int(mid)], str(w), str(h)] + [_g(p) for p in params]))
    fh.write(("\n".join(lines) + "\n").encode())


def _text_images(rec, fh):
    out = ["# Image list with two lines of data per image:",
           "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME", "#   POINTS2D[] as (X, Y, POINT3D_ID)",
           f"# Number of images: {rec.image_ids.size}"]
    s = rec.image_points_start.tolist()
    # The 2-D points as one flat list of Python floats and ints, x, y, id in turn, and each
    # image's line as the repr of its slice: the list's repr formats every item in C (repr of a
    # float is the shortest text that reads back to the same double, as _g), where a generator of
    # f-strings formats them in Python. 200 images with 2.4M 2-D points: write_model 3.06 s against
    # 3.83 s on the 2-core CPU, the same bytes; most of what is left is repr's own work.
    flat = [0] * (3 * rec.points2d_point3d_ids.size)
    flat[0::3] = rec.points2d_xy[:, 0].tolist()
    flat[1::3] = rec.points2d_xy[:, 1].tolist()
    flat[2::3] = rec.points2d_point3d_ids.tolist()
    for k, iid in enumerate(rec.image_ids):
        out.append(" ".join([str(iid), *map(_g, rec.image_qvec[k]), *map(_g, rec.image_tvec[k]),
                             str(rec.image_camera_ids[k]), rec.image_names[k]]))
        out.append(repr(flat[3 * s[k]:3 * s[k + 1]])[1:-1].replace(", ", " "))
    fh.write(("\n".join(out) + "\n").encode())


def _text_points(rec, fh):
    out = ["# 3D point list with one line of data per point:",
           "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)",
           f"# Number of points: {rec.point_ids.size}"]
    s = rec.track_start.tolist()
    images, idx = rec.track_image_ids.tolist(), rec.track_point2d_idx.tolist()
    xyz, rgb, err = rec.point_xyz.tolist(), rec.point_rgb.tolist(), rec.point_error.astype(np.float64).tolist()
    for k, pid in enumerate(rec.point_ids.tolist()):
        a, b = s[k], s[k + 1]
        track = " ".join(f"{i} {j}" for i, j in zip(images[a:b], idx[a:b]))
        out.append(" ".join([str(pid), *map(repr, xyz[k]), *map(str, rgb[k]), repr(err[k]), track]).rstrip())
    fh.write(("\n".join(out) + "\n").encode())


def _text_rigs(rec, fh):
    out = ["# Rig calib list with one line of data per calib:",
           "#   RIG_ID, NUM_SENSORS, REF_SENSOR_TYPE, REF_SENSOR_ID, SENSORS[] as (SENSOR_TYPE, SENSOR_ID, "
           "HAS_POSE, [QW, QX, QY, QZ, TX, TY, TZ])", f"# Number of rigs: {rec.rig_ids.size}"]
    start, sensors, has_pose, qvec, tvec = rec.non_ref_sensors()
    for k, (rid, (stype, sid)) in enumerate(zip(rec.rig_ids, rec.rig_ref_sensors)):
        line = [str(rid), str(1 + start[k + 1] - start[k]), _SENSOR_NAMES[int(stype)], str(sid)]
        for j in range(start[k], start[k + 1]):
            line += [_SENSOR_NAMES[int(sensors[j, 0])], str(sensors[j, 1]), str(int(has_pose[j]))]
            if has_pose[j]:
                line += [*map(_g, qvec[j]), *map(_g, tvec[j])]
        out.append(" ".join(line))
    fh.write(("\n".join(out) + "\n").encode())


def _text_frames(rec, fh):
    out = ["# Frame list with one line of data per frame:",
           "#   FRAME_ID, RIG_ID, RIG_FROM_WORLD[QW, QX, QY, QZ, TX, TY, TZ], NUM_DATA_IDS, DATA_IDS[] as "
           "(SENSOR_TYPE, SENSOR_ID, DATA_ID)", f"# Number of frames: {rec.frame_ids.size}"]
    s = rec.frame_data_start
    for k, fid in enumerate(rec.frame_ids):
        data = rec.frame_data[s[k]:s[k + 1]]
        out.append(" ".join([str(fid), str(rec.frame_rig_ids[k]), *map(_g, rec.frame_qvec[k]),
                             *map(_g, rec.frame_tvec[k]), str(len(data))]
                            + [f"{_SENSOR_NAMES[int(t)]} {i} {d}" for t, i, d in data]))
    fh.write(("\n".join(out) + "\n").encode())


def _bin_cameras(rec, fh):
    fh.write(struct.pack("<Q", rec.camera_ids.size))
    for cid, mid, (w, h), params in zip(rec.camera_ids, rec.camera_models, rec.camera_sizes, rec.camera_params):
        fh.write(struct.pack("<IiQQ", cid, mid, w, h))
        fh.write(np.asarray(params, "<f8").tobytes())


def _bin_images(rec, fh):
    # Every image's 2-D points made in one array and written as slices of its bytes (no copy
    # per image): 2.4 million points for 200 images are 57 MB.
    fh.write(struct.pack("<Q", rec.image_ids.size))
    s = rec.image_points_start
    pts = np.empty(int(s[-1]), _POINT2D)
    pts["x"], pts["y"] = rec.points2d_xy[:, 0], rec.points2d_xy[:, 1]
    # Validated (write_model): -1 or an id of 0..2^63-1. The C cast makes -1 COLMAP's invalid id
    # (2^64 - 1) with no search for it.
    pts["id"] = rec.points2d_point3d_ids
    raw, size = pts.view(np.uint8), _POINT2D.itemsize
    for k, iid in enumerate(rec.image_ids):
        a, b = s[k], s[k + 1]
        fh.write(struct.pack("<I7dI", iid, *rec.image_qvec[k], *rec.image_tvec[k], rec.image_camera_ids[k])
                 + rec.image_names[k].encode("utf-8") + b"\0" + struct.pack("<Q", b - a))
        fh.write(raw[a * size:b * size])


def _bin_points(rec, fh):
    # One buffer for the whole file, filled by numpy (a record per point: its 51-byte header, then
    # its track of (image id, point2D index) uint32 pairs): a loop of struct calls took about
    # 10 us a point.
    n, s = rec.point_ids.size, rec.track_start
    head = np.empty(n, np.dtype([("id", "<u8"), ("xyz", "<f8", 3), ("rgb", "u1", 3), ("error", "<f8"),
                                 ("length", "<u8")]))        # packed: 51 bytes, as the file has them
    head["id"], head["xyz"], head["rgb"] = rec.point_ids, rec.point_xyz, rec.point_rgb
    head["error"], head["length"] = rec.point_error, np.diff(s)
    track = np.empty((int(s[-1]), 2), "<u4")
    track[:, 0], track[:, 1] = rec.track_image_ids, rec.track_point2d_idx      # validated: in range
    size = head.dtype.itemsize
    out = np.empty(8 + n * size + track.nbytes, np.uint8)
    out[:8] = np.frombuffer(struct.pack("<Q", n), np.uint8)
    # Point k's header starts after k headers and the tracks of the k points before it.
    at = 8 + np.arange(n, dtype=np.int64) * size + 8 * s[:-1]
    out[(at[:, None] + np.arange(size)).ravel()] = head.view(np.uint8)
    # Track element e (of point k) lies after k + 1 headers and the e elements before it.
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(s))
    where = 8 + (owner + 1) * size + 8 * np.arange(track.shape[0], dtype=np.int64)
    out[(where[:, None] + np.arange(8)).ravel()] = track.view(np.uint8).ravel()
    fh.write(out.tobytes())


def _bin_rigs(rec, fh):
    fh.write(struct.pack("<Q", rec.rig_ids.size))
    start, sensors, has_pose, qvec, tvec = rec.non_ref_sensors()
    for k, (rid, (stype, sid)) in enumerate(zip(rec.rig_ids, rec.rig_ref_sensors)):
        fh.write(struct.pack("<IIiI", rid, 1 + start[k + 1] - start[k], stype, sid))
        for j in range(start[k], start[k + 1]):
            fh.write(struct.pack("<iIB", sensors[j, 0], sensors[j, 1], int(has_pose[j])))
            if has_pose[j]:
                fh.write(struct.pack("<7d", *qvec[j], *tvec[j]))


def _bin_frames(rec, fh):
    fh.write(struct.pack("<Q", rec.frame_ids.size))
    s = rec.frame_data_start
    for k, fid in enumerate(rec.frame_ids):
        data = rec.frame_data[s[k]:s[k + 1]]
        fh.write(struct.pack("<II7dI", fid, rec.frame_rig_ids[k], *rec.frame_qvec[k], *rec.frame_tvec[k], len(data)))
        d = np.empty(len(data), np.dtype([("type", "<i4"), ("id", "<u4"), ("data", "<u8")]))
        d["type"], d["id"], d["data"] = data[:, 0], data[:, 1], data[:, 2]
        fh.write(d.tobytes())


_TEXT_WRITERS = {"cameras": _text_cameras, "images": _text_images, "points3D": _text_points,
                 "rigs": _text_rigs, "frames": _text_frames}
_BINARY_WRITERS = {"cameras": _bin_cameras, "images": _bin_images, "points3D": _bin_points,
                   "rigs": _bin_rigs, "frames": _bin_frames}
