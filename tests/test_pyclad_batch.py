"""BatchFunction: backends agree, chunking, device arrays, and every bad-input path."""
import dataclasses

import numpy as np
import pyopencl.array as cla
import pytest

import clkernels
import pyclad as pc
from pyclad import batch
from solvers.models.snavely import snavely_residual


def _problem(n_obs=500, n_cams=7, n_pts=40, seed=0):
    rng = np.random.default_rng(seed)
    cams = np.concatenate([rng.normal(0, 0.3, (n_cams, 3)), rng.normal(0, 1, (n_cams, 2)),
                           rng.uniform(-12, -8, (n_cams, 1)), rng.uniform(400, 600, (n_cams, 1)),
                           rng.normal(0, 0.01, (n_cams, 2))], axis=1)
    cams[0, :3] = 0.0   # exactly zero rotation: the first-order branch
    cams[1, :3] = 1e-9  # theta^2 = 3e-18 < DBL_EPSILON: first order too
    pts = rng.normal(0, 1, (n_pts, 3))
    index = np.stack([rng.integers(0, n_cams, n_obs), rng.integers(0, n_pts, n_obs)], axis=1)
    obs = rng.normal(0, 50, (n_obs, 2))
    return [cams, pts], index, obs


def test_backends_agree_to_1e12(device):
    params, index, obs = _problem()
    results = {}
    for backend in ("codegen", "tape"):
        f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend=backend, device=device)
        r, jacs = f.values_and_jacobians(params, index, data=obs)
        results[backend] = [r, *jacs]
    for a, b in zip(results["codegen"], results["tape"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())


def test_float32_close_to_float64(device):
    params, index, obs = _problem()
    f64 = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    f32 = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=np.float32, device=device)
    r64, j64 = f64.values_and_jacobians(params, index, data=obs)
    r32, j32 = f32.values_and_jacobians([p.astype(np.float32) for p in params], index,
                                        data=obs.astype(np.float32))
    assert r32.dtype == np.float32 and j32[0].dtype == np.float32
    np.testing.assert_allclose(r32, r64, rtol=1e-4, atol=1e-3)
    for a, b in zip(j32, j64):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * np.abs(b).max())


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_chunks_give_identical_results(device, backend):
    params, index, obs = _problem(n_obs=301)
    whole = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend=backend, device=device)
    small = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend=backend, device=device,
                             chunk_size=64)
    a = whole.values_and_jacobians(params, index, data=obs)
    b = small.values_and_jacobians(params, index, data=obs)
    np.testing.assert_array_equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_device_arrays_in_device_arrays_out(device, backend):
    params, index, obs = _problem(n_obs=100)
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend=backend, device=device,
                         chunk_size=32)  # the tape walks the device arrays in slices
    q = device.queue
    dev = [cla.to_device(q, p) for p in params]
    r, jacs = f.values_and_jacobians(dev, cla.to_device(q, index.astype(np.int32)),
                                     data=cla.to_device(q, obs))
    assert isinstance(r, cla.Array) and all(isinstance(j, cla.Array) for j in jacs)
    hr, hjacs = f.values_and_jacobians(params, index, data=obs)
    np.testing.assert_array_equal(r.get(), hr)
    for a, b in zip(jacs, hjacs):
        np.testing.assert_array_equal(a.get(), b)


def test_index_per_group_arrays(device):
    params, index, obs = _problem(n_obs=50)
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    np.testing.assert_array_equal(f.values(params, [index[:, 0], index[:, 1]], data=obs),
                                  f.values(params, index, data=obs))


@pytest.mark.parametrize("bad,group,tuple_", [(-1, 0, 3), (7, 0, 3), (40, 1, 5)])
def test_out_of_range_index_raises_before_launch(device, bad, group, tuple_):
    params, index, obs = _problem(n_obs=20)
    index[tuple_, group] = bad
    index[tuple_ + 4, group] = bad
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    with pytest.raises(IndexError, match=f"group {group}.*tuple {tuple_} uses row {bad}"):
        f.values(params, index, data=obs)
    dev_index = cla.to_device(device.queue, index.astype(np.int32))  # checked on the device too
    with pytest.raises(IndexError, match=f"group {group}.*tuple {tuple_}"):
        f.values([cla.to_device(device.queue, p) for p in params], dev_index,
                 data=cla.to_device(device.queue, obs))


