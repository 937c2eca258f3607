"""COLMAP models (solvers.colmap) against pycolmap: what pycolmap writes we read with pycolmap's
values, what we write pycolmap reads back with equal values, in text and binary, with rigs and
frames and as the classic three files; malformed files name the file and where."""
import os

import numpy as np
import pycolmap  # a test dependency: pip install ".[test]"
import pytest

from solvers import colmap


def _synthetic(shared_camera: bool, seed: int = 0):
    opts = pycolmap.SyntheticDatasetOptions()
    opts.num_rigs = 1 if shared_camera else 4
    opts.num_cameras_per_rig = 1
    opts.num_frames_per_rig = 8 if shared_camera else 2
    opts.num_points3D = 60
    pycolmap.set_random_seed(seed)
    rec = pycolmap.synthesize_dataset(opts)
    noise = pycolmap.SyntheticNoiseOptions()
    noise.point2D_stddev, noise.point3D_stddev = 0.7, 0.05
    pycolmap.synthesize_noise(noise, rec)
    for pid in list(rec.points3D)[:5]:                  # colours and errors that are not all zero
        p = rec.points3D[pid]
        p.color, p.error = np.array([pid % 256, 7, 200], np.uint8), 0.25 * pid
    return rec


def _assert_matches_pycolmap(ours: colmap.Reconstruction, rec):
    assert sorted(rec.cameras) == list(np.sort(ours.camera_ids))
    for k, cid in enumerate(ours.camera_ids):
        cam = rec.cameras[int(cid)]
        assert int(cam.model.value) == ours.camera_models[k]
        assert (cam.width, cam.height) == tuple(ours.camera_sizes[k])
        np.testing.assert_array_equal(cam.params, ours.camera_params[k])
    assert sorted(rec.images) == sorted(ours.image_ids.tolist())
    for k, iid in enumerate(ours.image_ids):
        im = rec.images[int(iid)]
        pose = im.cam_from_world()
        xyzw = pose.rotation.quat
        np.testing.assert_array_equal(ours.image_qvec[k], [xyzw[3], *xyzw[:3]])
        np.testing.assert_array_equal(ours.image_tvec[k], pose.translation)
        assert ours.image_names[k] == im.name and ours.image_camera_ids[k] == im.camera_id
        a, b = ours.image_points_start[k], ours.image_points_start[k + 1]
        np.testing.assert_array_equal(ours.points2d_xy[a:b], np.array([p.xy for p in im.points2D]).reshape(-1, 2))
        want_ids = [p.point3D_id if p.has_point3D() else -1 for p in im.points2D]
        np.testing.assert_array_equal(ours.points2d_point3d_ids[a:b], want_ids)
    assert sorted(rec.points3D) == sorted(ours.point_ids.tolist())
    for k, pid in enumerate(ours.point_ids):
        p = rec.points3D[int(pid)]
        np.testing.assert_array_equal(ours.point_xyz[k], p.xyz)
        np.testing.assert_array_equal(ours.point_rgb[k], p.color)
        assert ours.point_error[k] == p.error
        a, b = ours.track_start[k], ours.track_start[k + 1]
        track = [(e.image_id, e.point2D_idx) for e in p.track.elements]
        np.testing.assert_array_equal(np.stack([ours.track_image_ids[a:b], ours.track_point2d_idx[a:b]], 1),
                                      np.array(track).reshape(-1, 2))


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("shared_camera", [True, False], ids=["shared-camera", "camera-per-image"])
def test_round_trip_with_pycolmap(tmp_path, binary, shared_camera):
    rec = _synthetic(shared_camera)
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (rec.write_binary if binary else rec.write_text)(str(src))
    ours = colmap.read_model(str(src))
    assert ours.has_rigs and ours.num_observations == rec.compute_num_observations()
    assert any((ours.points2d_point3d_ids == -1)) and ours.camera_ids.size == (1 if shared_camera else 4)
    _assert_matches_pycolmap(ours, rec)
    colmap.write_model(ours, str(out), binary=binary)
    assert not [f for f in os.listdir(out) if f.endswith(".partial")]
    _assert_matches_pycolmap(colmap.read_model(str(out)), rec)
    _assert_matches_pycolmap(ours, pycolmap.Reconstruction(str(out)))      # pycolmap reads ours
    if binary:      # the binary files byte for byte as pycolmap writes them (a model without rigs' poses)
        for name in sorted(os.listdir(src)):
            assert (out / name).read_bytes() == (src / name).read_bytes(), name


