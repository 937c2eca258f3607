"""``devices=``: a batch split across several OpenCL devices (pyclad.BatchFunction._run_split).

Two real devices come from PoCL itself (``POCL_DEVICES="pthread pthread"``), which must be set
before PoCL starts, so those checks run in a subprocess; the rest runs here on one device."""
import textwrap

import numpy as np
import pyopencl.array as cla
import pytest

import solvers
from clkernels import multi_device
from solvers.models.snavely import snavely_function

from pocl_pair import run_on_two_devices


def snavely_inputs(seed=1, cameras=7, points=300, per_point=3):
    p = solvers.synthetic_problem(cameras, points, per_point, seed=seed)
    return [p.cameras, p.points], np.stack([p.camera_index, p.point_index], 1), p.observations


@pytest.mark.parametrize("rates,n", [([1, 1], 10), ([1, 3], 1000), ([2, 1, 1], 7), ([1, 1, 1], 2), ([5, 0.001], 3)])
def test_shares_cover_every_tuple_once_in_proportion(rates, n):
    ranges = multi_device.shares(n, rates)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a <= b for a, b in ranges) and all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    sizes = np.array([b - a for a, b in ranges])
    np.testing.assert_allclose(sizes, n * np.array(rates) / np.sum(rates), atol=1.0)


def test_one_device_in_the_list_gives_the_single_device_result(device):
    params, idx, obs = snavely_inputs()
    dtype = np.float64 if device.info.fp64 else np.float32
    f = snavely_function(dtype, "codegen")
    params = [a.astype(dtype) for a in params]
    want = f.values_and_jacobians(params, idx, data=obs.astype(dtype), device=device)
    got = f.values_and_jacobians(params, idx, data=obs.astype(dtype), devices=[device])
    assert np.array_equal(want[0], got[0])
    assert all(np.array_equal(a, b) for a, b in zip(want[1], got[1]))


def test_devices_errors(device):
    params, idx, obs = snavely_inputs()
    f = snavely_function(np.float32, "codegen")
    params, obs = [a.astype(np.float32) for a in params], obs.astype(np.float32)
    with pytest.raises(ValueError, match="not both"):
        f.values(params, idx, data=obs, device=device, devices=[device])
    with pytest.raises(ValueError, match="twice"):
        f.values(params, idx, data=obs, devices=[device, device.device])
    with pytest.raises(ValueError, match="empty"):
        f.values(params, idx, data=obs, devices=[])
    with pytest.raises(ValueError, match="'all'"):
        f.values(params, idx, data=obs, devices="pocl")
    dev_params = [cla.to_device(device.queue, a) for a in params]
    with pytest.raises(TypeError, match="host .numpy. arrays"):
        f.values(dev_params, idx, data=obs, devices=[device])
    with pytest.raises(IndexError, match="out of range"):
        bad = idx.copy()
        bad[5, 1] = 10 ** 6
        f.values(params, bad, data=obs, devices=[device])
    with pytest.raises(ValueError, match="runs on the host"):
        snavely_function(np.float64, "numpy").values(params, idx, data=obs, devices=[device])


TWO_DEVICES = textwrap.dedent("""
    import json, numpy as np, clkernels, solvers
    from solvers.models.snavely import snavely_function
    from clkernels import multi_device
    p = solvers.synthetic_problem(40, 6001, 4, seed=3)
    params, idx, obs = [p.cameras, p.points], np.stack([p.camera_index, p.point_index], 1), p.observations
    out = {"n": int(idx.shape[0])}
    for backend in ("codegen", "tape"):
        f = snavely_function(np.float64, backend)
        want = f.values_and_jacobians(params, idx, data=obs, device=pair[0])
        same = []
        for _ in range(3):           # equal shares, then shares from the measured rates
            got = f.values_and_jacobians(params, idx, data=obs, devices=pair)
            same.append(bool(np.array_equal(want[0], got[0]) and
                             all(np.array_equal(a, b) for a, b in zip(want[1], got[1]))))
        out[backend] = same
        out[backend + "_values"] = bool(np.array_equal(f.values(params, idx, data=obs, device=pair[1]),
                                                       f.values(params, idx, data=obs, devices=pair)))
        out[backend + "_rates"] = f._throughputs.get([clkernels.get_runtime(d) for d in pair])
    out["all"] = [d.device.int_ptr == q.int_ptr for d, q in zip(multi_device.resolve("all"), pair)]
    print(json.dumps(out))
""")


def test_two_pocl_devices_give_one_devices_bits():
    """Two PoCL CPU devices (the same compiler): split results equal one device's bit for bit,
    for codegen and the tape, with equal shares and with shares from measured throughputs;
    ``"all"`` finds both (no GPU on the platform)."""
    out = run_on_two_devices(TWO_DEVICES)
    assert out["n"] == 24004
    for backend in ("codegen", "tape"):
        assert out[backend] == [True, True, True]
        assert out[backend + "_values"]
        rates = out[backend + "_rates"]
        assert len(rates) == 2 and all(r > 1.0 for r in rates)     # measured, not the defaults
    assert out["all"] == [True, True]
