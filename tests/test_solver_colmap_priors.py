"""Pose priors (solvers.colmap.priors): bundle adjustment with images' position priors against
pycolmap's pose-prior bundle adjuster (create_pose_prior_bundle_adjuster) on synthetic
reconstructions moved into another frame, with noisy priors of random covariances; the prior
file format and its refusals."""
import numpy as np
import pycolmap  # a test dependency: pip install ".[test]"
import pytest

import solvers
from solvers import colmap


def reconstruction_and_priors(cameras=1, seed=0, sigma=0.05, outlier=False):
    """A synthetic reconstruction moved by a similarity and noised, and priors on its images'
    centres from the unmoved one (noise ``sigma``, a random covariance each; one 50 m off)."""
    pycolmap.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    gt = pycolmap.synthesize_dataset(pycolmap.SyntheticDatasetOptions(
        num_rigs=2, num_cameras_per_rig=cameras, num_frames_per_rig=5, num_points3D=200))
    rec = pycolmap.Reconstruction(gt)
    rec.transform(pycolmap.Sim3d(0.3, pycolmap.Rotation3d(np.array([0.2, -0.1, 0.4])), np.array([5.0, -2.0, 1.0])))
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        rig_from_world_translation_stddev=0.01, rig_from_world_rotation_stddev=0.2, point3D_stddev=0.01,
        point2D_stddev=0.5), rec)
    priors = []
    for k, image_id in enumerate(sorted(gt.reg_image_ids())):
        image = gt.image(image_id)
        p = pycolmap.PosePrior()
        p.corr_data_id = image.data_id
        p.position = image.projection_center() + rng.normal(0.0, sigma, 3) + (
            np.array([50.0, 0.0, 0.0]) if outlier and k == 2 else 0.0)
        A = rng.normal(size=(3, 3)) * sigma
        p.position_covariance = A @ A.T + sigma ** 2 * np.eye(3)
        p.coordinate_system = pycolmap.PosePriorCoordinateSystem.CARTESIAN
        priors.append(p)
    return gt, rec, priors


def pycolmap_prior_ba(rec, priors, loss="TRIVIAL"):
    options = pycolmap.BundleAdjustmentOptions(print_summary=False)
    so = options.ceres.solver_options
    so.max_num_iterations, so.function_tolerance = 100, 1e-10
    so.gradient_tolerance, so.parameter_tolerance, so.num_threads = 1e-12, 1e-12, 2
    po = pycolmap.PosePriorBundleAdjustmentOptions()
    po.alignment_ransac.random_seed = 0
    po.ceres.prior_position_loss_function_type = getattr(pycolmap.LossFunctionType, loss)
    cfg = pycolmap.BundleAdjustmentConfig()
    for i in rec.reg_image_ids():
        cfg.add_image(i)
    return pycolmap.create_pose_prior_bundle_adjuster(options, po, cfg, priors, rec).solve().ceres_summary


TIGHT = dict(max_iterations=100, function_tolerance=1e-10, gradient_tolerance=1e-12, parameter_tolerance=1e-12,
             handle_sigint=False)


@pytest.mark.parametrize("cameras,loss,outlier", [(1, "TRIVIAL", False), (1, "CAUCHY", True), (2, "TRIVIAL", False),
                                                  (2, "CAUCHY", False)],
                         ids=["one-camera-rigs", "cauchy-with-an-outlier", "rigs-of-2", "rigs-of-2-cauchy"])
def test_prior_bundle_adjustment_matches_pycolmap(tmp_path, cameras, loss, outlier):
    gt, rec, priors = reconstruction_and_priors(cameras, outlier=outlier)
    ours = colmap.from_pycolmap(rec)
    prob = colmap.problem_from_reconstruction(ours, pose_priors=priors,
                                              prior_loss=None if loss == "TRIVIAL" else loss.lower())
    assert prob.notes[0].startswith(f"Aligned to {len(priors)} pose priors")
    assert f"{len(priors) - outlier} inliers" in prob.notes[0]
    r = solvers.solve(prob, **TIGHT)
    # The trivial prior loss, the reprojections': one kind for the device-resident core
    # (solvers.general.merged_groups' union); a robust prior loss: the general core.
    assert r.core == ("bundle-adjustment" if loss == "TRIVIAL" else "general")
    assert r.num_residuals == 2 * ours.num_observations + 3 * len(priors)
    cs = pycolmap_prior_ba(pycolmap.Reconstruction(rec), priors, loss)
    assert r.num_effective_parameters == cs.num_effective_parameters_reduced      # no pose held: the priors fix it
    assert r.final_cost == pytest.approx(cs.final_cost, rel=1e-6)
    # Written back in the priors' frame: each camera where its prior says (within a few sigma),
    # as the ground truth's (the outlier's prior left aside).
    colmap.update_reconstruction(ours, r)
    colmap.write_model(ours, str(tmp_path), binary=True)
    back = pycolmap.Reconstruction(str(tmp_path))
    error = [np.linalg.norm(back.image(i).projection_center() - gt.image(i).projection_center())
             for i in gt.reg_image_ids()]
    assert max(error) < 0.2


def test_fewer_than_three_priors_are_left_out_with_colmaps_gauge():
    gt, rec, priors = reconstruction_and_priors(seed=1)
    ours = colmap.from_pycolmap(rec)
    prob = colmap.problem_from_reconstruction(ours, pose_priors=priors[:2])
    assert "fewer than 3, solved without them" in prob.notes[0]
    without = colmap.problem_from_reconstruction(ours)
    a, b = solvers.solve(prob, **TIGHT), solvers.solve(without, **TIGHT)
    assert [h.cost for h in a.history] == [h.cost for h in b.history]
    cs = pycolmap_prior_ba(pycolmap.Reconstruction(rec), priors[:2])
    assert a.num_effective_parameters == cs.num_effective_parameters_reduced
    assert a.final_cost == pytest.approx(cs.final_cost, rel=1e-6)