def test_text_and_binary_hold_the_same_model(tmp_path):
    rec = _synthetic(False, seed=2)
    rec.write_text(str(tmp_path))
    text = colmap.read_model(str(tmp_path))
    colmap.write_model(text, str(tmp_path / "bin"), binary=True)
    binary = colmap.read_model(str(tmp_path / "bin"))
    for field in ("image_qvec", "image_tvec", "points2d_xy", "points2d_point3d_ids", "point_xyz", "track_start",
                  "track_image_ids", "frame_qvec", "frame_data"):
        np.testing.assert_array_equal(getattr(text, field), getattr(binary, field), err_msg=field)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_classic_three_file_model(tmp_path, binary):
    rec = _synthetic(False, seed=3)
    rec.write_text(str(tmp_path))
    ours = colmap.read_model(str(tmp_path))
    ours.rig_ids = None                   # what an older COLMAP writes: no rigs, no frames
    classic = tmp_path / "classic"
    colmap.write_model(ours, str(classic), binary=binary)
    assert sorted(os.listdir(classic)) == sorted(f"{n}.{'bin' if binary else 'txt'}" for n in ("cameras", "images", "points3D"))
    again = colmap.read_model(str(classic))
    assert not again.has_rigs
    _assert_matches_pycolmap(again, rec)
    _assert_matches_pycolmap(again, pycolmap.Reconstruction(str(classic)))


def _text_model(tmp_path):
    rec = _synthetic(True, seed=4)
    rec.write_text(str(tmp_path))
    return tmp_path


def _edit_line(path, match, new):
    lines = open(path).read().split("\n")
    k = next(i for i, s in enumerate(lines) if s and not s.startswith("#") and match(s))
    lines[k] = new(lines[k])
    open(path, "w").write("\n".join(lines))
    return k + 1


@pytest.mark.parametrize("case", ["param-count", "model", "points2d", "point-fields", "point-token", "point-colour",
                                  "rig-sensors"])
def test_malformed_text_names_file_and_line(tmp_path, case):
    d = _text_model(tmp_path)
    if case == "param-count":
        f, no = "cameras.txt", _edit_line(d / "cameras.txt", lambda s: True, lambda s: s + " 0.5")
        msg = "SIMPLE_RADIAL takes 4 parameters, not 5"
    elif case == "model":
        f, no = "cameras.txt", _edit_line(d / "cameras.txt", lambda s: True, lambda s: s.replace("SIMPLE_RADIAL", "SIMPLE_RADIALX"))
        msg = "unknown camera model 'SIMPLE_RADIALX'"
    elif case == "points2d":
        f, no = "images.txt", _edit_line(d / "images.txt", lambda s: s.count(" ") > 20, lambda s: s + " 3.5")
        msg = "POINTS2D must be triples"
    elif case == "point-fields":
        f, no = "points3D.txt", _edit_line(d / "points3D.txt", lambda s: True, lambda s: s + " 7")
        msg = "expected POINT3D_ID X Y Z R G B ERROR TRACK"
    elif case == "point-token":
        f, no = "points3D.txt", _edit_line(d / "points3D.txt", lambda s: s.startswith("7 "),
                                           lambda s: " ".join(["7", "abc"] + s.split()[2:]))
        msg = "expected POINT3D_ID X Y Z R G B ERROR TRACK"
    elif case == "point-colour":
        f, no = "points3D.txt", _edit_line(d / "points3D.txt", lambda s: s.startswith("9 "),
                                           lambda s: " ".join(s.split()[:4] + ["300"] + s.split()[5:]))
        msg = "R G B must be in 0..255"
    else:      # two sensors announced, one given
        f, no = "rigs.txt", _edit_line(d / "rigs.txt", lambda s: True, lambda s: s.replace(" 1 CAMERA", " 2 CAMERA"))
        msg = "expected RIG_ID NUM_SENSORS REF_SENSOR_TYPE REF_SENSOR_ID, then per other sensor"
    with pytest.raises(colmap.ColmapFormatError, match=rf"{f}: line {no}: .*{msg}"):
        colmap.read_model(str(d))


