"""pycolmap reconstructions in memory (solvers.colmap.in_memory): converted both ways with
pycolmap's own values, and bundle-adjusted in place as the file path adjusts them, writing no file."""
import numpy as np
import pytest

import solvers
from solvers import colmap

from test_solver_colmap import _assert_matches_pycolmap, _assert_rigs_match_pycolmap, _rig_synthetic, _synthetic


@pytest.mark.parametrize("make", [lambda: _synthetic(False), lambda: _synthetic(True), lambda: _rig_synthetic(2),
                                  lambda: _rig_synthetic(6)],
                         ids=["camera-per-image", "shared-camera", "rigs-of-2", "rigs-of-6"])
def test_from_and_to_pycolmap_round_trip(tmp_path, make):
    rec = make()
    ours = colmap.from_pycolmap(rec)
    _assert_matches_pycolmap(ours, rec)
    _assert_rigs_match_pycolmap(ours, rec)
    rec.write_binary(str(tmp_path))                 # the same as what pycolmap's writer writes
    on_disk = colmap.read_model(str(tmp_path))
    for field in ("image_ids", "image_qvec", "points2d_xy", "point_ids", "track_image_ids", "frame_data",
                  "rig_sensors", "rig_sensor_qvec"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(on_disk, field), err_msg=field)
    new = colmap.to_pycolmap(ours)                  # a new pycolmap reconstruction
    _assert_matches_pycolmap(ours, new)
    _assert_rigs_match_pycolmap(ours, new)
    assert new.compute_num_observations() == rec.compute_num_observations()


@pytest.mark.parametrize("make", [lambda: _synthetic(False), lambda: _rig_synthetic(6)], ids=["per-image", "rigs-of-6"])
def test_observed_only_keeps_the_observations(make):
    """observed_only: each image's observing 2-D points only, the tracks renumbered: the same
    observations (image, pixel, 3-D point) as the whole model's."""
    rec = make()
    whole, observed = colmap.from_pycolmap(rec), colmap.from_pycolmap(rec, observed_only=True)
    assert observed.points2d_xy.shape[0] < whole.points2d_xy.shape[0]
    assert (observed.points2d_point3d_ids >= 0).all()
    assert observed.num_observations == whole.num_observations
    from solvers.colmap.problem import observations
    for a, b in zip(observations(whole), observations(observed)):
        np.testing.assert_array_equal(a, b)


def test_to_pycolmap_updates_in_place_and_refuses_another_reconstruction():
    rec = _synthetic(False, seed=7)
    ours = colmap.from_pycolmap(rec)
    ours.point_xyz = ours.point_xyz + 0.01
    ours.image_tvec = ours.image_tvec + 0.02
    ours.frame_tvec = ours.frame_tvec + 0.02            # (one camera per rig: the frame's pose is the image's)
    ours.camera_params = [p * 1.01 for p in ours.camera_params]
    same = colmap.to_pycolmap(ours, rec)
    assert same is rec
    _assert_matches_pycolmap(ours, rec)
    other = _synthetic(False, seed=8)
    other.delete_point3D(sorted(other.points3D)[0])
    with pytest.raises(ValueError, match="reconstruction has no 3-D point .* pass the reconstruction the model came"):
        colmap.to_pycolmap(ours, other)
    with pytest.raises(TypeError, match="pycolmap.Reconstruction"):
        colmap.from_pycolmap("sparse/0")


def test_bundle_adjust_in_memory_equals_the_file_path_and_writes_nothing(tmp_path, monkeypatch):
    rec = _synthetic(False, seed=9)
    rec.write_binary(str(tmp_path))
    kw = dict(max_iterations=30, handle_sigint=False)
    on_disk = colmap.bundle_adjust(str(tmp_path), **kw)           # read, solved, written back
    import solvers.colmap.io as cio

    def refuse(*a, **k):
        raise AssertionError("the in-memory path wrote a file")
    monkeypatch.setattr(cio, "write_model", refuse)
    in_memory = colmap.bundle_adjust(rec, **kw)
    assert in_memory.usable and in_memory.final_cost < in_memory.initial_cost
    assert [h.cost for h in in_memory.history] == [h.cost for h in on_disk.history]
    written = colmap.read_model(str(tmp_path))
    updated = colmap.from_pycolmap(rec)
    np.testing.assert_allclose(updated.point_xyz, written.point_xyz, rtol=0, atol=1e-12)
    np.testing.assert_allclose(updated.image_tvec, written.image_tvec, rtol=0, atol=1e-12)
    # The errors are the solution's, as pycolmap recomputes them.
    mine = {pid: p.error for pid, p in rec.points3D.items()}
    rec.update_point_3d_errors()
    np.testing.assert_allclose([mine[p] for p in sorted(mine)], [rec.points3D[p].error for p in sorted(mine)],
                               rtol=1e-9, atol=1e-12)
    assert solvers.SolveResult is type(in_memory)