def test_the_prior_file_and_its_refusals(tmp_path):
    f = tmp_path / "priors.txt"
    f.write_text("# IMAGE_ID X Y Z [...]\n1 0 0 0\n2 1 0 0 0.1 0.2 0.3  # standard deviations\n"
                 "3 0 1 0 0.04 0.01 0 0.09 0 0.01\n")
    p = colmap.read_pose_priors(str(f))
    assert p.image_ids.tolist() == [1, 2, 3]
    assert np.isnan(p.covariances[0]).all()
    np.testing.assert_allclose(p.covariances[1], np.diag([0.01, 0.04, 0.09]))
    np.testing.assert_allclose(p.covariances[2], [[0.04, 0.01, 0], [0.01, 0.09, 0], [0, 0, 0.01]])
    cases = {"1 0 0\n": "line 1: 2 numbers after the image id",
             "x 0 0 0\n": "line 1: expected IMAGE_ID X Y Z",
             "1 0 0 nan\n": "pose prior of image 1: the position .* is not finite",
             "1 0 0 0 1 2 3 1 2 1\n": "pose prior of image 1: the covariance is not positive definite",
             "1 0 0 0\n1 1 1 1\n": "image 1 has two pose priors"}
    for text, message in cases.items():
        f.write_text(text)
        with pytest.raises(ValueError, match=message):
            colmap.read_pose_priors(str(f))
    with pytest.raises(ValueError, match="partly NaN"):
        colmap.PosePriors([1], [[0, 0, 0]], [[[1, 0, 0], [0, np.nan, 0], [0, 0, 1]]])
    gt, rec, priors = reconstruction_and_priors(seed=2)
    bad = colmap.PosePriors([999, 1, 2], np.zeros((3, 3)), None)
    with pytest.raises(ValueError, match="pose_priors: image 999 is not in the reconstruction"):
        colmap.problem_from_reconstruction(colmap.from_pycolmap(rec), pose_priors=bad)


def test_the_command_line_takes_a_prior_file(tmp_path, capsys):
    from solvers.colmap.cli import main
    gt, rec, priors = reconstruction_and_priors(seed=3)
    (tmp_path / "in").mkdir()
    rec.write_binary(str(tmp_path / "in"))
    lines = [f"{int(p.corr_data_id.id)} {' '.join(repr(float(v)) for v in p.position)} 0.05 0.05 0.05" for p in priors]
    (tmp_path / "priors.txt").write_text("\n".join(lines) + "\n")
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--pose-priors",
                 str(tmp_path / "priors.txt"), "--prior-loss", "cauchy"]) == 0
    out = capsys.readouterr().out
    assert "Aligned to 10 pose priors" in out
    back = pycolmap.Reconstruction(str(tmp_path / "out"))
    error = [np.linalg.norm(back.image(i).projection_center() - gt.image(i).projection_center())
             for i in gt.reg_image_ids()]
    assert max(error) < 0.2                          # in the priors' (the ground truth's) frame
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out2"), "--pose-priors",
                 str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err


def test_wgs84_priors_from_a_colmap_database(tmp_path, capsys):
    """Priors as COLMAP's feature extractor stores them (WGS84, in the database): converted to
    the ENU frame of the first prior (against pycolmap's GPSTransform), and the command line
    solves with them (--pose-priors database.db)."""
    from solvers.colmap.cli import main
    from solvers.colmap.priors import wgs84_to_enu
    gt, rec, priors = reconstruction_and_priors(seed=4, sigma=0.01)
    (tmp_path / "in").mkdir()
    rec.write_binary(str(tmp_path / "in"))
    origin = np.array([47.37, 8.54, 408.0])
    gps = pycolmap.GPSTransform()
    db = pycolmap.Database.open(str(tmp_path / "database.db"))
    for cam in rec.cameras.values():
        db.write_camera(cam, use_camera_id=True)
    for image in rec.images.values():
        db.write_image(pycolmap.Image(name=image.name, camera_id=image.camera_id, image_id=image.image_id),
                       use_image_id=True)
    enu = np.array([np.asarray(p.position) for p in priors])
    lla = gps.enu_to_ellipsoid(enu, *origin)
    for p, l in zip(priors, lla):
        q = pycolmap.PosePrior()
        q.corr_data_id, q.position = p.corr_data_id, l
        q.coordinate_system = pycolmap.PosePriorCoordinateSystem.WGS84
        db.write_pose_prior(q)
    db.close()
    read = colmap.read_pose_priors(str(tmp_path / "database.db"))
    want = gps.ellipsoid_to_enu(lla, *lla[0])
    np.testing.assert_allclose(read.positions, want, atol=1e-6)
    np.testing.assert_allclose(wgs84_to_enu(lla, lla[0]), want, atol=1e-6)
    assert main([str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--pose-priors", str(tmp_path / "database.db"),
                 "--prior-fallback-stddev", "0.01", "-q"]) == 0
    back = pycolmap.Reconstruction(str(tmp_path / "out"))
    shift = enu[0] - want[0]                     # the ENU origin is the first prior
    error = [np.linalg.norm(back.image(i).projection_center() + shift - gt.image(i).projection_center())
             for i in gt.reg_image_ids()]
    assert max(error) < 0.1
