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
    "OPENCV_FISHEYE": [300.0, 305.0, 318.0, 243.0, 0.05, -0.02, 0.004, -0.001],
    "FULL_OPENCV": [520.0, 505.0, 318.0, 243.0, -0.08, 0.02, 1.5e-3, -2e-3, 0.003, 0.01, -0.004, 0.001],
    "FOV": [520.0, 505.0, 318.0, 243.0, 0.9],
    "SIMPLE_RADIAL_FISHEYE": [300.0, 320.0, 240.0, 0.04],
    "RADIAL_FISHEYE": [300.0, 320.0, 240.0, 0.04, -0.01],
    "THIN_PRISM_FISHEYE": [300.0, 305.0, 318.0, 243.0, 0.05, -0.02, 1e-3, -2e-3, 0.004, -0.001, 2e-3, -1e-3],
    "RAD_TAN_THIN_PRISM_FISHEYE": [300.0, 305.0, 318.0, 243.0, 0.05, -0.02, 0.004, -0.001, 2e-4, -1e-4,
                                   1e-3, -2e-3, 2e-3, -1e-3, 5e-4, 3e-4],
    "SIMPLE_DIVISION": [520.0, 320.0, 240.0, -0.05],
    "DIVISION": [520.0, 505.0, 318.0, 243.0, -0.05],
    "SIMPLE_FISHEYE": [300.0, 320.0, 240.0],
    "FISHEYE": [300.0, 305.0, 318.0, 243.0],
    "EUCM": [300.0, 305.0, 318.0, 243.0, 0.6, 1.1],
    "EQUIRECTANGULAR": [640.0, 480.0],
    "SNAVELY": [520.0, -0.08, 0.02],
}
# Second parameter sets for branches the first does not reach (FOV's small-omega expansion).
OTHER_INTRINSICS = {"FOV": [520.0, 505.0, 318.0, 243.0, 1e-3]}


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
    assert [cameras.get(name).colmap_id for name in COLMAP_MODELS] == list(range(18))
    assert [cameras.get(name).num_params for name in COLMAP_MODELS] == \
        [3, 4, 4, 5, 8, 8, 12, 5, 4, 5, 12, 16, 4, 5, 3, 4, 6, 2]
    with pytest.raises(ValueError, match="camera model 'KANNALA' is not supported; supported: SIMPLE_PINHOLE"):
        cameras.get("KANNALA")
    with pytest.raises(ValueError, match=r"camera model id 18 is not supported; supported COLMAP ids: \[0, 1, "):
        cameras.get(18)


def test_every_pycolmap_model_is_here():
    """pycolmap's own list of camera models, ids and parameter names is ours."""
    theirs = {m.name: int(m.value) for m in pycolmap.CameraModelId.__members__.values() if int(m.value) >= 0}
    assert theirs == {name: cameras.get(name).colmap_id for name in COLMAP_MODELS}


def _wide_points(n=400, seed=3):
    """Points in the camera's frame seen up to 80 degrees off the axis, at depths 0.5-20, with
    points on the axis and within 1e-3 of it (the fisheye and FOV models' small-radius branches)."""
    rng = np.random.default_rng(seed)
    angle = np.radians(rng.uniform(0, 80, n))
    angle[:4] = [0.0, 1e-9, 5e-4, 9e-3]
    azimuth = rng.uniform(-np.pi, np.pi, n)
    depth = rng.uniform(0.5, 20.0, n)
    return np.stack([np.tan(angle) * np.cos(azimuth), np.tan(angle) * np.sin(azimuth), np.ones(n)], 1) * depth[:, None]


def _pycolmap_projection(name, params, points):
    cam = pycolmap.Camera(model=name, width=640, height=480, params=params)
    return np.array([cam.img_from_cam(p) for p in points])