@pytest.mark.parametrize("case", ["truncated", "trailing", "model-id"])
def test_malformed_binary_names_file_and_record(tmp_path, case):
    rec = _synthetic(True, seed=5)
    rec.write_binary(str(tmp_path))
    if case == "truncated":
        data = open(tmp_path / "points3D.bin", "rb").read()
        open(tmp_path / "points3D.bin", "wb").write(data[:len(data) - 5])
        pattern = r"points3D\.bin: point record 59 at byte \d+: the file ends"
    elif case == "trailing":
        with open(tmp_path / "images.bin", "ab") as fh:
            fh.write(b"\0\0\0")
        pattern = r"images\.bin: byte \d+: 3 bytes left after the last record"
    else:
        data = bytearray(open(tmp_path / "cameras.bin", "rb").read())
        data[12:16] = (99).to_bytes(4, "little")        # camera 0's model id
        open(tmp_path / "cameras.bin", "wb").write(bytes(data))
        pattern = r"cameras\.bin: camera record 0: unknown camera model id 99"
    with pytest.raises(colmap.ColmapFormatError, match=pattern):
        colmap.read_model(str(tmp_path))


def _rig_synthetic(cameras_per_rig, seed=0):
    pycolmap.set_random_seed(seed)
    o = pycolmap.SyntheticDatasetOptions(num_rigs=2, num_cameras_per_rig=cameras_per_rig, num_frames_per_rig=3,
                                         num_points3D=60, track_length=4)
    rec = pycolmap.synthesize_dataset(o)
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(point2D_stddev=0.5), rec)
    return rec


def _assert_rigs_match_pycolmap(ours, rec):
    assert sorted(rec.rigs) == sorted(ours.rig_ids.tolist())
    start, sensors, has_pose, qvec, tvec = ours.non_ref_sensors()
    for k, rid in enumerate(ours.rig_ids):
        rig = rec.rigs[int(rid)]
        assert (int(rig.ref_sensor_id.type.value), rig.ref_sensor_id.id) == tuple(ours.rig_ref_sensors[k])
        want = {(int(t.type.value), t.id): pose for t, pose in rig.non_ref_sensors.items()}
        got = {tuple(sensors[j]): j for j in range(start[k], start[k + 1])}
        assert sorted(got) == sorted(want)
        for key, j in got.items():
            assert has_pose[j] == (want[key] is not None)
            xyzw = want[key].rotation.quat
            np.testing.assert_array_equal(qvec[j], [xyzw[3], *xyzw[:3]])
            np.testing.assert_array_equal(tvec[j], want[key].translation)
    for k, fid in enumerate(ours.frame_ids):
        frame = rec.frames[int(fid)]
        assert frame.rig_id == ours.frame_rig_ids[k]
        a, b = ours.frame_data_start[k], ours.frame_data_start[k + 1]
        assert sorted(ours.frame_data[a:b].tolist()) == \
            sorted([int(d.sensor_id.type.value), d.sensor_id.id, d.id] for d in frame.data_ids)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("cameras_per_rig", [2, 6])
