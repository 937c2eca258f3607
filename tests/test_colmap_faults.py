"""solvers.colmap under faults: write_model is all or nothing (the model validated before the
disk is touched, written beside the folder and swapped in), so a write that fails or is killed
part-way leaves the old model; the reader names the file and the record of every inconsistency;
random damage to a model's files gives a Reconstruction or a ColmapFormatError naming a file,
never another exception."""
import dataclasses
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from solvers.io import atomic
from solvers import colmap
from solvers.warmup import tiny_reconstruction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = r"(cameras|images|points3D|rigs|frames)\.(txt|bin)"


def _model(n_images=3, n_points=8, seed=0):
    """A small consistent model: every 2-D point observes a 3-D point, ids from 1."""
    return tiny_reconstruction("SIMPLE_RADIAL", per_image=True, n_images=n_images, n_points=n_points, seed=seed)


def _copy(rec, **changes):
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
    fields = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in fields.items()}
    return colmap.Reconstruction(**{**fields, **changes})


def _snapshot(folder):
    """Every entry beside and under ``folder`` (temporaries live beside it), with a file's bytes."""
    parent, out = os.path.dirname(folder), {}
    for root, dirs, files in os.walk(parent):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), parent)] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                out[os.path.relpath(os.path.join(root, name), parent)] = fh.read()
    return out


def _temporaries(folder):
    return [n for n in os.listdir(os.path.dirname(folder)) if n.endswith((atomic.TMP, atomic.OLD))]


def _run(code, *args):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------------------ all or nothing

_WRITE_UNDER_LIMIT = """
    import resource, signal, sys
    from solvers import colmap
    from solvers.warmup import tiny_reconstruction
    out, binary, limit = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    rec = tiny_reconstruction("SIMPLE_RADIAL", per_image=False, n_images=1, n_points=400, seed=1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit raises EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        colmap.write_model(rec, out, binary=binary)
    except OSError as e:
        print("errno", e.errno)
    else:
        print("written")
"""


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_a_write_failing_part_way_leaves_the_old_model(tmp_path, binary):
    import errno
    new = tiny_reconstruction("SIMPLE_RADIAL", per_image=False, n_images=1, n_points=400, seed=1)
    scratch, out = str(tmp_path / "scratch"), str(tmp_path / "model")
    colmap.write_model(new, scratch, binary=binary)
    size = {n: os.path.getsize(os.path.join(scratch, n)) for n in os.listdir(scratch)}
    ext = ".bin" if binary else ".txt"
    limit = max(size["cameras" + ext], size["images" + ext]) + 16     # the points file cannot be written
    assert size["points3D" + ext] > limit
    colmap.write_model(_model(n_images=1, n_points=50), out, binary=binary)
    before = _snapshot(out)
    proc = _run(_WRITE_UNDER_LIMIT, out, int(binary), limit)
    stdout, stderr = proc.communicate(timeout=60)
    assert stdout.split() == ["errno", str(errno.EFBIG)], stderr
    assert _snapshot(out) == before                          # the old model, byte for byte; no temporary
    np.testing.assert_array_equal(colmap.read_model(out).point_xyz, _model(n_images=1, n_points=50).point_xyz)
    colmap.write_model(new, out, binary=binary)
    assert not _temporaries(out)
    np.testing.assert_array_equal(colmap.read_model(out).point_xyz, new.point_xyz)


_WRITE_LARGE = """
    import sys
    from solvers import colmap
    from solvers.warmup import tiny_reconstruction
    rec = tiny_reconstruction("SIMPLE_RADIAL", per_image=True, n_images=10, n_points=20000)
    print("writing", flush=True)
    colmap.write_model(rec, sys.argv[1])
"""


def test_a_writer_killed_mid_write_leaves_the_old_model_and_its_temporary_is_removed_next(tmp_path):
    out = str(tmp_path / "model")
    old = _model()
    colmap.write_model(old, out)
    before = _snapshot(out)
    proc = _run(_WRITE_LARGE, out)
    pattern = re.compile(rf"\.model\.{proc.pid}\.\w+{re.escape(atomic.TMP)}$")
    deadline = time.monotonic() + 60
    while not any(pattern.match(n) for n in os.listdir(tmp_path)):
        assert proc.poll() is None, "the writer ended before its temporary folder was seen: " + proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    stale = [n for n in os.listdir(tmp_path) if pattern.match(n)]
    assert stale                                             # what the killed writer left
    assert {k: v for k, v in _snapshot(out).items() if not k.startswith(stale[0])} == before
    np.testing.assert_array_equal(colmap.read_model(out).points2d_xy, old.points2d_xy)
    new = _model(seed=1)
    colmap.write_model(new, out)
    assert not _temporaries(out)
    np.testing.assert_array_equal(colmap.read_model(out).points2d_xy, new.points2d_xy)


