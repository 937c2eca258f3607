"""Library superinstructions of the tape (pyclad.regions): ``rotate_angle_axis`` run as one
instruction, against numpy's rotation (values), central differences and codegen (Jacobians),
on every device and variant; and the regions that must stay ordinary instructions."""
import numpy as np
import pytest

import pyclad as pc
from pyclad import regions, tape
from solvers.models.rotation import rotate
from test_pyclad_tape import _config

ROTATION = regions.region("rotate_angle_axis")
VARIANTS = ["default", "vec4x1-noslots-joint", "node-layout-joint", "vec2x3-joint-constant",
            "vec8x2-each-tiny-grid", "local-layout"]


def _rotated(w, x):
    return list(pc.rotate_angle_axis(w[0:3], x))


def _angles(n, seed=5):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.8, (n, 3))
    w[0] = 0.0                      # the small-angle form, at 0 exactly
    w[1] = [1e-9, -2e-9, 5e-10]     # and just below the threshold
    w[2] = [3.0, 0.0, 0.0]          # near pi
    return w, rng.normal(0, 2, (n, 3))


def _fused(f) -> bool:
    """The rotation is an instruction of the tables f's config runs."""
    return ROTATION.code in f._impl.tables((f._impl.config or pc.TapeConfig()).tables_key()).codes


def _central(fn, params, h=1e-6):
    """Central differences of fn (numpy, per row) with respect to each column of each group."""
    out = []
    for g, p in enumerate(params):
        cols = []
        for j in range(p.shape[1]):
            plus = [q.copy() for q in params]
            minus = [q.copy() for q in params]
            plus[g][:, j] += h
            minus[g][:, j] -= h
            cols.append((fn(*plus) - fn(*minus)) / (2 * h))
        out.append(np.stack(cols, axis=-1))
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_rotation_as_one_instruction(device, variant):
    config = _config(device, variant)
    f = pc.BatchFunction(_rotated, params=(3, 3), backend="tape", config=config, device=device)
    assert _fused(f)
    w, x = _angles(37)
    index = np.stack([np.arange(37), np.arange(37)], axis=1)
    values, (jw, jx) = f.values_and_jacobians([w, x], index)
    np.testing.assert_allclose(values, rotate(w, x), rtol=1e-14, atol=1e-14)
    ref = _central(lambda a, b: rotate(a, b), [w, x])
    # (rows 0 and 1 are in the first-order form, whose finite differences cross the threshold)
    np.testing.assert_allclose(jw[3:], ref[0][3:], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(jx[3:], ref[1][3:], rtol=1e-6, atol=1e-7)
    # and codegen's Jacobians (checked against independent references in test_pyclad_*), to rounding
    g = pc.BatchFunction(_rotated, params=(3, 3), backend="codegen", device=device)
    cv, (cw, cx) = g.values_and_jacobians([w, x], index)
    np.testing.assert_array_equal(values, cv)
    np.testing.assert_allclose(jw, cw, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jx, cx, rtol=1e-13, atol=1e-15)


def test_the_snavely_tables_shrink():
    """The rotation is 46 nodes of the Snavely camera: the tables lose most of their rows."""
    from solvers.models.snavely import snavely_residual
    t = pc.trace(snavely_residual, (9, 3), 2)
    with_, without = tape.TapeTables(t, np.float64), tape.TapeTables(t, np.float64, library=False)
    assert with_.n_library == 1 and without.n_library == 0
    assert len(with_.forward) < len(without.forward) // 2
    assert len(with_.reverse[False]) < len(without.reverse[False]) // 3


def _tape_and_codegen(fn, params, data=None, **kw):
    n = len(params[0])
    index = np.tile(np.arange(n)[:, None], (1, len(params)))
    sizes = tuple(p.shape[1] for p in params)
    d = {} if data is None else {"data": data}
    out = []
    for backend in ("tape", "codegen"):
        f = pc.BatchFunction(fn, params=sizes, data=0 if data is None else data.shape[1], backend=backend, **kw)
        out.append((f, f.values_and_jacobians(list(params), index, **d)))
    (ft, (tv, tj)), (_, (cv, cj)) = out
    np.testing.assert_allclose(tv, cv, rtol=1e-14, atol=1e-14)
    for a, b in zip(tj, cj):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    return ft


W, X = _angles(9, seed=2)


@pytest.mark.parametrize("case,fused", [
    # an intermediate (w.w) that the caller uses too: the nodes stay ordinary instructions
    ("shared", False),
    # constants folded into the rotation: not the canonical trace
    ("constant-axis", False),
    # only one output used, and two rotations chained: each runs as one instruction
    ("one-output", True), ("chained", True),
    # the same rotation twice is one region (the graph shares its nodes)
    ("twice", True),
    # the rotation inside a where's branch: its singular ops are guarded there already
    ("in-branch", True),
])
def test_regions_fused_only_when_exact(case, fused):
    def fn(w, x):
        if case == "shared":
            return [*pc.rotate_angle_axis(w, x), pc.dot(w, w)]
        if case == "constant-axis":
            return list(pc.rotate_angle_axis(pc.vector([0.1, 0.2, 0.3]), x))
        if case == "one-output":
            return [pc.rotate_angle_axis(w, x)[1]]
        if case == "chained":
            return list(pc.rotate_angle_axis(x, pc.rotate_angle_axis(w, x)))
        if case == "twice":
            return list(pc.rotate_angle_axis(w, x) + pc.rotate_angle_axis(w, x))
        return [pc.where(x[0] > 0, pc.rotate_angle_axis(w, x)[0] / x[0], x[1])]
    f = _tape_and_codegen(fn, [W, X])
    tb = f._impl.tables()
    if fused is not None:
        assert (tb.n_library > 0) == fused
    if case == "chained":
        assert tb.n_library == 2


def test_library_needs_the_used_cases():
    with pytest.raises(ValueError, match="library=True needs cases='used'"):
        pc.TapeConfig(library=True, cases="all")
    # left unset, cases="all" runs without them
    f = pc.BatchFunction(_rotated, params=(3, 3), backend="tape", config=pc.TapeConfig(cases="all"))
    w, x = _angles(5)
    values, _ = f.values_and_jacobians([w, x], np.stack([np.arange(5)] * 2, axis=1))
    np.testing.assert_allclose(values, rotate(w, x), rtol=1e-14, atol=1e-14)
    assert not _fused(f)


@pytest.mark.oclgrind
@pytest.mark.parametrize("variant", ["default", "node-layout-joint", "local-layout"])
def test_rotation_instruction_tiny(device, variant, keep_on_simulator):
    """The superinstruction's forward and reverse cases on a few tuples (the Oclgrind job)."""
    config = _config(device, variant)
    dtype = np.float64 if device.info.fp64 else np.float32
    f = pc.BatchFunction(_rotated, params=(3, 3), dtype=dtype, backend="tape", config=config, device=device)
    w, x = _angles(4, seed=9)
    index = np.stack([np.arange(4)] * 2, axis=1)
    values, (jw, jx) = f.values_and_jacobians([w.astype(dtype), x.astype(dtype)], index)
    keep_on_simulator(f)
    assert _fused(f)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(values, rotate(w, x), rtol=tol, atol=tol)
    ref = _central(lambda a, b: rotate(a, b), [w, x])
    np.testing.assert_allclose(jw[3:], ref[0][3:], rtol=1e-6 if dtype == np.float64 else 1e-3, atol=1e-6)
    np.testing.assert_allclose(jx[3:], ref[1][3:], rtol=1e-6 if dtype == np.float64 else 1e-3, atol=1e-6)
