"""Bundle adjustment of COLMAP 4 rigs of several cameras (solvers.colmap.problem's rig path)
against pycolmap's default bundle adjuster on the same reconstructions: the same initial and final
costs, the same number of effective parameters (so the same gauge and held poses), the solution
written back as pycolmap composes it."""
import numpy as np
import pycolmap  # a test dependency: pip install ".[test]"
import pytest

import solvers
from solvers import colmap


def rig_reconstruction(cameras_per_rig, seed=0, frames=4, points=200):
    pycolmap.set_random_seed(seed)
    o = pycolmap.SyntheticDatasetOptions(
        num_rigs=2, num_cameras_per_rig=cameras_per_rig, num_frames_per_rig=frames, num_points3D=points,
        track_length=5, camera_model_id=pycolmap.CameraModelId.SIMPLE_RADIAL,
        camera_params=[1280.0, 512.0, 384.0, 0.05])
    rec = pycolmap.synthesize_dataset(o)
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=0.8, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    return rec


def pycolmap_rig_ba(rec, **options):
    opts = pycolmap.BundleAdjustmentOptions(print_summary=False)
    for k, v in options.items():
        setattr(opts, k, v)
    so = opts.ceres.solver_options
    so.max_num_iterations, so.function_tolerance = 100, 1e-10
    so.gradient_tolerance, so.parameter_tolerance, so.num_threads = 1e-12, 1e-12, 2
    cfg = pycolmap.BundleAdjustmentConfig()
    for i in sorted(rec.reg_image_ids()):
        cfg.add_image(i)
    cfg.fix_gauge(pycolmap.BundleAdjustmentGauge.TWO_CAMS_FROM_WORLD)
    return pycolmap.create_default_bundle_adjuster(opts, cfg, rec).solve().ceres_summary


OPTIONS = [{}, {"refine_sensor_from_rig": False}, {"constant_rig_from_world_rotation": True},
           {"refine_rig_from_world": False}]


@pytest.mark.parametrize("options", OPTIONS, ids=["defaults", "sensors-held", "rotations-held", "frames-held"])
@pytest.mark.parametrize("cameras_per_rig", [2, 6])
def test_rig_bundle_adjustment_matches_pycolmap(tmp_path, cameras_per_rig, options):
    rec = rig_reconstruction(cameras_per_rig)
    ours = colmap.from_pycolmap(rec)
    sensors_before = ours.rig_sensor_tvec.copy()
    prob = colmap.problem_from_reconstruction(ours, **options)
    r = solvers.solve(prob, max_iterations=100, function_tolerance=1e-10, gradient_tolerance=1e-12,
                      parameter_tolerance=1e-12, handle_sigint=False)
    cs = pycolmap_rig_ba(rec, **options)
    assert r.initial_cost == pytest.approx(cs.initial_cost, rel=1e-9)
    assert r.num_effective_parameters == cs.num_effective_parameters_reduced
    assert r.final_cost == pytest.approx(cs.final_cost, rel=1e-6)
    # Written back and read by pycolmap, which composes each image's pose from its frame and
    # its camera's sensor_from_rig: the cost of that is ours.
    colmap.update_reconstruction(ours, r)
    colmap.write_model(ours, str(tmp_path / "out"), binary=True)
    back = pycolmap.Reconstruction(str(tmp_path / "out"))
    cost = 0.0
    for k, iid in enumerate(ours.image_ids):
        image = back.images[int(iid)]
        pose = image.cam_from_world()
        xyzw = pose.rotation.quat
        q = ours.image_qvec[k] * np.sign(ours.image_qvec[k, 0] * xyzw[3])
        np.testing.assert_allclose(q, [xyzw[3], *xyzw[:3]], atol=1e-12)
        np.testing.assert_allclose(ours.image_tvec[k], pose.translation, atol=1e-12)
        pts = image.get_observation_points2D()
        X = np.array([back.points3D[p.point3D_id].xyz for p in pts])
        proj = back.cameras[image.camera_id].img_from_cam(pose * X)
        cost += 0.5 * np.sum((proj - np.array([p.xy for p in pts])) ** 2)
    assert cost == pytest.approx(r.final_cost, rel=1e-9)
    mine = {pid: p.error for pid, p in back.points3D.items()}
    back.update_point_3d_errors()
    np.testing.assert_allclose([mine[p] for p in sorted(mine)], [back.points3D[p].error for p in sorted(mine)],
                               rtol=1e-9, atol=1e-12)
    written = colmap.read_model(str(tmp_path / "out"))
    sensors_moved = not np.array_equal(written.rig_sensor_tvec, sensors_before)
    assert sensors_moved == options.get("refine_sensor_from_rig", True)


def test_rigs_in_memory_update_the_pycolmap_rigs():
    rec = rig_reconstruction(2, seed=3)
    before = {s.id: np.array(pose.translation) for s, pose in rec.rigs[1].non_ref_sensors.items()}
    result = colmap.bundle_adjust(rec, max_iterations=50, handle_sigint=False)
    assert result.usable and result.final_cost < result.initial_cost
    after = rec.rigs[1].non_ref_sensors
    moved = [np.abs(np.array(pose.translation) - before[s.id]).max() for s, pose in after.items()]
    assert max(moved) > 0                                   # the sensor_from_rig poses were refined
    again = colmap.from_pycolmap(rec)
    model = colmap.problem_from_reconstruction(again)
    assert solvers.solve(model, max_iterations=0, handle_sigint=False).initial_cost == \
        pytest.approx(result.final_cost, rel=1e-9)


def test_a_camera_without_sensor_from_rig_is_refused_naming_it():
    rec = rig_reconstruction(2, seed=4)
    ours = colmap.from_pycolmap(rec)
    ours.rig_sensor_has_pose = np.zeros_like(ours.rig_sensor_has_pose)
    with pytest.raises(ValueError, match=r"rig 1: camera 2 has images but no sensor_from_rig pose"):
        colmap.problem_from_reconstruction(ours)
    with pytest.raises(ValueError, match="with rigs, fix names frames"):
        colmap.problem_from_reconstruction(colmap.from_pycolmap(rec), fix=[999])


def test_the_command_line_adjusts_a_rig_model(tmp_path, capsys):
    from solvers.colmap.cli import main
    rec = rig_reconstruction(2, seed=5)
    (tmp_path / "in").mkdir()
    rec.write_text(str(tmp_path / "in"))
    before = colmap.read_model(str(tmp_path / "in"))
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "held"), "--no-refine-sensor-from-rig", "-q"]) == 0
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "free"), "-q"]) == 0
    held, free = colmap.read_model(str(tmp_path / "held")), colmap.read_model(str(tmp_path / "free"))
    np.testing.assert_array_equal(held.rig_sensor_tvec, before.rig_sensor_tvec)
    assert not np.array_equal(free.rig_sensor_tvec, before.rig_sensor_tvec)
    assert not np.array_equal(held.frame_tvec, before.frame_tvec)
    assert "written: " in capsys.readouterr().out
    back = pycolmap.Reconstruction(str(tmp_path / "free"))      # pycolmap reads it
    assert back.num_rigs() == 2 and all(len(r.non_ref_sensors) == 1 for r in back.rigs.values())