def _bad_image_id(rec):
    rec.image_ids[1] = 2 ** 32 + 1
    return r"image 4294967297: the id is out of range 0\.\.4294967295"


def _negative_width(rec):
    rec.camera_sizes[0, 0] = -640
    return r"camera 1: width and height must be positive, not -640 x 480"


def _track_missing_image(rec):
    rec.track_image_ids[rec.track_start[11]] = 99
    return r"point 12: track element 0 names image 99, which does not exist"


def _track_negative_index(rec):
    rec.track_point2d_idx[rec.track_start[11] + 2] = -3
    return r"point 12: track element 2 names image 3, point2D_idx -3, which is not one of its 20 2-D points"


def _nan_xyz(rec):
    rec.point_xyz[4, 1] = np.nan
    return r"point 5: X Y Z is not finite \(\[.*, nan, .*\]\)"


def _point2d_missing_point(rec):
    rec.points2d_point3d_ids[3] = 77
    return r"image 1: point2D 3 names 3-D point 77, which does not exist \(-1 for none\)"


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("damage", [_bad_image_id, _negative_width, _track_missing_image, _track_negative_index,
                                    _nan_xyz, _point2d_missing_point], ids=lambda f: f.__name__[1:])
def test_an_invalid_model_is_refused_before_anything_is_written(tmp_path, binary, damage):
    out, fresh = str(tmp_path / "model"), str(tmp_path / "fresh")
    colmap.write_model(_model(n_points=20), out, binary=binary)
    before = _snapshot(out)
    bad = _copy(_model(n_points=20, seed=1))
    message = damage(bad)
    for target in (out, fresh):
        with pytest.raises(colmap.ColmapModelError, match=message) as info:
            colmap.write_model(bad, target, binary=binary)
        assert isinstance(info.value, ValueError)
        assert _snapshot(out) == before                     # the old model, and no new file at all


def test_other_files_survive_a_rewrite_and_the_other_format_is_dropped(tmp_path):
    out = tmp_path / "model"
    colmap.write_model(_model(), str(out))
    (out / "project.ini").write_text("[General]\n")
    (out / "notes").mkdir()
    (out / "notes" / "a.txt").write_text("kept")
    os.symlink("project.ini", out / "link")
    for stale in ("rigs.txt", "frames.bin", "points3D.bin.partial"):   # no model of this write
        (out / stale).write_bytes(b"stale")
    inode = os.stat(out / "project.ini").st_ino
    colmap.write_model(_model(seed=1), str(out), binary=True)
    assert sorted(os.listdir(out)) == ["cameras.bin", "images.bin", "link", "notes", "points3D.bin", "project.ini"]
    assert os.stat(out / "project.ini").st_ino == inode                # hard-linked, not copied
    assert (out / "notes" / "a.txt").read_text() == "kept" and os.readlink(out / "link") == "project.ini"
    colmap.write_model(_model(seed=2), str(out))
    assert sorted(os.listdir(out)) == ["cameras.txt", "images.txt", "link", "notes", "points3D.txt", "project.ini"]
    np.testing.assert_array_equal(colmap.read_model(str(out)).point_xyz, _model(seed=2).point_xyz)
    assert not _temporaries(str(out))


def test_a_dangling_symlink_in_the_folder_does_not_stop_a_write(tmp_path):
    out = tmp_path / "model"
    colmap.write_model(_model(), str(out))
    os.symlink("gone", out / "dangling")
    colmap.write_model(_model(seed=1), str(out))
    assert os.readlink(out / "dangling") == "gone"
    np.testing.assert_array_equal(colmap.read_model(str(out)).point_xyz, _model(seed=1).point_xyz)


