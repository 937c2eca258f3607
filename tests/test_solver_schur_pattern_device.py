"""sparse_schur's reduced pattern made on the device (solvers.linalg.schur_pattern_device) against
the host's (solvers.linalg.schur_reduced_device.ReducedPattern, itself checked against its
definition in test_solver_schur_reduced.py), array for array, on every OpenCL device; tiny shapes
on Oclgrind. The whole solves with it are test_solver_device_observations.py's (same bits as the
host setup)."""
import numpy as np
import pytest

from solvers.ba.observations_device import DeviceObservations
from solvers.linalg import schur_pattern_device
from solvers.linalg.schur_reduced_device import ReducedPattern

ARRAYS = ("obs", "group_start", "group_pt", "cam_group", "pair_a", "pair_b", "block_row", "block_col",
          "block_run", "run_start", "cam_rhs_run", "rhs_run_start")
COUNTS = ("n", "nc", "npt", "ngroups", "npairs", "nblocks", "nruns", "nrhs_runs", "max_run")


def _observations(rng, nc, npt, n, unseen_camera=False, repeats=False):
    cam, pt = rng.integers(0, nc, n), rng.integers(0, npt, n)
    if unseen_camera:           # a camera with no observation: its diagonal block has no pair
        cam[cam == nc - 1] = 0
    if repeats:                 # a camera that sees a point twice: groups of two observations
        cam, pt = np.concatenate((cam, cam[::4])), np.concatenate((pt, pt[::4]))
    return cam, pt


def _host(value):
    return value.get() if hasattr(value, "get") else np.asarray(value)


def _compare(device, cam, pt, nc, npt, max_run):
    dev = DeviceObservations(device, cam, pt, None, nc, npt)
    order = np.argsort(pt, kind="stable")
    want = ReducedPattern(cam[order].astype(np.int32), pt[order].astype(np.int32), nc, npt, max_run=max_run)
    got = schur_pattern_device.pattern_on_device(device, dev, max_run)
    assert got is not None
    for name in ARRAYS:
        np.testing.assert_array_equal(_host(getattr(got, name)), getattr(want, name), err_msg=name)
    for name in COUNTS:
        assert getattr(got, name) == getattr(want, name), name
    assert got.fill == want.fill
    return got


@pytest.mark.oclgrind
@pytest.mark.parametrize("unseen_camera, repeats", [(False, False), (True, False), (False, True)])
def test_tiny_patterns_equal_the_hosts(device, unseen_camera, repeats):
    rng = np.random.default_rng(3)
    for nc, npt, n, max_run in [(1, 1, 1, 1), (1, 4, 9, 2), (3, 5, 12, 1), (5, 9, 40, 3)]:
        if unseen_camera and nc == 1:
            continue
        cam, pt = _observations(rng, nc, npt, n, unseen_camera, repeats)
        _compare(device, cam, pt, nc, npt, max_run)


@pytest.mark.parametrize("max_run", [1, 7, 64, 4096])
def test_patterns_equal_the_hosts(device, max_run):
    rng = np.random.default_rng(max_run)
    for nc, npt, n in [(40, 900, 4000), (300, 20_000, 100_000)]:
        cam, pt = _observations(rng, nc, npt, n, unseen_camera=True, repeats=True)
        got = _compare(device, cam, pt, nc, npt, max_run)
    assert got.group_cam is None            # (kept on the host pattern only)


def test_points_seen_by_every_camera(device):
    """Long point runs (a pair per two of its cameras): a group's loop over hundreds of partners."""
    nc, npt = 300, 6
    cam = np.tile(np.arange(nc), npt)
    pt = np.repeat(np.arange(npt), nc)
    got = _compare(device, cam, pt, nc, npt, 64)
    assert got.npairs == npt * nc * (nc + 1) // 2


def test_what_the_device_does_not_make(device):
    """None where the host must make it: block keys beyond int32, or more memory than is left."""
    rng = np.random.default_rng(0)
    cam, pt = _observations(rng, 5, 20, 60)
    dev = DeviceObservations(device, cam, pt, None, 5, 20)
    assert schur_pattern_device.pattern_on_device(device, dev, 4, other_bytes=2 ** 62) is None
    dev.nc = 46_341                 # nc * nc >= 2^31 (checked before anything is read)
    assert schur_pattern_device.pattern_on_device(device, dev, 4) is None
