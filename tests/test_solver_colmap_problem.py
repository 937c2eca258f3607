"""COLMAP reconstructions through solvers.Problem, against pycolmap's own bundle adjustment
(Ceres inside COLMAP) on reconstructions from pycolmap.synthesize_dataset: the same initial cost,
the same number of effective parameters after the gauge, the final cost, and the model written
back as pycolmap reads it."""
import numpy as np
import pytest

pycolmap = pytest.importorskip("pycolmap")

import solvers
from solvers import colmap
from solvers.colmap.cli import main as colmap_main
from solvers.colmap.rotations import angle_axis_to_quaternion, quaternion_to_angle_axis


def synthetic(tmp_path, n_images=12, per_image_cameras=False, model="SIMPLE_RADIAL", seed=0):
    pycolmap.set_random_seed(seed)
    params = {"SIMPLE_RADIAL": [1280.0, 512.0, 384.0, 0.05], "PINHOLE": [1200.0, 1210.0, 512.0, 384.0],
              "OPENCV": [1200.0, 1210.0, 512.0, 384.0, 0.02, -0.01, 0.001, -0.002],
              "OPENCV_FISHEYE": [600.0, 610.0, 512.0, 384.0, 0.05, -0.01, 0.002, -0.001],
              "FULL_OPENCV": [1200.0, 1210.0, 512.0, 384.0, 0.02, -0.01, 0.001, -0.002, 0.003, 0.01, -0.004, 0.001],
              "FOV": [1200.0, 1210.0, 512.0, 384.0, 0.6],
              "SIMPLE_DIVISION": [1280.0, 512.0, 384.0, -0.05],
              "EUCM": [600.0, 610.0, 512.0, 384.0, 0.6, 1.1],
              "RAD_TAN_THIN_PRISM_FISHEYE": [600.0, 610.0, 512.0, 384.0, 0.05, -0.02, 0.004, -0.001, 2e-4, -1e-4,
                                             1e-3, -2e-3, 2e-3, -1e-3, 5e-4, 3e-4]}[model]
    o = pycolmap.SyntheticDatasetOptions(
        num_rigs=n_images if per_image_cameras else 1, num_cameras_per_rig=1,
        num_frames_per_rig=1 if per_image_cameras else n_images, num_points3D=40 * n_images, track_length=6,
        num_points2D_without_point3D=3, camera_model_id=getattr(pycolmap.CameraModelId, model),
        camera_params=params)
    rec = pycolmap.synthesize_dataset(o)
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=0.8, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    path = tmp_path / "model"
    path.mkdir()
    rec.write_text(str(path))
    return rec, str(path)


def pycolmap_ba(rec, refine_principal_point=False, loss="TRIVIAL", iterations=100):
    opts = pycolmap.BundleAdjustmentOptions(print_summary=False)
    opts.refine_principal_point = refine_principal_point
    opts.ceres.loss_function_type = getattr(pycolmap.LossFunctionType, loss)
    so = opts.ceres.solver_options
    so.max_num_iterations, so.function_tolerance = iterations, 1e-10
    so.gradient_tolerance, so.parameter_tolerance, so.num_threads = 1e-12, 1e-12, 2
    cfg = pycolmap.BundleAdjustmentConfig()
    for i in sorted(rec.reg_image_ids()):
        cfg.add_image(i)
    cfg.fix_gauge(pycolmap.BundleAdjustmentGauge.TWO_CAMS_FROM_WORLD)
    return pycolmap.create_default_bundle_adjuster(opts, cfg, rec).solve().ceres_summary