def test_a_missing_folder_is_made_with_its_parents(tmp_path):
    out = tmp_path / "a" / "b" / "model"
    colmap.write_model(_model(), str(out), binary=True)
    assert sorted(os.listdir(out)) == ["cameras.bin", "images.bin", "points3D.bin"]
    with pytest.raises(NotADirectoryError):
        colmap.write_model(_model(), str(out / "cameras.bin"))


# ------------------------------------------------------------------------------ reading checks

def _edit(path, line_of, change):
    """Apply ``change`` to the data line (no comment) for which ``line_of`` holds."""
    lines = path.read_text().split("\n")
    k = next(i for i, s in enumerate(lines) if s and not s.startswith("#") and line_of(s))
    lines[k] = change(lines[k])
    path.write_text("\n".join(lines))


def _field(k, value):
    return lambda s: " ".join(value if i == k else t for i, t in enumerate(s.split()))


TEXT_CASES = {
    "duplicate-camera": ("cameras.txt", lambda d: (d / "cameras.txt").write_text(
        (d / "cameras.txt").read_text() + (d / "cameras.txt").read_text().splitlines()[-1] + "\n"),
        r"camera 3: the id appears twice \(records 2 and 3\)"),
    "duplicate-image": ("images.txt", lambda d: _edit(d / "images.txt", lambda s: s.startswith("2 "), _field(0, "1")),
                        r"image 1: the id appears twice"),
    "duplicate-point": ("points3D.txt", lambda d: _edit(d / "points3D.txt", lambda s: s.startswith("2 "),
                                                        _field(0, "1")), r"point 1: the id appears twice"),
    "track-missing-image": ("points3D.txt", lambda d: _edit(d / "points3D.txt", lambda s: s.startswith("4 "),
                                                            _field(10, "9")),
                            r"point 4: track element 1 names image 9, which does not exist"),
    "track-index-range": ("points3D.txt", lambda d: _edit(d / "points3D.txt", lambda s: s.startswith("4 "),
                                                          _field(11, "8")),
                          r"point 4: track element 1 names image 2, point2D_idx 8, which is not one of its "
                          r"8 2-D points"),
    "image-missing-camera": ("images.txt", lambda d: _edit(d / "images.txt", lambda s: s.startswith("3 "),
                                                           _field(8, "5")), r"image 3: camera 5 does not exist"),
    "point2d-missing-point": ("images.txt", lambda d: _edit(d / "images.txt", lambda s: s.count(" ") > 20,
                                                            _field(5, "77")),
                              r"image 1: point2D 1 names 3-D point 77, which does not exist"),
    "nan-observation": ("images.txt", lambda d: _edit(d / "images.txt", lambda s: s.count(" ") > 20, _field(3, "nan")),
                        r"image 1: point2D 1 is not finite \(nan, "),
    "zero-width": ("cameras.txt", lambda d: _edit(d / "cameras.txt", lambda s: s.startswith("2 "), _field(2, "0")),
                   r"camera 2: width and height must be positive, not 0 x 480"),
    "inf-parameter": ("cameras.txt", lambda d: _edit(d / "cameras.txt", lambda s: s.startswith("2 "), _field(4, "inf")),
                      r"camera 2: parameters are not finite \(\[inf, "),
}


@pytest.mark.parametrize("case", sorted(TEXT_CASES))
def test_reading_text_names_the_file_and_the_record(tmp_path, case):
    file, damage, message = TEXT_CASES[case]
    colmap.write_model(_model(), str(tmp_path))
    damage(tmp_path)
    with pytest.raises(colmap.ColmapFormatError, match=re.escape(str(tmp_path / file)) + ": " + message):
        colmap.read_model(str(tmp_path))


def _image_offsets(data):
    """Byte offset of each image record of images.bin."""
    n, pos, out = int.from_bytes(data[:8], "little"), 8, []
    for _ in range(n):
        out.append(pos)
        pos = data.index(b"\0", pos + 64) + 1
        pos += 8 + 24 * int.from_bytes(data[pos:pos + 8], "little")
    return out