def test_bad_arguments_name_the_argument():
    params, index, obs = _problem(n_obs=10)
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="numpy")
    with pytest.raises(TypeError, match=r"params\[1\] has dtype float32"):
        f.values([params[0], params[1].astype(np.float32)], index, data=obs)
    with pytest.raises(ValueError, match=r"params\[0\] has shape \(7, 8\)"):
        f.values([params[0][:, :8], params[1]], index, data=obs)
    with pytest.raises(ValueError, match="params must be a list of 2"):
        f.values([params[0]], index, data=obs)
    with pytest.raises(ValueError, match="data is required"):
        f.values(params, index)
    with pytest.raises(ValueError, match=r"data has shape \(9, 2\)"):
        f.values(params, index, data=obs[:9])
    with pytest.raises(TypeError, match="index must hold integers"):
        f.values(params, index.astype(float), data=obs)
    g = pc.BatchFunction(lambda x: x[0] * 2, params=(1,), backend="numpy")
    with pytest.raises(ValueError, match="data=0"):
        g.values([np.ones((2, 1))], [0, 1], data=np.ones((2, 1)))


def test_empty_batch(device):
    params, _, _ = _problem()
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    r, (jc, jp) = f.values_and_jacobians(params, np.zeros((0, 2), np.int64), data=np.zeros((0, 2)))
    assert r.shape == (0, 2) and jc.shape == (0, 2, 9) and jp.shape == (0, 2, 3)


def test_large_graph_falls_back_to_tape(monkeypatch, device):
    monkeypatch.setattr(batch, "CODEGEN_NODE_LIMIT", 50)
    with pytest.warns(UserWarning, match="tape"):
        f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    assert f.backend == "tape"
    params, index, obs = _problem(n_obs=30)
    ref = pc.BatchFunction(lambda c, p, o: snavely_residual(c, p, o), params=(9, 3), data=2,
                           backend="numpy")
    np.testing.assert_allclose(f.values(params, index, data=obs), ref.values(params, index, data=obs),
                               rtol=1e-12)


def test_source_is_straight_line_for_codegen_and_a_switch_for_tape():
    code = pc.BatchFunction(snavely_residual, params=(9, 3), data=2).source
    assert "__kernel void pyclad_eval" in code and "switch" not in code
    assert "0x1.0000000000000p-52" in code  # the angle-axis threshold, an exact literal
    tape_src = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="tape").source
    assert "switch (r0.s0)" in tape_src and "v0" not in tape_src


def test_float64_on_a_device_without_fp64_is_refused(device, monkeypatch):
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, fp64=False))
    f = pc.BatchFunction(lambda x: x[0] * 2, params=(1,), device=device)
    with pytest.raises(clkernels.FP64Error, match="float32"):
        f.values([np.ones((2, 1))], [0, 1])


@pytest.mark.oclgrind
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_staged_jacobian_stores_match_direct_stores(device, monkeypatch, dtype):
    """GPUs stage Jacobian rows through local memory; force it here (any device, Oclgrind
    checks the barrier and local accesses) on a batch that ends in a partial group."""
    from pyclad import codegen
    if dtype == np.float64 and not device.info.fp64:
        pytest.skip("device has no fp64")  # a capability; the float32 case still runs
    params, index, obs = _problem(n_obs=70)
    params, obs = [p.astype(dtype) for p in params], obs.astype(dtype)
    monkeypatch.setattr(codegen, "lanes", lambda *args: 1)  # staging is for one tuple per work-item
    direct = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, device=device)
    want = direct.values_and_jacobians(params, index, data=obs)
    monkeypatch.setattr(codegen, "stage_size", lambda *args: 32)
    staged = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=dtype, device=device)
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in staged.kernel_source(device=device)
    got = staged.values_and_jacobians(params, index, data=obs)
    np.testing.assert_array_equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.oclgrind
@pytest.mark.parametrize("lanes", [1, 4, 8])
def test_simd_lanes_match_one_tuple_per_work_item(device, monkeypatch, lanes):
    """CPUs evaluate several tuples per work-item in vector types; a batch that ends in a
    partial vector must give what one tuple per work-item gives (to rounding: vector math
    functions may differ from scalar ones in the last bit)."""
    from pyclad import codegen
    if lanes > (device.info.widest_vector("double") or lanes):
        # codegen never picks it there: the compiler's target has narrower registers (PoCL 3.0
        # on an AVX-2 target aborts on a double8 sqrt), see clkernels.runtime
        pytest.skip(f"this CPU's compiler takes at most {device.info.native_vector_width_double} doubles per vector")
    params, index, obs = _problem(n_obs=37)
    results = []
    for width in (1, lanes):
        monkeypatch.setattr(codegen, "lanes", lambda *args, w=width: w)
        f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
        results.append(f.values_and_jacobians(params, index, data=obs))
    (r1, j1), (r2, j2) = results
    np.testing.assert_allclose(r2, r1, rtol=1e-13, atol=1e-11)
    for a, b in zip(j2, j1):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13 * np.abs(b).max())