def test_rigs_of_several_cameras_round_trip(tmp_path, binary, cameras_per_rig):
    """Rigs of 2 and 6 cameras with their sensor_from_rig poses, frames of 2 and 6 images: read
    as pycolmap wrote them, written so that pycolmap reads the same (binary: byte for byte)."""
    rec = _rig_synthetic(cameras_per_rig)
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (rec.write_binary if binary else rec.write_text)(str(src))
    ours = colmap.read_model(str(src))
    assert ours.has_multi_sensor_rigs and ours.rig_sensors.shape[0] == 2 * (cameras_per_rig - 1)
    _assert_matches_pycolmap(ours, rec)
    _assert_rigs_match_pycolmap(ours, rec)
    colmap.write_model(ours, str(out), binary=binary)
    back = pycolmap.Reconstruction(str(out))
    _assert_matches_pycolmap(ours, back)
    _assert_rigs_match_pycolmap(ours, back)
    if binary:
        for name in sorted(os.listdir(src)):
            assert (out / name).read_bytes() == (src / name).read_bytes(), name


@pytest.mark.parametrize("case", ["has-pose", "pose-short", "unknown-camera", "two-rigs"])
def test_malformed_rigs_name_the_rig(tmp_path, case):
    """A rig line that does not parse names the file and line; one that parses but names a camera
    that does not exist, or a camera already in another rig, names the rig."""
    rec = _rig_synthetic(2, seed=3)
    rec.write_text(str(tmp_path))
    f = tmp_path / "rigs.txt"
    if case == "has-pose":
        no = _edit_line(f, lambda s: True, lambda s: " ".join(s.split()[:6] + ["2"] + s.split()[7:]))
        pattern = rf"rigs.txt: line {no}: .*HAS_POSE must be 0 or 1"
    elif case == "pose-short":
        no = _edit_line(f, lambda s: True, lambda s: " ".join(s.split()[:-1]))
        pattern = rf"rigs.txt: line {no}: .*a pose takes 7 numbers"
    elif case == "unknown-camera":
        _edit_line(f, lambda s: True, lambda s: " ".join(s.split()[:5] + ["77"] + s.split()[6:]))
        pattern = r"rigs.txt: rig 1: sensor \(CAMERA 77\) is no camera or IMU of this model"
    else:           # rig 2 also claims rig 1's second camera
        _edit_line(f, lambda s: s.startswith("2 "), lambda s: " ".join(s.split()[:5] + ["2"] + s.split()[6:]))
        pattern = r"rigs.txt: sensor \(CAMERA 2\) belongs to rigs 1 and 2"
    with pytest.raises(colmap.ColmapFormatError, match=pattern):
        colmap.read_model(str(tmp_path))


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds neither cameras.bin nor cameras.txt"):
        colmap.read_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        colmap.read_model(str(tmp_path / "missing"))


def test_camera_model_table_is_colmaps():
    for name, (mid, nparams) in colmap.CAMERA_MODELS.items():
        cam = pycolmap.Camera.create_from_model_name(1, name, 100.0, 10, 10)
        assert (int(cam.model.value), len(cam.params)) == (mid, nparams), name


def test_write_model_refuses_a_bad_camera_and_leaves_no_partial_file(tmp_path):
    rec = _synthetic(True, seed=6)
    rec.write_text(str(tmp_path))
    ours = colmap.read_model(str(tmp_path))
    out = tmp_path / "out"
    bad = colmap.Reconstruction(**{**ours.__dict__, "camera_params": [p[:2] for p in ours.camera_params]})
    with pytest.raises(ValueError, match=r"camera 1: SIMPLE_RADIAL takes 4 parameters, not 2"):
        colmap.write_model(bad, str(out))
    assert not out.exists()
    broken = colmap.Reconstruction(**{**ours.__dict__, "point_rgb": None})    # refused before any file
    with pytest.raises(colmap.ColmapModelError, match=r"point_rgb has shape \(\)"):
        colmap.write_model(broken, str(out), binary=True)
    assert not out.exists()