@pytest.mark.parametrize("name,params", [(n, INTRINSICS[n]) for n in COLMAP_MODELS] +
                         [(n, p) for n, p in OTHER_INTRINSICS.items()],
                         ids=COLMAP_MODELS + [f"{n}-other" for n in OTHER_INTRINSICS])
def test_every_model_at_wide_angles_matches_pycolmap(device, name, params):
    """Each model's projection of points up to 80 degrees off the axis (the identity pose), and
    the test's own numpy reference of COLMAP's formulas, against pycolmap's img_from_cam."""
    model = cameras.get(name)
    points = _wide_points()
    if name in ("SIMPLE_DIVISION", "DIVISION"):
        points = points[np.degrees(np.arctan(np.hypot(points[:, 0], points[:, 1]) / points[:, 2])) < 60]
    want = _pycolmap_projection(name, params, points)
    assert np.all(np.isfinite(want))
    n = len(points)
    index = np.stack([np.zeros(n, int), np.zeros(n, int), np.arange(n)], 1).astype(np.int32)
    got = model.batch_function(device=device).values([np.zeros((1, 6)), np.array([params]), points], index,
                                                     data=np.zeros((n, 2)))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(reference_projection(name, np.array(params), points), want, rtol=1e-12,
                               atol=1e-12 * scale)


@pytest.mark.parametrize("name", COLMAP_MODELS + [f"{n}-other" for n in OTHER_INTRINSICS])
def test_jacobian_blocks_match_the_complex_step(device, name):
    """Each model's Jacobian blocks (pose, intrinsics, point) against complex-step derivatives of
    the numpy reference of COLMAP's formulas: exact to rounding, no step-size error."""
    base = name.replace("-other", "")
    params = np.array(OTHER_INTRINSICS[base] if name.endswith("-other") else INTRINSICS[base])
    model = cameras.get(base)
    rng = np.random.default_rng(5)
    points = _wide_points(60, seed=4)[4:]               # off the axis (atan(r)/r is smooth there)
    poses = np.concatenate([rng.normal(0, 0.05, (2, 3)), rng.normal(0, 0.05, (2, 3))], 1)
    n = len(points)
    index = np.stack([rng.integers(0, 2, n), np.zeros(n, int), np.arange(n)], 1).astype(np.int32)
    observed = rng.normal(300.0, 50.0, (n, 2))
    _, jacs = model.batch_function(device=device).values_and_jacobians([poses, params[None], points], index,
                                                                       data=observed)

    def residual(pose, k, point):
        return reference_projection(base, k, _rotate(pose[:, :3], point) + pose[:, 3:]) - observed
    blocks = [poses[index[:, 0]], np.repeat(params[None], n, 0), points]
    h = 1e-30
    for g, jac in enumerate(jacs):
        for c in range(blocks[g].shape[1]):
            args = [b.astype(complex) for b in blocks]
            args[g][:, c] += 1j * h
            want = residual(*args).imag / h
            np.testing.assert_allclose(jac[:, :, c], want, rtol=1e-9, atol=1e-9 * (np.abs(want).max() + 1e-300),
                                       err_msg=f"{name}: group {g}, column {c}")


def _rotate(w, X):
    """Rodrigues' rotation of X by angle-axis w (complex-safe; |w| > 0)."""
    theta = np.sqrt(np.sum(w * w, axis=1))[:, None]
    k = w / theta
    return X * np.cos(theta) + np.cross(k, X) * np.sin(theta) + k * np.sum(k * X, axis=1)[:, None] * (1 - np.cos(theta))


def _atan2(y, x):
    """atan2 extended to the complex step (first order): the derivative is (x dy - y dx) / r^2."""
    if not np.iscomplexobj(y) and not np.iscomplexobj(x):
        return np.arctan2(y, x)
    yr, xr = np.real(y), np.real(x)
    return np.arctan2(yr, xr) + 1j * (xr * np.imag(y) - yr * np.imag(x)) / (xr * xr + yr * yr)