def test_quaternion_and_angle_axis_round_trip():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(50, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[0] = [1, 0, 0, 0]
    q[1] = [1, 1e-14, 0, 0]
    w = quaternion_to_angle_axis(q)
    back = angle_axis_to_quaternion(w)
    np.testing.assert_allclose(back, np.where(q[:, :1] < 0, -q, q) / np.linalg.norm(q, axis=1, keepdims=True), atol=1e-12)
    # Against pycolmap's rotation matrices.
    for qi, wi in zip(q[2:6], w[2:6]):
        R = pycolmap.Rotation3d(np.array([qi[1], qi[2], qi[3], qi[0]])).matrix()
        R2 = pycolmap.Rotation3d(wi).matrix()
        np.testing.assert_allclose(R, R2, atol=1e-12)


@pytest.mark.parametrize("model,per_image", [("SIMPLE_RADIAL", False), ("OPENCV", True), ("PINHOLE", False),
                                             ("OPENCV_FISHEYE", True), ("FOV", False),
                                             ("SIMPLE_DIVISION", True), ("EUCM", False),
                                             ("RAD_TAN_THIN_PRISM_FISHEYE", False)])
def test_bundle_adjustment_matches_pycolmap(tmp_path, model, per_image):
    rec, path = synthetic(tmp_path, model=model, per_image_cameras=per_image)
    ours = colmap.read_model(path)
    prob = colmap.problem_from_reconstruction(ours)
    r = solvers.solve(prob, max_iterations=100, function_tolerance=1e-10, gradient_tolerance=1e-12,
                      parameter_tolerance=1e-12, handle_sigint=False)
    cs = pycolmap_ba(rec)
    assert r.initial_cost == pytest.approx(cs.initial_cost, rel=1e-9)
    assert r.num_effective_parameters == cs.num_effective_parameters_reduced
    assert r.final_cost == pytest.approx(cs.final_cost, rel=1e-6)
    # Written back and read by pycolmap: our solution, whose cost pycolmap's projection confirms.
    colmap.update_reconstruction(ours, r)
    colmap.write_model(ours, str(tmp_path / "out"), binary=True)
    back = pycolmap.Reconstruction(str(tmp_path / "out"))
    cost = 0.0
    for image in back.images.values():
        cam = back.cameras[image.camera_id]
        pts = image.get_observation_points2D()
        X = np.array([back.points3D[p.point3D_id].xyz for p in pts])
        xy = np.array([p.xy for p in pts])
        proj = cam.img_from_cam(image.cam_from_world() * X)
        cost += 0.5 * np.sum((proj - xy) ** 2)
    assert cost == pytest.approx(r.final_cost, rel=1e-9)
    # The principal point is held (COLMAP's default), the focal length refined.
    for k, c in enumerate(ours.camera_ids):
        before = rec.cameras[int(c)].params
        pp = list(rec.cameras[int(c)].principal_point_idxs())
        np.testing.assert_array_equal(ours.camera_params[k][pp], before[pp])
        assert ours.camera_params[k][0] != before[0]
    # The points' ERROR column is what COLMAP computes from the solution.
    mine = {pid: p.error for pid, p in back.points3D.items()}
    back.update_point_3d_errors()
    np.testing.assert_allclose([mine[p] for p in sorted(mine)], [back.points3D[p].error for p in sorted(mine)],
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("per_image", [False, True])
def test_the_gauge_holds_what_colmap_holds(tmp_path, per_image):
    """fix="gauge": the coordinate of the second image's translation along which its baseline
    from the first image is largest (COLMAP's TWO_CAMS_FROM_WORLD), so that the first step, the
    first to depend on which coordinate is held, lands where pycolmap's does."""
    rec, path = synthetic(tmp_path, n_images=8, per_image_cameras=per_image, seed=3)
    ours = colmap.read_model(path)
    prob = colmap.problem_from_reconstruction(ours)
    ids = sorted(rec.reg_image_ids())
    first, second = (rec.images[i].cam_from_world() for i in ids[:2])
    baseline = (first * second.inverse()).translation
    row = int(np.flatnonzero(ours.image_ids == ids[1])[0])
    assert np.flatnonzero(prob.groups["poses"].constant_entries[row]).tolist() == [3 + int(np.argmax(np.abs(baseline)))]
    cs = pycolmap_ba(pycolmap.Reconstruction(rec), iterations=1)
    first_row = int(np.flatnonzero(ours.image_ids == ids[0])[0])
    steps = []
    for c in range(3):          # the first step with each coordinate held
        p = colmap.problem_from_reconstruction(ours, fix="none")
        p.set_constant("poses", rows=[first_row])
        p.set_constant("poses", rows=[row], columns=[3 + c])
        steps.append(solvers.solve(p, max_iterations=1, handle_sigint=False).final_cost)
    r = solvers.solve(prob, max_iterations=1, handle_sigint=False)
    assert r.initial_cost == pytest.approx(cs.initial_cost, rel=1e-12)
    assert r.final_cost == steps[int(np.argmax(np.abs(baseline)))]
    gaps = np.abs(np.array(steps) / cs.final_cost - 1)
    # pycolmap steps rotations as quaternions, we as angle-axis vectors: equal to first order
    # (5e-6 apart here); the other coordinates land 6e-3 to 3e-2 away.
    assert np.argmin(gaps) == np.argmax(np.abs(baseline)) and gaps.min() < 5e-5


def test_fix_choices_and_refine_flags(tmp_path):
    _, path = synthetic(tmp_path, n_images=6)
    rec = colmap.read_model(path)
    g = colmap.problem_from_reconstruction(rec)
    poses = g.groups["poses"]
    order = np.argsort(rec.image_ids)
    assert poses.constant_rows[order[0]] and not poses.constant_rows[order[1]]
    assert poses.constant_entries[order[1]].sum() == 1
    two = colmap.problem_from_reconstruction(rec, fix="first-two-poses")
    assert two.groups["poses"].constant_rows.sum() == 2
    ids = colmap.problem_from_reconstruction(rec, fix=[int(rec.image_ids[3])])
    assert np.flatnonzero(ids.groups["poses"].constant_rows).tolist() == [3]
    with pytest.raises(ValueError, match="not in the reconstruction"):
        colmap.problem_from_reconstruction(rec, fix=[999999])
    with pytest.raises(ValueError, match="fix="):
        colmap.problem_from_reconstruction(rec, fix="first")
    nofocal = colmap.problem_from_reconstruction(rec, refine_focal_length=False, refine_extra_params=False)
    assert nofocal.groups["intrinsics"].constant_columns.all()
    r = solvers.solve(nofocal, max_iterations=3, handle_sigint=False)
    np.testing.assert_array_equal(r.parameters["intrinsics"], nofocal.groups["intrinsics"].values)


def test_command_line(tmp_path, capsys):
    _, path = synthetic(tmp_path, n_images=5)
    out = tmp_path / "refined"
    assert colmap_main([path, "--out", str(out), "--iterations", "10"]) == 0
    text = capsys.readouterr().out
    assert "iter      cost" in text and "Termination:" in text and "written:" in text
    back = pycolmap.Reconstruction(str(out))
    assert back.num_reg_images() == 5
    assert colmap_main([str(tmp_path / "nope")]) == 2


def test_command_line_checkpoint_and_resume(tmp_path, capsys):
    """--checkpoint writes the general problem's checkpoint; --resume continues from it to the
    uninterrupted solve's cost; a checkpoint of another model is refused with exit code 2."""
    _, path = synthetic(tmp_path, n_images=5)
    ck = tmp_path / "ck.npz"
    assert colmap_main([path, "--iterations", "2", "--checkpoint", str(ck), "-q"]) in (0, 1)
    assert "checkpoint of the best state, iteration 2" in capsys.readouterr().out
    written = solvers.load_checkpoint(ck)
    assert isinstance(written, solvers.ProblemCheckpoint) and written.iteration == 2
    assert colmap_main([path, "--resume", str(ck), "-q"]) == 0
    resumed = capsys.readouterr().out
    assert colmap_main([path, "-q"]) == 0
    full = capsys.readouterr().out
    final = [float(line.split()[-1]) for text in (resumed, full) for line in text.splitlines()
             if line.startswith("Final")]
    assert final[0] == pytest.approx(final[1], rel=1e-6)
    (tmp_path / "other").mkdir()
    _, other = synthetic(tmp_path / "other", n_images=6)
    assert colmap_main([other, "--resume", str(ck), "-q"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert colmap_main([path, "--checkpoint-every", "2"]) == 2


def test_cameras_of_two_models_in_one_reconstruction(tmp_path):
    """Half the cameras turned into PINHOLE ones: one intrinsics group and one residual kind per
    model, and pycolmap's bundle adjuster on the same files agrees."""
    _, path = synthetic(tmp_path, n_images=8, per_image_cameras=True)
    rec = colmap.read_model(path)
    for k in range(0, rec.camera_ids.size, 2):
        f, cx, cy, _ = rec.camera_params[k]
        rec.camera_models[k] = 1                           # PINHOLE: fx, fy, cx, cy
        rec.camera_params[k] = np.array([f, f, cx, cy])
    mixed = str(tmp_path / "mixed")
    colmap.write_model(rec, mixed)
    rec = colmap.read_model(mixed)
    prob = colmap.problem_from_reconstruction(rec)
    assert sorted(prob.groups) == ["intrinsics_PINHOLE", "intrinsics_SIMPLE_RADIAL", "points", "poses"]
    assert len(prob.residuals) == 2
    r = solvers.solve(prob, max_iterations=100, function_tolerance=1e-10, gradient_tolerance=1e-12,
                      parameter_tolerance=1e-12, handle_sigint=False)
    cs = pycolmap_ba(pycolmap.Reconstruction(mixed))
    assert r.initial_cost == pytest.approx(cs.initial_cost, rel=1e-9)
    assert r.num_effective_parameters == cs.num_effective_parameters_reduced
    assert r.final_cost == pytest.approx(cs.final_cost, rel=1e-6)
    colmap.update_reconstruction(rec, r)
    assert rec.camera_params[0].size == 4 and rec.camera_params[0][0] != rec.camera_params[0][1]


def test_parameter_kinds_are_pycolmaps():
    """Which intrinsics are focal lengths, principal point, extra parameters and image metadata
    (what refine_* hold), for every model, as pycolmap's Camera says."""
    from solvers.colmap.problem import _parameter_kinds
    from solvers.models import cameras
    for m in cameras.MODELS.values():
        if m.colmap_id is None:
            continue
        cam = pycolmap.Camera.create_from_model_name(1, m.name, 500.0, 640, 480)
        assert _parameter_kinds(m) == (list(cam.focal_length_idxs()), list(cam.principal_point_idxs()),
                                       list(cam.extra_params_idxs()), list(cam.metadata_params_idxs())), m.name


def _a_point_behind_a_camera(rec, folder):
    """Move one point of the first image behind its camera (in ``rec``), write ``rec`` into
    ``folder`` and read it back as ours."""
    image = rec.images[sorted(rec.images)[0]]
    pid = next(p.point3D_id for p in image.points2D if p.has_point3D())
    pose = image.cam_from_world()
    inside = pose * rec.points3D[pid].xyz
    rec.points3D[pid].xyz = pose.inverse() * np.array([inside[0], inside[1], -inside[2]])
    folder.mkdir()
    rec.write_text(str(folder))
    return colmap.read_model(str(folder))


def test_a_point_behind_a_camera_costs_nothing_there_as_in_colmap(tmp_path):
    """COLMAP's reprojection cost is 0 (zero Jacobian) for a point behind the camera: with one
    point moved behind the first image's camera, the initial and final costs are pycolmap's."""
    rec, _ = synthetic(tmp_path, model="SIMPLE_RADIAL", seed=3)
    ours = _a_point_behind_a_camera(rec, tmp_path / "behind")
    r = solvers.solve(colmap.problem_from_reconstruction(ours), max_iterations=100, function_tolerance=1e-10,
                      gradient_tolerance=1e-12, parameter_tolerance=1e-12, handle_sigint=False)
    cs = pycolmap_ba(pycolmap.Reconstruction(str(tmp_path / "behind")))
    assert r.initial_cost == pytest.approx(cs.initial_cost, rel=1e-9)
    assert r.final_cost == pytest.approx(cs.final_cost, rel=1e-6)


def test_point_errors_on_a_device_are_the_hosts_and_colmaps(tmp_path, device):
    """The points' errors by the camera models' kernels on a device (what the command line
    writes: the solve's own function) equal the host's within 1e-12 relative, and COLMAP's own
    ``update_point_3d_errors``, with a point behind a camera (it counts sqrt(DBL_MAX) there)."""
    rec, _ = synthetic(tmp_path, model="OPENCV", per_image_cameras=True, seed=5)
    ours = _a_point_behind_a_camera(rec, tmp_path / "behind")
    host = colmap.point_errors(ours)
    on_device = colmap.point_errors(ours, backend="auto", device=device)
    np.testing.assert_allclose(on_device, host, rtol=1e-12, atol=0)
    rec.update_point_3d_errors()
    want = np.array([rec.points3D[int(p)].error for p in ours.point_ids])
    assert want.max() > 1e100          # the point behind the camera
    np.testing.assert_allclose(on_device, want, rtol=1e-9, atol=1e-12)
