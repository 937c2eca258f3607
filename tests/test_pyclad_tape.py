"""The tape interpreter's variants (pyclad.TapeConfig): each against independent references
(the complex step, numpy) and against codegen, on every device; the superinstructions; the
slot tables; bad configurations."""
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyclad as pc
from pyclad import tape
from pyclad.ops import FUSED, OPS
from solvers.models.snavely import snavely_residual
from test_pyclad_graph import N_INPUTS, _build, _trees
from test_pyclad_ops import ALL_OPS

C = pc.TapeConfig
# Every switch at least once, and a grid far smaller than the tuples (the persistent loop turns).
VARIANTS = {
    "default": None,
    "scalar-each-noslots-nofuse": C(lanes=1, blocks=1, slots=False, fuse=False, library=False, preload=False,
                                    sweep="each"),
    "node-layout-joint": C(lanes=1, blocks=1, layout="node", sweep="joint", wg=8, work_items=16),
    "vec2x3-joint-constant": C(lanes=2, blocks=3, sweep="joint", tables="constant"),
    "vec8x2-each-tiny-grid": C(lanes=8, blocks=2, sweep="each", wg=1, work_items=2),
    "vec4x1-noslots-joint": C(lanes=4, blocks=1, slots=False, sweep="joint"),
    "local-layout": C(lanes=1, blocks=2, layout="local", wg=4, work_items=8),
}
IDS = list(VARIANTS)


def _config(device, name, real="double"):
    config = VARIANTS[name]
    if config is not None and config.layout == "item" and not device.info.is_cpu:
        pytest.skip("the 'item' layout is chosen for CPUs")   # every other variant still runs
    widest = device.info.widest_vector(real)
    if config is not None and widest is not None and config.lanes > widest:
        # The widest vectors this CPU's compiler takes (wider ones are refused: test below).
        config = dataclasses.replace(config, lanes=widest)
    return config


def _snavely_problem(n_obs=203, seed=3):
    rng = np.random.default_rng(seed)
    cams = np.zeros((5, 9))
    cams[:, :3] = rng.normal(0, 0.3, (5, 3))
    cams[:, 3:6] = rng.normal(0, 1, (5, 3))
    cams[:, 5] -= 8
    cams[:, 6] = rng.uniform(300, 900, 5)
    cams[:, 7:] = rng.normal(0, [1e-2, 1e-4], (5, 2))
    cams[2, :3] = 0.0   # the angle-axis rotation's small-angle branch
    pts = rng.normal(0, 1, (40, 3))
    index = np.stack([rng.integers(0, 5, n_obs), rng.integers(0, 40, n_obs)], axis=1)
    return [cams, pts], index, rng.normal(0, 50, (n_obs, 2))


@pytest.mark.parametrize("variant", IDS)
def test_variant_matches_codegen_on_snavely(device, variant):
    config = _config(device, variant)
    params, index, obs = _snavely_problem()
    ref = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="tape", config=config, device=device)
    r0, j0 = ref.values_and_jacobians(params, index, data=obs)
    r, j = f.values_and_jacobians(params, index, data=obs)
    for a, b in zip([r, *j], [r0, *j0]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())
    # float32 as well, against float64 codegen
    f32 = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, dtype=np.float32, backend="tape",
                           config=config, device=device)
    r32, j32 = f32.values_and_jacobians([p.astype(np.float32) for p in params], index,
                                        data=obs.astype(np.float32))
    np.testing.assert_allclose(r32, r0, rtol=1e-4, atol=1e-3)
    for a, b in zip(j32, j0):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * np.abs(b).max())


# The superinstructions: a product whose only use is a sum or a difference.
FUSED_ROWS = {
    "muladd": (lambda x: x[0] * x[1] + x[2], lambda a, b, c: a * b + c),
    "mulsub": (lambda x: x[0] * x[1] - x[2], lambda a, b, c: a * b - c),
    "mulrsub": (lambda x: x[2] - x[0] * x[1], lambda a, b, c: c - a * b),
}


def test_every_superinstruction_has_a_test_row():
    assert set(FUSED_ROWS) == set(FUSED)


