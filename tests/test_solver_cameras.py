"""The camera models (solvers.models.cameras) on every device: COLMAP's against COLMAP's own projection
(pycolmap's Camera.img_from_cam, the pose applied by pycolmap's Rigid3d), SNAVELY against the BAL
residual of solvers.models.snavely, and every model's Jacobian blocks against central differences."""
import numpy as np
import pycolmap  # a test dependency: pip install ".[test]"
import pytest
from scipy.spatial.transform import Rotation

import pyclad as pc
from solvers.models import cameras
from solvers.models.snavely import snavely_residual

COLMAP_MODELS = [name for name, m in cameras.MODELS.items() if m.colmap_id is not None]
# Intrinsics of a 640 x 480 camera per model, distortion large enough to matter at the edges.
INTRINSICS = {
    "SIMPLE_PINHOLE": [520.0, 320.0, 240.0],
    "PINHOLE": [520.0, 505.0, 318.0, 243.0],
    "SIMPLE_RADIAL": [520.0, 320.0, 240.0, -0.08],
    "RADIAL": [520.0, 320.0, 240.0, -0.08, 0.02],
    "OPENCV": [520.0, 505.0, 318.0, 243.0, -0.08, 0.02, 1.5e-3, -2e-3],
    "SNAVELY": [520.0, -0.08, 0.02],
}


def _scene(n_images=4, n_points=30, n_obs=150, seed=0, minus_z=False):
    """Poses (angle-axis, t) with every point in front of every camera, and observations."""
    rng = np.random.default_rng(seed)
    poses = np.zeros((n_images, 6))
    poses[:, :3] = rng.normal(0, 0.2, (n_images, 3))
    poses[1, :3] = 0.0                         # the rotation's small-angle branch
    poses[:, 3:5] = rng.normal(0, 0.3, (n_images, 2))
    poses[:, 5] = -8.0 if minus_z else 8.0
    points = rng.uniform(-2.0, 2.0, (n_points, 3))
    index = np.stack([rng.integers(0, n_images, n_obs), np.zeros(n_obs, int), rng.integers(0, n_points, n_obs)], 1)
    return poses, points, index.astype(np.int32), rng.normal(0, 3.0, (n_obs, 2))


@pytest.mark.parametrize("name", COLMAP_MODELS)
def test_colmap_models_match_pycolmap_projection(device, name):
    model = cameras.get(name)
    poses, points, index, observed = _scene()
    intrinsics = np.array([INTRINSICS[name]])
    f = model.batch_function(device=device)
    res = f.values([poses, intrinsics, points], index, data=observed)
    cam = pycolmap.Camera(model=name, width=640, height=480, params=INTRINSICS[name])
    assert [p.strip() for p in cam.params_info.split(",")] == list(model.params)
    assert int(cam.model.value) == model.colmap_id
    want = np.empty_like(observed)
    for k, (i, _, j) in enumerate(index):
        pose = pycolmap.Rigid3d(pycolmap.Rotation3d(Rotation.from_rotvec(poses[i, :3]).as_matrix()), poses[i, 3:])
        want[k] = cam.img_from_cam(pose * points[j]) - observed[k]
    np.testing.assert_allclose(res, want, rtol=1e-12, atol=1e-9)


def test_snavely_model_is_the_bal_residual(device):
    model = cameras.get("SNAVELY")
    poses, points, index, observed = _scene(minus_z=True)
    intrinsics = np.array([INTRINSICS["SNAVELY"]])
    res, (jpose, jk, jpt) = model.batch_function(device=device).values_and_jacobians(
        [poses, intrinsics, points], index, data=observed)
    cams = np.concatenate([poses, np.repeat(intrinsics, len(poses), 0)], 1)     # the BAL camera (9)
    bal = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    want, (jcam, jp) = bal.values_and_jacobians([cams, points], index[:, [0, 2]], data=observed)
    np.testing.assert_allclose(res, want, rtol=1e-13, atol=1e-10)
    np.testing.assert_allclose(np.concatenate([jpose, jk], 2), jcam, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(jpt, jp, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("name", list(cameras.MODELS))
def test_jacobian_blocks_match_central_differences(device, name):
    model = cameras.get(name)
    poses, points, index, observed = _scene(n_obs=40, seed=1, minus_z=model.looks_along_minus_z)
    intrinsics = np.array([INTRINSICS[name]])
    params = [poses, intrinsics, points]
    f = model.batch_function(device=device)
    _, jacs = f.values_and_jacobians(params, index, data=observed)
    for g, (block, jac) in enumerate(zip(params, jacs)):
        for c in range(block.shape[1]):
            h = 1e-6 * max(1.0, abs(block[:, c]).max())
            plus = [p.copy() for p in params]
            minus = [p.copy() for p in params]
            plus[g][:, c] += h
            minus[g][:, c] -= h
            # only the row each observation uses moves, and every observation's row moves
            fd = (f.values(plus, index, data=observed) - f.values(minus, index, data=observed)) / (2 * h)
            scale = np.abs(fd).max() + 1.0
            np.testing.assert_allclose(jac[:, :, c], fd, rtol=1e-5, atol=1e-6 * scale,
                                       err_msg=f"{name}: group {g}, column {c}")


def test_models_are_found_by_name_or_colmap_id():
    assert cameras.get("opencv") is cameras.MODELS["OPENCV"] and cameras.get(2).name == "SIMPLE_RADIAL"
    assert [cameras.get(name).num_params for name in COLMAP_MODELS] == [3, 4, 4, 5, 8]
    with pytest.raises(ValueError, match="camera model 'FISHEYE' is not supported; supported: SIMPLE_PINHOLE"):
        cameras.get("FISHEYE")
    with pytest.raises(ValueError, match=r"camera model id 9 is not supported; supported COLMAP ids: \[0, 1, 2, 3, 4\]"):
        cameras.get(9)