def reference_projection(name, k, p):
    """COLMAP's ImgFromCam written from its formulas (src/colmap/sensor/models.h) in numpy, for
    points ``p`` (n, 3) in the camera's frame; complex-safe (the branches test real parts)."""
    k = np.asarray(k)
    if k.ndim == 1:
        k = np.broadcast_to(k, (len(p), k.size))
    k = [k[:, i] for i in range(k.shape[1])]
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    u, v = x / z, y / z

    def fisheye(u, v):
        r = np.sqrt(u * u + v * v)
        far = np.real(r) > np.finfo(float).eps
        r1 = np.where(far, r, 1.0)
        th = np.arctan(r1)
        return np.where(far, u * (th / r1), u), np.where(far, v * (th / r1), v)

    if name == "SIMPLE_PINHOLE":
        return np.stack([k[0] * u + k[1], k[0] * v + k[2]], 1)
    if name == "PINHOLE":
        return np.stack([k[0] * u + k[2], k[1] * v + k[3]], 1)
    if name in ("SIMPLE_RADIAL", "RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        if "FISHEYE" in name:
            u, v = fisheye(u, v)
        r2 = u * u + v * v
        radial = k[3] * r2 + (k[4] * r2 * r2 if name.startswith("RADIAL") else 0.0)
        return np.stack([k[0] * (u + u * radial) + k[1], k[0] * (v + v * radial) + k[2]], 1)
    fx, fy, cx, cy = (k + [None] * 4)[:4]        # (the two-focal models; unused by the others)
    if name in ("SIMPLE_FISHEYE", "FISHEYE"):
        u, v = fisheye(u, v)
        return np.stack([k[0] * u + k[1], k[0] * v + k[2]] if name == "SIMPLE_FISHEYE" else
                        [fx * u + cx, fy * v + cy], 1)
    if name in ("OPENCV", "FULL_OPENCV", "THIN_PRISM_FISHEYE"):
        if name == "THIN_PRISM_FISHEYE":
            u, v = fisheye(u, v)
        u2, v2, uv = u * u, v * v, u * v
        r2 = u2 + v2
        k1, k2, p1, p2 = k[4:8]
        if name == "OPENCV":
            radial, minus, prism = k1 * r2 + k2 * r2 * r2, 0.0, (0.0, 0.0)
        elif name == "FULL_OPENCV":
            k3, k4, k5, k6 = k[8:12]
            radial = (1 + k1 * r2 + k2 * r2 ** 2 + k3 * r2 ** 3) / (1 + k4 * r2 + k5 * r2 ** 2 + k6 * r2 ** 3)
            minus, prism = 1.0, (0.0, 0.0)
        else:
            k3, k4 = k[8:10]
            radial = k1 * r2 + k2 * r2 ** 2 + k3 * r2 ** 3 + k4 * r2 ** 4
            minus, prism = 0.0, (k[10] * r2, k[11] * r2)
        du = u * radial + 2 * p1 * uv + p2 * (r2 + 2 * u2) + prism[0] - minus * u
        dv = v * radial + 2 * p2 * uv + p1 * (r2 + 2 * v2) + prism[1] - minus * v
        return np.stack([fx * (u + du) + cx, fy * (v + dv) + cy], 1)
    if name == "OPENCV_FISHEYE":
        u, v = fisheye(u, v)
        t2 = u * u + v * v
        radial = k[4] * t2 + k[5] * t2 ** 2 + k[6] * t2 ** 3 + k[7] * t2 ** 4
        return np.stack([fx * (u + u * radial) + cx, fy * (v + v * radial) + cy], 1)
    if name == "RAD_TAN_THIN_PRISM_FISHEYE":
        u, v = fisheye(u, v)
        t2 = u * u + v * v
        theta = 1 + sum(k[4 + i] * t2 ** (i + 1) for i in range(6))
        X, Y = theta * u, theta * v
        r2 = X * X + Y * Y
        p0, p1, s0, s1, s2, s3 = k[10:16]
        du = X + 2 * p1 * X * Y + p0 * (r2 + 2 * X * X) + s0 * r2 + s1 * r2 * r2 - u
        dv = Y + 2 * p0 * X * Y + p1 * (r2 + 2 * Y * Y) + s2 * r2 + s3 * r2 * r2 - v
        return np.stack([fx * (u + du) + cx, fy * (v + dv) + cy], 1)
    if name == "FOV":
        w = k[4]
        r2 = u * u + v * v
        o2 = w * w
        small_w, small_r = np.real(o2) < 1e-4, np.real(r2) < 1e-4
        ws = np.where(small_w, 1.0, w)
        t = np.tan(ws / 2)
        rs = np.sqrt(np.where(small_r, 1.0, r2))
        factor = np.where(small_w, o2 * r2 / 3 - o2 / 12 + 1,
                          np.where(small_r, -2 * t * (4 * r2 * t * t - 3) / (3 * ws), np.arctan(rs * 2 * t) / (rs * ws)))
        return np.stack([fx * u * factor + cx, fy * v * factor + cy], 1)
    if name in ("SIMPLE_DIVISION", "DIVISION"):
        kk = k[3] if name == "SIMPLE_DIVISION" else k[4]
        r = 2 / (z + np.sqrt(z * z - 4 * kk * (x * x + y * y)))
        if name == "SIMPLE_DIVISION":
            return np.stack([k[0] * r * x + k[1], k[0] * r * y + k[2]], 1)
        return np.stack([fx * r * x + cx, fy * r * y + cy], 1)
    if name == "EUCM":
        alpha, beta = k[4], k[5]
        den = alpha * np.sqrt(beta * (x * x + y * y) + z * z) + (1 - alpha) * z
        return np.stack([fx * x / den + cx, fy * y / den + cy], 1)
    if name == "EQUIRECTANGULAR":
        theta = _atan2(x, z)
        phi = _atan2(-y, np.sqrt(x * x + z * z))
        return np.stack([(theta / (2 * np.pi) + 0.5) * k[0], (0.5 - phi / np.pi) * k[1]], 1)
    raise KeyError(name)


@pytest.mark.oclgrind
@pytest.mark.parametrize("name", COLMAP_MODELS)
def test_residual_kernels_on_tiny_shapes(device, keep_on_simulator, name):
    """Each model's residual and rig residual kernels on six observations (one behind the camera,
    whose residual is 0 where the model checks the depth, as COLMAP's), with their Jacobians:
    what the Oclgrind job runs on the simulator."""
    model = cameras.get(name)
    params = np.array([INTRINSICS[name]])
    points = _wide_points(6, seed=9)[1:]
    points = np.concatenate([points, [[0.1, 0.2, -2.0]]])          # behind the camera
    n = len(points)
    observed = np.full((n, 2), 300.0)
    index = np.stack([np.zeros(n, int), np.zeros(n, int), np.arange(n)], 1).astype(np.int32)
    r, jacs = model.batch_function(device=device).values_and_jacobians([np.zeros((1, 6)), params, points], index,
                                                                       data=observed)
    with np.errstate(all="ignore"):
        want = reference_projection(name, params[0], points) - observed
    if model.checks_depth:
        want[-1] = 0.0
        assert not any(np.any(j[-1]) for j in jacs)
    np.testing.assert_allclose(r, want, rtol=1e-12, atol=1e-9)
    rig = pc.BatchFunction(model.rig_residual, params=(6, 6, model.num_params, 3), data=2, device=device)
    index4 = np.stack([np.zeros(n, int), np.zeros(n, int), np.zeros(n, int), np.arange(n)], 1).astype(np.int32)
    r4, _ = rig.values_and_jacobians([np.zeros((1, 6)), np.zeros((1, 6)), params, points], index4, data=observed)
    np.testing.assert_allclose(r4, r, rtol=1e-13, atol=1e-12)
    keep_on_simulator(rig)