@pytest.mark.parametrize("name", sorted(FUSED_ROWS))
@pytest.mark.parametrize("variant", ["default", "vec2x3-joint-constant"])
def test_superinstruction_against_the_complex_step(device, name, variant):
    config = _config(device, variant)
    expr, ref = FUSED_ROWS[name]
    f = pc.BatchFunction(lambda x: [expr(x), x[0] * x[0] + x[0]], params=(3,), backend="tape",
                         config=config, device=device)
    codes = f._impl.tables().forward[:, 0]
    assert FUSED[name].code in codes and FUSED["muladd"].code in codes   # the fusion happened
    x = np.random.default_rng(7).uniform(-2, 2, (11, 3))
    values, (jac,) = f.values_and_jacobians([x], np.arange(11))

    def reference(x):
        return np.stack([ref(*x.T), x[:, 0] * x[:, 0] + x[:, 0]], axis=1)
    np.testing.assert_allclose(values, reference(x), rtol=1e-14, atol=1e-14)
    for j in range(3):
        xc = x.astype(complex)
        xc[:, j] += 1e-30j
        np.testing.assert_allclose(jac[:, :, j], reference(xc).imag / 1e-30, rtol=1e-14, atol=1e-14)


def test_a_product_with_two_uses_or_an_output_is_not_fused():
    def fn(x):
        p = x[0] * x[1]
        return [p + x[2], p - x[2], x[1] * x[2]]     # p has two uses; the last product is an output
    tb = tape.TapeTables(pc.trace(fn, (3,)), np.float64)
    names = {op.code: op.name for op in (*OPS.values(), *FUSED.values())}
    ops = [names.get(c) for c in tb.forward[:, 0]]
    assert ops.count("mul") == 2 and not any(o in FUSED for o in ops)


def test_slots_by_liveness_are_fewer_than_nodes():
    t = pc.trace(snavely_residual, (9, 3), 2)
    # (nodes as instructions: no library superinstructions, inputs as instructions)
    live = tape.TapeTables(t, np.float64, library=False, preload=False)
    flat = tape.TapeTables(t, np.float64, liveness=False, library=False, preload=False)
    assert live.value_slots < live.n_nodes // 2 and live.adjoint_slots[False] < live.n_nodes // 2
    assert flat.value_slots == flat.n_nodes
    # the superinstructions removed nodes: fewer instructions than the graph's nodes
    assert live.n_nodes < tape.TapeTables(t, np.float64, fused=False, library=False, preload=False).n_nodes


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trees=st.lists(_trees(4), min_size=1, max_size=3))
@pytest.mark.parametrize("variant", ["scalar-each-noslots-nofuse", "vec2x3-joint-constant",
                                     "vec8x2-each-tiny-grid", "node-layout-joint", "local-layout"])
def test_random_graphs_match_complex_step(device, variant, trees):
    config = _config(device, variant)

    def fn(x):
        return [x[0] * 0 + _build(t, x, 0) for t in trees]

    def reference(x):
        return np.stack([x[:, 0] * 0 + _build(t, list(x.T), 1) for t in trees], axis=1)

    x = np.random.default_rng(len(str(trees))).uniform(-1.5, 1.5, (37, N_INPUTS))
    f = pc.BatchFunction(fn, params=(N_INPUTS,), backend="tape", config=config, device=device)
    values, (jac,) = f.values_and_jacobians([x], np.arange(len(x)))
    np.testing.assert_allclose(values, reference(x), rtol=1e-12, atol=1e-12)
    for j in range(N_INPUTS):
        xc = x.astype(complex)
        xc[:, j] += 1e-30j
        np.testing.assert_allclose(jac[:, :, j], reference(xc).imag / 1e-30, rtol=1e-11, atol=1e-11)


@pytest.mark.oclgrind
@pytest.mark.parametrize("variant", ["scalar-each-noslots-nofuse", "vec2x3-joint-constant",
                                     "node-layout-joint", "local-layout"])
def test_every_op_in_one_kernel_tiny(device, variant, keep_on_simulator):
    """All ops (and a superinstruction) in one graph on a few tuples, per variant (the Oclgrind
    job's check of the interpreter's variants), against numpy and central differences."""
    config = _config(device, variant)
    dtype = np.float64 if device.info.fp64 else np.float32

    def fn(x, d):
        return [op(x[0], x[1], d[0]) for op, _ in ALL_OPS] + [x[0] * x[1] + d[0]]

    def fn_np(a, b, d):
        return np.stack([np.broadcast_to(ref(a, b, d), a.shape) for _, ref in ALL_OPS] + [a * b + d], axis=-1)

    f = pc.BatchFunction(fn, params=(2,), data=1, dtype=dtype, backend="tape", config=config, device=device)
    x = np.array([[0.3, 1.7], [-0.6, 0.4], [0.9, 2.5]])
    d = np.array([[0.5], [-1.0], [2.0]])
    values, (jac,) = f.values_and_jacobians([x.astype(dtype)], np.array([[0], [1], [2]]), data=d.astype(dtype))
    keep_on_simulator(f)   # its tables and scratch (see conftest: Oclgrind's shadow memory)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(values, fn_np(x[:, 0], x[:, 1], d[:, 0]), rtol=tol, atol=tol)
    h = 1e-6
    for j in range(2):
        xp, xm = x.copy(), x.copy()
        xp[:, j] += h
        xm[:, j] -= h
        fd = (fn_np(xp[:, 0], xp[:, 1], d[:, 0]) - fn_np(xm[:, 0], xm[:, 1], d[:, 0])) / (2 * h)
        np.testing.assert_allclose(jac[:, :, j], fd, rtol=1e-6 if dtype == np.float64 else 1e-3,
                                   atol=1e-6 if dtype == np.float64 else 1e-3)


