"""Observations ordered on the device (solvers.ba.observations_device) against the host's orders
(solvers.ba.evaluator.Evaluator, solvers.ba.ordering), array for array, and whole solves with either
setup giving the same bits, on every OpenCL device."""
import numpy as np
import pytest

import solvers
from solvers.ba import observations_device as dobs
from solvers.ba import ordering
from solvers.linalg import schur_pattern_device, schur_pcg_device

_pattern_on_device = schur_pattern_device.pattern_on_device


def _problem(n_cams, n_points, per_point, seed, shuffle=True, repeats=False):
    p = solvers.synthetic_problem(n_cams, n_points, per_point, seed=seed)
    cam, pt, obs = p.camera_index, p.point_index, p.observations
    if repeats:         # a point seen twice by one camera: groups of several observations
        k = np.arange(0, cam.size, 3)
        cam, pt, obs = np.concatenate((cam, cam[k])), np.concatenate((pt, pt[k])), np.concatenate((obs, obs[k] + 0.5))
    if shuffle:         # file order neither by point nor by camera
        perm = np.random.default_rng(seed).permutation(cam.size)
        cam, pt, obs = cam[perm], pt[perm], obs[perm]
    return solvers.BALProblem(p.cameras, p.points, cam, pt, obs, name=f"test-{seed}")


@pytest.mark.oclgrind
@pytest.mark.parametrize("shuffle, repeats", [(False, False), (True, False), (True, True)])
def test_orders_equal_the_hosts(device, shuffle, repeats):
    p = _problem(7, 60, 3, seed=4, shuffle=shuffle, repeats=repeats)
    d = dobs.DeviceObservations(device, p.camera_index, p.point_index, p.observations, p.num_cameras,
                                p.num_points, np.float64)
    order = np.argsort(p.point_index, kind="stable")
    cam, pt = p.camera_index[order], p.point_index[order]
    np.testing.assert_array_equal(d.host("order"), order)
    np.testing.assert_array_equal(d.host("cam"), cam)
    np.testing.assert_array_equal(d.host("pt"), pt)
    np.testing.assert_array_equal(d.index.get(), np.stack((cam, pt), axis=1))
    np.testing.assert_array_equal(d.observed.get(), p.observations[order])
    np.testing.assert_array_equal(d.pt_start.get(), ordering.starts(pt, p.num_points))
    np.testing.assert_array_equal(d.host("camera_order"), np.argsort(cam, kind="stable"))
    np.testing.assert_array_equal(d.camera_counts, np.bincount(cam, minlength=p.num_cameras))
    # The CG's runs, with cuts that fall inside groups where points repeat (max_len 2).
    for max_len in (2, 5, 256):
        _, start, cam_seg = schur_pcg_device._camera_segments(cam, pt, p.num_cameras, max_len)
        got_start, got_seg = schur_pcg_device._camera_segments_device(d, max_len)
        np.testing.assert_array_equal(got_start, start)
        np.testing.assert_array_equal(got_seg, cam_seg)


@pytest.mark.parametrize("linear_solver, dtype", [("iterative_schur", np.float64), ("iterative_schur", np.float32),
                                                  ("sparse_schur", np.float64)])
def test_solves_are_bit_identical_with_either_setup(device, linear_solver, dtype, monkeypatch):
    if dtype == np.float64 and not device.info.fp64:
        pytest.skip("no fp64 on this device")
    p = _problem(12, 900, 4.4, seed=5, repeats=True)
    kw = dict(linear_solver=linear_solver, dtype=dtype, max_iterations=4, device=device.device, handle_sigint=False)
    host = solvers.bundle_adjust(p, device_setup=False, **kw)
    # sparse_schur's pattern is then made on the device too (solvers.linalg.schur_pattern_device).
    made = []
    monkeypatch.setattr(schur_pattern_device, "pattern_on_device",
                        lambda *a, **k: made.append(_pattern_on_device(*a, **k)) or made[-1])
    dev = solvers.bundle_adjust(p, device_setup=True, **kw)
    assert len(made) == (linear_solver == "sparse_schur") and all(m is not None for m in made)
    assert host.state == dev.state == "device"
    assert [h.cost for h in dev.history] == [h.cost for h in host.history]
    np.testing.assert_array_equal(dev.cameras, host.cameras)
    np.testing.assert_array_equal(dev.points, host.points)
    assert dev.times["setup"] > 0


def test_the_choice(device):
    """Forced either way by the option; by default on accelerators only, from MIN_OBSERVATIONS
    (a CPU device works on the host's arrays in place)."""
    big = dobs.MIN_OBSERVATIONS
    assert dobs.wanted(device, 10, True) and not dobs.wanted(device, 10 ** 9, False)
    assert dobs.wanted(device, big, None) == (not device.info.is_cpu and not device.info.is_simulator)
    assert not dobs.wanted(device, big - 1, None)
    with pytest.raises(ValueError, match="device_setup"):
        solvers.bundle_adjust(_problem(5, 30, 3, 1), device_setup="yes", max_iterations=1)


def test_an_accelerator_solve_names_what_a_larger_problem_adds(device):
    """lm_device.larger_problem_requests (prefetched behind a cold solve's own programs): on an
    accelerator (this device's description with is_cpu and is_simulator off) the programs of the
    device setup (the sort's and the pattern's) and of the mixed-precision factorisation; the
    device setup's not where the options keep it on the host; nothing on a CPU or the simulator."""
    import copy
    import dataclasses
    from solvers.ba.lm_device import larger_problem_requests
    from solvers.linalg.linear_solver import linear_solver
    from solvers.linalg.mixed_cholesky_device import MixedCholesky
    from solvers.loop.lm import Options
    acc = copy.copy(device)
    acc.info = dataclasses.replace(device.info, is_cpu=False, is_simulator=False)
    entry = linear_solver("sparse_schur")
    setup = [*dobs.program_requests(acc, np.float64), schur_pattern_device.program_request()]
    got = larger_problem_requests(acc, Options(), np.float64, entry, 9, 3, 2)
    assert all(r in got for r in setup), got
    if acc.info.global_mem_bytes >= 2 ** 31:        # room for 8,199 unknowns' matrices
        assert all(r in got for r in MixedCholesky.program_requests(acc)), got
    off = larger_problem_requests(acc, Options(device_setup=False), np.float64, entry, 9, 3, 2)
    assert not any(r in off for r in setup)
    if device.info.is_cpu or device.info.is_simulator:
        assert larger_problem_requests(device, Options(), np.float64, entry, 9, 3, 2) == []