@pytest.mark.parametrize("case", ["duplicate-image", "nan-observation", "huge-count"])
def test_reading_binary_names_the_file_and_the_record(tmp_path, case):
    colmap.write_model(_model(), str(tmp_path), binary=True)
    f = tmp_path / "images.bin"
    data = bytearray(f.read_bytes())
    at = _image_offsets(data)
    if case == "duplicate-image":
        data[at[2]:at[2] + 4] = (1).to_bytes(4, "little")
        message = r"images\.bin: image 1: the id appears twice"
    elif case == "nan-observation":
        first_point = data.index(b"\0", at[1] + 64) + 1 + 8        # image 2's point2D 0: x, y, id
        data[first_point + 8:first_point + 16] = np.float64(np.nan).tobytes()
        message = r"images\.bin: image 2: point2D 0 is not finite \(\S+, nan\)"
    else:
        f = tmp_path / "points3D.bin"
        data = bytearray(f.read_bytes())
        data[:8] = (2 ** 62).to_bytes(8, "little")                  # no file this size holds that many
        message = r"points3D\.bin: the header: 4611686018427387904 points cannot fit"
    f.write_bytes(bytes(data))
    with pytest.raises(colmap.ColmapFormatError, match=message):
        colmap.read_model(str(tmp_path))


@pytest.mark.parametrize("points_file", ["", "# 3D point list\n# Number of points: 0\n"], ids=["empty", "comments"])
def test_a_model_without_3d_points_reads(tmp_path, points_file):
    rec = _model()
    rec = _copy(rec, points2d_point3d_ids=np.full_like(rec.points2d_point3d_ids, -1), point_ids=np.zeros(0, np.int64),
                point_xyz=np.zeros((0, 3)), point_rgb=np.zeros((0, 3), np.uint8), point_error=np.zeros(0),
                track_start=np.zeros(1, np.int64), track_image_ids=np.zeros(0, np.int64),
                track_point2d_idx=np.zeros(0, np.int64))
    for binary in (False, True):
        colmap.write_model(rec, str(tmp_path / "m"), binary=binary)
        if not binary:
            (tmp_path / "m" / "points3D.txt").write_text(points_file)
        again = colmap.read_model(str(tmp_path / "m"))
        assert again.point_ids.size == 0 and again.track_start.tolist() == [0] and again.num_observations == 0
        np.testing.assert_array_equal(again.points2d_xy, rec.points2d_xy)


# ------------------------------------------------------------------------------ fuzzing

def _rig_model():
    """A small model with rigs and frames (pycolmap's synthetic scene), so every file is damaged."""
    pycolmap = pytest.importorskip("pycolmap")
    opts = pycolmap.SyntheticDatasetOptions()
    opts.num_rigs, opts.num_cameras_per_rig, opts.num_frames_per_rig, opts.num_points3D = 1, 1, 3, 10
    pycolmap.set_random_seed(0)
    return pycolmap.synthesize_dataset(opts)


def _damage(rng, files, binary):
    """One file of ``files`` truncated, or some of its bytes replaced (digits and separators
    for a text file half of the time, so that more damage parses)."""
    name = rng.choice(sorted(files))
    data = bytearray(files[name])
    if rng.random() < 0.3:
        data = data[:rng.randrange(len(data) + 1)]
    else:
        for _ in range(rng.choice([1, 1, 2, 4])):
            k = rng.randrange(len(data))
            data[k] = ord(rng.choice("0123456789 -.\n#enaif")) if not binary and rng.random() < 0.5 \
                else rng.randrange(256)
    return {**files, name: bytes(data)}


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_damaged_files_read_as_a_model_or_a_format_error_naming_the_file(tmp_path, binary):
    model = tmp_path / "model"
    model.mkdir()
    rec = _rig_model()
    (rec.write_binary if binary else rec.write_text)(str(model))
    files = {n: (model / n).read_bytes() for n in os.listdir(model)}
    assert len(files) == 5
    rng = random.Random(1234 + binary)
    case = tmp_path / "case"
    case.mkdir()
    outcomes = {"read": 0, "refused": 0}
    for _ in range(250):
        for name, data in _damage(rng, files, binary).items():
            (case / name).write_bytes(data)
        try:
            got = colmap.read_model(str(case))
        except colmap.ColmapFormatError as e:
            assert re.match(re.escape(str(case)) + "/" + MODEL_FILE + ": ", str(e)), str(e)
            outcomes["refused"] += 1
        else:
            assert isinstance(got, colmap.Reconstruction)
            outcomes["read"] += 1
    assert min(outcomes.values()) > 10, outcomes        # both outcomes are exercised