def test_bad_configurations_name_the_field():
    with pytest.raises(ValueError, match="TapeConfig.lanes must be 1, 2, 4, 8 or 16"):
        C(lanes=3)
    with pytest.raises(ValueError, match="TapeConfig.blocks must be a positive integer"):
        C(blocks=0)
    with pytest.raises(ValueError, match="TapeConfig.layout must be one of"):
        C(layout="shared")
    with pytest.raises(ValueError, match="TapeConfig.sweep must be 'joint' or 'each'"):
        C(sweep="both")
    with pytest.raises(ValueError, match="config is the tape kernel's variant"):
        pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="codegen", config=C())
    with pytest.raises(TypeError, match="config must be a pyclad.TapeConfig"):
        pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="tape", config={"lanes": 4})


def test_a_joint_sweep_of_more_than_31_outputs_is_refused(device):
    f = pc.BatchFunction(lambda x: [x[0] * (i + 1) for i in range(32)], params=(1,), backend="tape",
                         config=C(sweep="joint"), device=device)
    with pytest.raises(ValueError, match="serves at most 31 outputs"):
        f.values_and_jacobians([np.ones((2, 1))], [0, 1])


def test_local_layout_is_refused_when_it_does_not_fit(device):
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="tape",
                         config=C(layout="local", wg=1 << 20), device=device)
    params, index, obs = _snavely_problem(n_obs=8)
    with pytest.raises(ValueError, match="bytes of local memory needed"):
        f.values_and_jacobians(params, index, data=obs)


def test_cpu_vectors_wider_than_the_compiler_takes_are_refused(device):
    widest = device.info.widest_vector("double")
    if widest is None:
        pytest.skip("GPUs and the simulator run any vector width")
    wider = next(w for w in (2, 4, 8, 16) if w > widest)
    f = pc.BatchFunction(lambda x: [x[0] * x[0]], params=(1,), backend="tape", config=C(lanes=wider), device=device)
    with pytest.raises(ValueError, match=f"TapeConfig.lanes={wider}: this CPU device compiles vectors of at most {widest}"):
        f.values_and_jacobians([np.ones((2, 1))], [0, 1])


# -- backend="auto" ---------------------------------------------------------------------------

def test_auto_picks_codegen_where_its_build_is_cheap(device, recwarn):
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, device=device)
    assert f.backend == "auto"
    expected = "codegen" if pc.backends.estimated_codegen_build_s(95, device.info) <= \
        pc.backends.AUTO_BUILD_LIMIT_S else "tape"
    assert f.backend_for() == expected
    assert not [w for w in recwarn if "backend='auto'" in str(w.message)]


def test_auto_picks_the_tape_when_the_build_would_cost_more_and_says_so_once(device, monkeypatch):
    monkeypatch.setattr(pc.backends, "AUTO_BUILD_LIMIT_S", 0.0)
    params, index, obs = _snavely_problem()
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="auto", device=device)
    with pytest.warns(UserWarning, match="so the tape evaluates it"):
        r, j = f.values_and_jacobians(params, index, data=obs)
    assert f.backend_for() == "tape" and "switch (r0.s0)" in f.source
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # once: a second call says nothing
        f.values_and_jacobians(params, index, data=obs)
    r0, j0 = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend="codegen",
                              device=device).values_and_jacobians(params, index, data=obs)
    for a, b in zip([r, *j], [r0, *j0]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())


def test_the_build_estimate_follows_the_measured_builds():
    """benchmarks/bench_compile_time.py: NVIDIA 0.70 s (95 nodes) and 166 s (1,986 nodes); PoCL
    1.6 s and 3.0 s."""
    from types import SimpleNamespace
    gpu, cpu = SimpleNamespace(is_cpu=False), SimpleNamespace(is_cpu=True)
    est = pc.backends.estimated_codegen_build_s
    assert 0.5 < est(95, gpu) < 1.0 and 100 < est(1986, gpu) < 250
    assert 1.3 < est(95, cpu) < 1.8 and 2.6 < est(1986, cpu) < 3.4
    limit = pc.backends.AUTO_BUILD_LIMIT_S
    assert est(95, gpu) < limit < est(1986, gpu) and est(10000, cpu) < limit   # CPUs: codegen to ~11k nodes
