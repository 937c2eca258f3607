"""DCNv4 forward and backward against an independent float64 numpy reference written from the
operator's definition, and the backward against central differences of that reference."""
import dataclasses
import importlib
import math

import numpy as np
import pyopencl.array as cla
import pytest

import clkernels
from clkernels import arrays
from clkernels.dcnv4 import (LADDER, DCNv4Config, DCNv4Options, dcnv4, dcnv4_backward,
                             offset_mask_channels)

from bf16 import BF16, assert_bf16_close

dcnv4_module = importlib.import_module("clkernels.dcnv4")


_KEPT_ON_SIMULATOR = []


@pytest.fixture(autouse=True)
def _keep_buffers_alive_on_oclgrind(request, monkeypatch):
    """Oclgrind 21.10's uninitialised-value checker misreports fully written buffers after
    other buffers were released (two 3-line kernels and a released buffer reproduce it; with
    nothing released it reports nothing). On the simulator the device arrays these tests
    make are therefore never released: the shapes are tiny."""
    device = request.getfixturevalue("device") if "device" in request.fixturenames else None
    if device is not None and device.info.is_simulator:
        for name in ("empty", "to_device"):
            original = getattr(arrays, name)

            def keeping(*args, _original=original, **kw):
                _KEPT_ON_SIMULATOR.append(_original(*args, **kw))
                return _KEPT_ON_SIMULATOR[-1]
            monkeypatch.setattr(arrays, name, keeping)
    yield


# ---------------------------------------------------------------- reference (from the definition)

def corner_coefficients(om, o: DCNv4Options, H, W):
    """The sampling rule, from the definition: for each group g and each of its taps' four
    bilinear corners, yields (g, cy, cx, coefficient, inside), arrays over [N, H_out, W_out].
    Tap (i along the width outer, j along the height inner, centre skipped under remove_center)
    samples w = x*stride_w - pad_w + half_w + (i*dil_w - half_w + dx)*offset_scale (likewise h),
    counts when -1 < h < H and -1 < w < W; the coefficient is the corner's bilinear weight times
    the raw mask, zero for a corner outside the input (which reads as zero)."""
    om = np.asarray(om, np.float64)
    G = o.group
    ho = (H + 2 * o.pad_h - (o.dilation_h * (o.kernel_h - 1) + 1)) // o.stride_h + 1
    wo = (W + 2 * o.pad_w - (o.dilation_w * (o.kernel_w - 1) + 1)) // o.stride_w + 1
    taps = [(i, j) for i in range(o.kernel_w) for j in range(o.kernel_h)
            if not (o.remove_center and i == o.kernel_w // 2 and j == o.kernel_h // 2)]
    K = len(taps)
    half_w, half_h = o.dilation_w * (o.kernel_w - 1) // 2, o.dilation_h * (o.kernel_h - 1) // 2
    oy, ox = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    for g in range(G):
        block = om[..., g * K * 3:(g + 1) * K * 3]
        for k, (i, j) in enumerate(taps):
            dx, dy, mask = block[..., 2 * k], block[..., 2 * k + 1], block[..., 2 * K + k]
            w = ox * o.stride_w - o.pad_w + half_w + (i * o.dilation_w - half_w + dx) * o.offset_scale
            h = oy * o.stride_h - o.pad_h + half_h + (j * o.dilation_h - half_h + dy) * o.offset_scale
            with np.errstate(invalid="ignore"):
                counts = (h > -1) & (w > -1) & (h < H) & (w < W)
            h, w = np.where(counts, h, 0.0), np.where(counts, w, 0.0)
            h0, w0 = np.floor(h).astype(int), np.floor(w).astype(int)
            lh, lw = h - h0, w - w0
            for cy, cx, weight in ((h0, w0, (1 - lh) * (1 - lw)), (h0, w0 + 1, (1 - lh) * lw),
                                   (h0 + 1, w0, lh * (1 - lw)), (h0 + 1, w0 + 1, lh * lw)):
                inside = counts & (cy >= 0) & (cy < H) & (cx >= 0) & (cx < W)
                yield g, cy, cx, np.where(inside, weight * np.where(counts, mask, 0), 0), inside


def reference(x, om, o: DCNv4Options):
    """Output [N, H_out, W_out, G*C] in float64, written from the semantics: the sum over taps
    and corners (corner_coefficients) of coefficient times the input at the corner."""
    x = np.asarray(x, np.float64)
    n, H, W, _ = x.shape
    G, C = o.group, o.group_channels
    xg = x.reshape(n, H, W, G, C)
    batch = np.arange(n)[:, None, None]
    out = None
    for g, cy, cx, coef, _ in corner_coefficients(om, o, H, W):
        if out is None:
            out = np.zeros((*coef.shape, G, C))
        value = xg[batch, np.clip(cy, 0, H - 1), np.clip(cx, 0, W - 1), g]
        out[:, :, :, g] += coef[..., None] * value
    return out.reshape(*out.shape[:3], G * C)


def central_differences(x, om, grad_out, o: DCNv4Options, eps=1e-6, sides=(1, -1)):
    """d sum(grad_out * reference) / d(x, om), float64. Each output channel depends on its
    input channel only, and each output pixel on its own offset_mask row only, so one
    perturbation covers all channels of an input pixel, or one entry of every row.
    ``sides=(1, 0)`` or ``(0, -1)``: one-sided differences instead (the two sides of a kink:
    bilinear sampling is not differentiable where a position crosses the pixel grid)."""
    x, om, go = (np.asarray(a, np.float64) for a in (x, om, grad_out))
    g_x, g_om = np.zeros_like(x), np.zeros_like(om)
    width = (sides[0] - sides[1]) * eps
    for pos in np.ndindex(*x.shape[:3]):
        plus, minus = x.copy(), x.copy()
        plus[pos] += sides[0] * eps
        minus[pos] += sides[1] * eps
        diff = go * (reference(plus, om, o) - reference(minus, om, o))
        g_x[pos] = diff.sum(axis=(0, 1, 2)) / width
    for e in range(om.shape[3]):
        plus, minus = om.copy(), om.copy()
        plus[..., e] += sides[0] * eps
        minus[..., e] += sides[1] * eps
        diff = go * (reference(x, plus, o) - reference(x, minus, o))
        g_om[..., e] = diff.sum(axis=3) / width
    return g_x, g_om


def make_inputs(o: DCNv4Options, n, H, W, dtype=np.float32, spread=2.0, extra_p=0, seed=0):
    rng = np.random.default_rng(seed)
    ho, wo = o.out_size(H, W)
    p = offset_mask_channels(o.group, o.kernel_h, o.kernel_w, o.remove_center) + extra_p
    x = rng.standard_normal((n, H, W, o.group * o.group_channels)).astype(dtype)
    # Offsets wide enough that taps leave the input on every side; masks signed (no softmax).
    om = rng.uniform(-spread, spread, (n, ho, wo, p)).astype(dtype)
    return x, om


def call_opts(o: DCNv4Options):
    return dataclasses.asdict(o)


def assert_close(actual, expected, rtol, what=""):
    """|actual - expected| <= rtol * (|expected| + max|expected|/10): float rounding of sums
    whose terms are the size of the largest values."""
    expected = np.asarray(expected, np.float64)
    scale = np.abs(expected).max() if expected.size else 1.0
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol,
                               atol=rtol * max(scale, 1e-30) / 10, err_msg=what)


# ---------------------------------------------------------------- forward

GEOMETRIES = {
    "3x3 official": (DCNv4Options(group=2, group_channels=8), 2, 6, 7),
    "5x3 stride dilation remove_center scale": (
        DCNv4Options(kernel_h=5, kernel_w=3, stride_h=2, stride_w=1, pad_h=2, pad_w=0, dilation_h=1,
                dilation_w=2, group=3, group_channels=6, offset_scale=0.5, remove_center=True), 1, 9, 8),
    "2x4 even kernel stride 3 dilation 2": (
        DCNv4Options(kernel_h=2, kernel_w=4, stride_h=3, stride_w=2, pad_h=3, pad_w=1, dilation_h=2,
                dilation_w=2, group=1, group_channels=12, offset_scale=2.0, remove_center=True), 3, 7, 10),
    "7x7 odd batch": (DCNv4Options(kernel_h=7, kernel_w=7, pad_h=3, pad_w=3, group=2, group_channels=4), 3, 5, 6),
    "1x1 many groups": (DCNv4Options(kernel_h=1, kernel_w=1, pad_h=0, pad_w=0, group=5, group_channels=3), 2, 4, 5),
}


@pytest.mark.parametrize("name", GEOMETRIES)
def test_forward_matches_reference(device, name):
    o, n, H, W = GEOMETRIES[name]
    x, om = make_inputs(o, n, H, W, extra_p=5)  # P beyond the official padding is ignored
    out = dcnv4(x, om, **call_opts(o), device=device)
    assert out.dtype == np.float32 and out.shape == (n, *o.out_size(H, W), x.shape[3])
    assert_close(out, reference(x, om, o), 1e-5, name)


CONFIGS = [cfg for _, cfg in LADDER] + [
    DCNv4Config(16, 16), DCNv4Config(16, 4), DCNv4Config(4, 2, reuse=False), DCNv4Config(2, 1),
    DCNv4Config(16, 8, work_group_size=1), DCNv4Config(8, 8, work_group_size=64),
    DCNv4Config(8, 4, interleave=True), DCNv4Config(4, 2, interleave=True, prefetch=True),
    DCNv4Config(16, 8, prefetch=True), DCNv4Config(8, 4, prefetch=True, tile_rows=2, tile_cols=4),
    DCNv4Config(16, 8, tile_rows=3, tile_cols=2, work_group_size=32)]


def test_cpu_vectors_wider_than_the_compiler_takes_are_refused(device):
    if (device.info.widest_vector("float") or 16) >= 16:
        pytest.skip("needs a CPU device whose compiler takes fewer than 16 floats per vector")
    o = DCNv4Options(group=2, group_channels=16)
    x, om = make_inputs(o, 1, 5, 5)
    with pytest.raises(ValueError, match="config.vector_width=16: this CPU device compiles vectors of at most"):
        dcnv4(x, om, **call_opts(o), device=device, config=DCNv4Config(16, 16))


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=str)
def test_every_kernel_variant_matches_reference(device, cfg, dtype):
    widest = device.info.widest_vector("float")
    if widest is not None and cfg.vector_width > widest:
        # the widest vectors this CPU's compiler takes (wider ones are refused: test below)
        cfg = dataclasses.replace(cfg, vector_width=widest)
    o = DCNv4Options(kernel_h=3, kernel_w=3, stride_h=2, stride_w=1, dilation_h=2, group=2,
                group_channels=16, offset_scale=0.75)
    x, om = make_inputs(o, 2, 7, 9, dtype=dtype)
    out = dcnv4(x, om, **call_opts(o), device=device, config=cfg)
    assert out.dtype == dtype
    if dtype == BF16:       # the reference rounded to bfloat16, to one unit in the last place
        return assert_bf16_close(out, reference(x, om, o))
    # float16: the inputs are exact in float64; the output's own rounding is 2^-11 relative.
    assert_close(out, reference(x, om, o), 1e-5 if dtype == np.float32 else 1e-3)


def test_far_nan_and_infinite_offsets_count_as_outside(device):
    o = DCNv4Options(group=2, group_channels=4)
    x, om = make_inputs(o, 1, 5, 6)
    rng = np.random.default_rng(3)
    bad = rng.random(om.shape) < 0.3
    bad[..., o.group * o.taps * 3:] = False
    values = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e9, -2.5e9], np.float32)
    is_offset = (np.arange(om.shape[3]) % (3 * o.taps)) < 2 * o.taps
    om = np.where(bad & is_offset, rng.choice(values, om.shape), om).astype(np.float32)
    out = dcnv4(x, om, **call_opts(o), device=device)
    expected = reference(x, om, o)
    assert np.isfinite(out).all()
    assert_close(out, expected, 1e-5)


def test_zero_batch_and_device_arrays(device):
    o = DCNv4Options(group=2, group_channels=8)
    x, om = make_inputs(o, 0, 4, 4)
    assert dcnv4(x, om, **call_opts(o), device=device).shape == (0, 4, 4, 16)
    g_in, g_om = dcnv4_backward(x, x, om, **call_opts(o), device=device)
    assert g_in.shape == x.shape and g_om.shape == om.shape
    x, om = make_inputs(o, 1, 4, 5)
    dx, dom = cla.to_device(device.queue, x), cla.to_device(device.queue, om)
    out = dcnv4(dx, dom, **call_opts(o), device=device)
    assert isinstance(out, cla.Array)
    assert_close(out.get(), reference(x, om, o), 1e-5)
    g_in, g_om = dcnv4_backward(out, dx, dom, **call_opts(o), device=device)
    assert isinstance(g_in, cla.Array) and isinstance(g_om, cla.Array)


# ---------------------------------------------------------------- backward

BACKWARD_CASES = {
    "owner, whole group per work-item": (DCNv4Config(6, 2, scatter="owner"), np.float32),
    "owner, channel runs + partial sums": (DCNv4Config(2, 2, scatter="owner"), np.float32),
    "atomic, one slot": (DCNv4Config(6, 2, scatter="atomic"), np.float32),
    "atomic, 3 slots padded to 4, local reduction": (DCNv4Config(2, 2, scatter="atomic"), np.float32),
    "atomic, 6 slots": (DCNv4Config(1, 1, scatter="atomic", work_group_size=8), np.float32),
    "fixed, one slot": (DCNv4Config(6, 2, scatter="fixed"), np.float32),
    "fixed, 3 slots padded to 4, local reduction": (DCNv4Config(2, 2, scatter="fixed"), np.float32),
    "fixed, 6 slots": (DCNv4Config(1, 1, scatter="fixed", work_group_size=8), np.float32),
    "gather, margin 1": (DCNv4Config(2, 2, scatter="gather"), np.float32),
    "gather, margin 0: far taps in fixed point": (DCNv4Config(2, 2, scatter="gather", gather_margin=0), np.float32),
    "gather, 2 channels per gathering item, 6 slots": (DCNv4Config(1, 1, scatter="gather", gather_channels=2), np.float32),
    "device default": (None, np.float32),
    "half, owner": (DCNv4Config(3, 1, scatter="owner"), np.float16),
    "half, atomic": (DCNv4Config(2, 2, scatter="atomic"), np.float16),
    "half, fixed": (DCNv4Config(2, 2, scatter="fixed"), np.float16),
    "bfloat16, fixed": (DCNv4Config(2, 2, scatter="fixed"), BF16),
    "half, gather": (DCNv4Config(2, 2, scatter="gather", gather_margin=0), np.float16),
    "bfloat16, gather": (DCNv4Config(2, 2, scatter="gather"), BF16),
    "bfloat16, owner": (DCNv4Config(3, 1, scatter="owner"), BF16),
    "bfloat16, owner, channel runs": (DCNv4Config(2, 2, scatter="owner"), BF16),
    "bfloat16, atomic": (DCNv4Config(2, 2, scatter="atomic"), BF16),
}


@pytest.fixture(scope="module")
def backward_problem():
    o = DCNv4Options(kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1, pad_w=1, dilation_h=1,
                dilation_w=2, group=2, group_channels=6, offset_scale=0.7, remove_center=True)
    x, om = make_inputs(o, 2, 5, 6, spread=1.5, extra_p=3, seed=7)
    rng = np.random.default_rng(8)
    go = rng.standard_normal((2, *o.out_size(5, 6), 12)).astype(np.float32)
    return o, x, om, go, central_differences(x, om, go, o)


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_matches_central_differences(device, backward_problem, case):
    cfg, dtype = BACKWARD_CASES[case]
    o, x, om, go, (g_x, g_om) = backward_problem
    if dtype != np.float32:
        # Central differences of the very values the kernel sees.
        x, om, go = (a.astype(dtype) for a in (x, om, go))
        g_x, g_om = central_differences(x, om, go, o)
    g_in, g_offset_mask = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
    assert g_in.dtype == dtype and g_offset_mask.dtype == dtype
    assert g_in.shape == x.shape and g_offset_mask.shape == om.shape
    if dtype == BF16:
        # bfloat16 offsets are coarse enough that some taps sit exactly on the pixel grid,
        # where the offset gradient is one side's derivative: either side's is accepted.
        _, g_om_right = central_differences(x, om, go, o, sides=(1, 0))
        _, g_om_left = central_differences(x, om, go, o, sides=(0, -1))
        assert_bf16_close(g_in, g_x, 1e-4, "input gradient")
        assert_bf16_close(g_offset_mask, g_om_right, 1e-4, "offset/mask gradient", also=g_om_left)
        assert not np.any(g_offset_mask[..., o.group * o.taps * 3:].astype(np.float32))
        return
    rtol = 1e-4 if dtype == np.float32 else 2e-3
    assert_close(g_in, g_x, rtol, "input gradient")
    assert_close(g_offset_mask, g_om, rtol, "offset/mask gradient")
    assert not np.any(g_offset_mask[..., o.group * o.taps * 3:])  # padding tail


@pytest.mark.oclgrind
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_wide_gather_of_16_bit_storage_matches_central_differences(device, dtype):
    """The GPU default for 16-bit storage at 32 channels per group (backward_config): 16 channels
    per work-item in vectors of 8, 32 per gathering work-item, against central differences of
    the values the kernel sees."""
    o = DCNv4Options(group=2, group_channels=32, offset_scale=0.7)
    x, om = make_inputs(o, 1, 4, 5, spread=1.5, seed=11)
    go = np.random.default_rng(12).standard_normal((1, 4, 5, 64)).astype(np.float32)
    x, om, go = (a.astype(dtype) for a in (x, om, go))
    cfg = DCNv4Config(16, 8, scatter="gather", gather_channels=32)
    g_in, g_om = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
    if dtype == BF16:
        g_x, g_om_right = central_differences(x, om, go, o, sides=(1, 0))
        _, g_om_left = central_differences(x, om, go, o, sides=(0, -1))
        assert_bf16_close(g_in, g_x, 1e-4, "input gradient")
        assert_bf16_close(g_om, g_om_right, 1e-4, "offset/mask gradient", also=g_om_left)
    else:
        g_x, g_om_ref = central_differences(x, om, go, o)
        assert_close(g_in, g_x, 2e-3, "input gradient")
        assert_close(g_om, g_om_ref, 2e-3, "offset/mask gradient")
    again = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
    np.testing.assert_array_equal(again[0], g_in)
    np.testing.assert_array_equal(again[1], g_om)


def test_deterministic_gradients(device, backward_problem):
    """Offset/mask gradients are reduced in a fixed order on every path; the owner and fixed
    paths' input gradient too. (The atomic path's input gradient may differ in its last bits.)"""
    o, x, om, go, _ = backward_problem
    for cfg in (DCNv4Config(2, 2, scatter="owner"), DCNv4Config(1, 1, scatter="atomic"),
                DCNv4Config(1, 1, scatter="fixed"), DCNv4Config(1, 1, scatter="gather", gather_margin=0)):
        runs = [dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg) for _ in range(3)]
        for g_in, g_om in runs[1:]:
            np.testing.assert_array_equal(g_om, runs[0][1])
            if cfg.scatter != "atomic":
                np.testing.assert_array_equal(g_in, runs[0][0])


def input_gradient_float64(x, om, go, o: DCNv4Options):
    """d sum(go * reference) / d x exactly (float64), written from the definition as the
    transpose of the sampling: each tap's corner coefficient (corner_coefficients) times
    grad_out, added at the corner. The forward is linear in x, so this is its gradient without
    differencing."""
    go = np.asarray(go, np.float64)
    n, H, W, _ = np.shape(x)
    G, C = o.group, o.group_channels
    g_x = np.zeros((n, H, W, G, C))
    gog = go.reshape(*go.shape[:3], G, C)
    for g, cy, cx, coef, inside in corner_coefficients(om, o, H, W):
        for b in range(n):
            at = inside[b]
            np.add.at(g_x[b, :, :, g], (cy[b][at], cx[b][at]), coef[b][at][:, None] * gog[b][at][:, g])
    return g_x.reshape(np.shape(x))


@pytest.mark.parametrize("cfg", [DCNv4Config(2, 2, scatter="fixed"),
                                 DCNv4Config(2, 2, scatter="gather", gather_margin=0)], ids=["fixed", "gather"])
@pytest.mark.parametrize("magnitude", [1.0, 1e30, 1e-30], ids=["unit", "1e30", "1e-30"])
def test_fixed_point_input_gradient_at_any_scale(device, magnitude, cfg):
    """The fixed-point scale follows the data: grad_out at 1e30 or 1e-30 keeps the input
    gradient's relative accuracy, against the exact float64 transpose. Many taps land on the
    same pixels here (offsets of +-0.6 around a 5x5 kernel on a 6x6 input); with the gather at
    margin 0 about half of them are far ones, in fixed point."""
    o = DCNv4Options(kernel_h=5, kernel_w=5, pad_h=2, pad_w=2, group=2, group_channels=4, offset_scale=1.0)
    x, om = make_inputs(o, 2, 6, 6, spread=0.6, seed=11)
    go = (np.random.default_rng(12).standard_normal((2, 6, 6, 8)) * magnitude).astype(np.float32)
    exact = input_gradient_float64(x, om, go, o)
    g_in, _ = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
    assert np.all(np.isfinite(g_in))
    # fixed: float32 products (one rounding each) summed exactly, one rounding at the end;
    # gather: the near taps' terms are a float sum, as on the owner path.
    assert_close(g_in, exact, 2e-6 if cfg.scatter == "fixed" else 1e-5, f"{cfg.scatter} input gradient")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=str)
def test_fixed_point_non_finite_terms(device, dtype):
    """NaN and infinite grad_out or masks, and products past float's range, reach exactly the
    input-gradient entries they reach on the float (owner) path: the fixed-point sums hand
    such terms to a float side buffer (the float32 output itself, or a temporary with 16-bit
    storage), where their sum does not depend on the order; the gather (margin 0: taps both
    near and far) sums near ones in float, in one order."""
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.8)
    x, om = make_inputs(o, 2, 4, 5, spread=1.5, seed=13, dtype=dtype)
    go = np.random.default_rng(14).standard_normal((2, 4, 5, 8)).astype(dtype)
    cases = {"nan grad_out": (go.copy(), om.copy()), "inf grad_out": (go.copy(), om.copy()),
             "inf mask": (go.copy(), om.copy())}
    cases["nan grad_out"][0][0, 1, 1, 2] = np.nan
    cases["inf grad_out"][0][1, 2, 3, 5] = -np.inf
    cases["inf mask"][1][0, 2, 2, 18 + 3] = np.inf          # group 0's mask of tap 3 (2K = 18)
    if dtype == np.float32:      # (float16's largest value, 65504, times a mask stays within float's range)
        cases["overflowing product"] = (go.copy(), om.copy())
        cases["overflowing product"][0][1, 0, 0, :] = 3e38
        cases["overflowing product"][1][1, 0, 0, 18:27] = 1e3
    for name, (g, m) in cases.items():
        owner, _ = dcnv4_backward(g, x, m, **call_opts(o), device=device, config=DCNv4Config(4, 4, scatter="owner"))
        for cfg in (DCNv4Config(2, 2, scatter="fixed"), DCNv4Config(2, 2, scatter="gather", gather_margin=0)):
            fixed, _ = dcnv4_backward(g, x, m, **call_opts(o), device=device, config=cfg)
            for test in (np.isnan, np.isposinf, np.isneginf):
                np.testing.assert_array_equal(test(fixed), test(owner), err_msg=f"{name} {cfg.scatter}: {test.__name__}")
            assert np.any(~np.isfinite(fixed)), name
            finite = np.isfinite(owner)
            assert_close(fixed[finite], owner[finite], 1e-5 if dtype == np.float32 else 2e-3, f"{name} {cfg.scatter}")


def test_backward_default_scatter_per_device():
    """Deterministic by default: the gather (fixed point for far taps) on GPUs with 64-bit atomics, the owner scatter on
    CPUs and on GPUs without them; deterministic=False keeps the gather (the faster, measured) and lets GPUs without
    64-bit atomics use float atomics."""
    from clkernels.dcnv4 import backward_config
    gpu = dataclasses.replace(clkernels.get_runtime().info, is_cpu=False, int64_atomics=True)
    assert backward_config(gpu, 32, np.float32).scatter == "gather"
    assert backward_config(gpu, 32, np.float32, deterministic=False) == backward_config(gpu, 32, np.float32)
    no64 = dataclasses.replace(gpu, int64_atomics=False)
    assert backward_config(no64, 32, np.float32).scatter == "owner"
    assert backward_config(no64, 32, np.float32, deterministic=False).scatter == "atomic"
    cpu = dataclasses.replace(gpu, is_cpu=True)
    assert backward_config(cpu, 32, np.float32).scatter == "owner"
    assert backward_config(cpu, 32, np.float32, deterministic=False).scatter == "owner"
    o = DCNv4Options(group=1, group_channels=4)
    x, om = make_inputs(o, 1, 3, 3)
    # The forward's load pattern: float32 on GPUs prefetches (3x3 kernels, where measured),
    # from 64 channels per group interleaved in 16-byte chunks; 16-bit storage and CPUs neither.
    from clkernels.dcnv4 import forward_config
    assert forward_config(gpu, 32, np.float32).prefetch and not forward_config(gpu, 32, np.float32).interleave
    wide = forward_config(gpu, 64, np.float32)
    assert (wide.interleave, wide.prefetch, wide.vector_width) == (True, True, 4)
    assert not forward_config(gpu, 32, np.float32, taps=25).prefetch
    assert not forward_config(gpu, 32, np.float16).prefetch
    assert not forward_config(cpu, 32, np.float32).prefetch
    # The gather prefetches in float32 (3x3 kernels), not with 16-bit storage (measured slower).
    assert backward_config(gpu, 32, np.float32).prefetch
    assert not backward_config(gpu, 32, np.float32, taps=25).prefetch
    assert not backward_config(gpu, 32, np.float16).prefetch
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        dcnv4_backward(x, x, om, **call_opts(o), deterministic=1)


# ---------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    o = DCNv4Options(group=2, group_channels=8)
    x, om = make_inputs(o, 1, 5, 5)
    kw = call_opts(o)
    with pytest.raises(ValueError, match="offset_mask has 40 channels, too few .* 54"):
        dcnv4(x, om[..., :40], **kw)
    with pytest.raises(ValueError, match="input has 16 channels but group\\*group_channels"):
        dcnv4(x, om, **{**kw, "group_channels": 4})
    with pytest.raises(ValueError, match="output size would be .* increase pad_h"):
        dcnv4(x, om, **{**kw, "kernel_h": 9, "pad_h": 0})
    with pytest.raises(TypeError, match="offset_mask has dtype float16"):
        dcnv4(x, om.astype(np.float16), **kw)
    with pytest.raises(TypeError, match="input has dtype float64"):
        dcnv4(x.astype(np.float64), om, **kw)
    with pytest.raises(ValueError, match="offset_mask has shape"):
        dcnv4(x, om[:, :4], **kw)
    with pytest.raises(ValueError, match="stride_h must be >= 1"):
        dcnv4(x, om, **{**kw, "stride_h": 0})
    with pytest.raises(ValueError, match="channels_per_item=3 must divide"):
        dcnv4(x, om, **kw, config=DCNv4Config(3, 1))
    with pytest.raises(ValueError, match="grad_out has shape"):
        dcnv4_backward(x[:, :4], x, om, **kw)
    with pytest.raises(ValueError, match="remove_center=True with a 1x1 kernel"):
        dcnv4(x, om, **{**kw, "kernel_h": 1, "kernel_w": 1, "remove_center": True})
    with pytest.raises(ValueError, match="config.interleave and config.prefetch do not apply to scatter='owner'"):
        dcnv4_backward(x, x, om, **kw, config=DCNv4Config(4, 2, scatter="owner", prefetch=True))
    with pytest.raises(ValueError, match="config.interleave and config.prefetch do not apply to scatter='owner'"):
        dcnv4_backward(x, x, om, **kw, config=DCNv4Config(4, 2, scatter="owner", interleave=True))
    with pytest.raises(TypeError, match="interleave"):
        DCNv4Config(4, 2, interleave=1)
    with pytest.raises(ValueError, match="tile_rows=2 and tile_cols=0 must both be 0"):
        DCNv4Config(4, 2, tile_rows=2)
    with pytest.raises(ValueError, match="DCNv4Config.tile_cols must be an integer >= 0"):
        DCNv4Config(4, 2, tile_rows=2, tile_cols=-1)
    with pytest.raises(ValueError, match="config.gather_margin=8: the gather takes margins up to 7"):
        dcnv4_backward(x, x, om, **kw, config=DCNv4Config(2, 2, scatter="gather", gather_margin=8))


# ---------------------------------------------------------------- tiny shapes, also on Oclgrind

@pytest.mark.oclgrind
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=str)
def test_tiny_forward_variants(device, dtype):
    o = DCNv4Options(group=2, group_channels=8, offset_scale=1.5)
    x, om = make_inputs(o, 1, 3, 4, dtype=dtype, spread=2.5)
    om[0, 1, 2, 0] = np.nan
    om[0, 0, 0, 3] = np.inf
    expected = reference(x, om, o)
    for cfg in [cfg for _, cfg in LADDER] + [None, DCNv4Config(8, 4), DCNv4Config(2, 2),
                                             DCNv4Config(4, 2, interleave=True, prefetch=True),
                                             DCNv4Config(4, 2, prefetch=True, tile_rows=2, tile_cols=3)]:
        out = dcnv4(x, om, **call_opts(o), device=device, config=cfg)
        if dtype == BF16:
            assert_bf16_close(out, expected, what=str(cfg))
        else:
            assert_close(out, expected, 1e-5 if dtype == np.float32 else 1e-3, str(cfg))


@pytest.mark.oclgrind
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=str)
def test_tiny_backward_variants(device, dtype):
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.8, stride_w=2)
    x, om = make_inputs(o, 1, 3, 4, dtype=dtype, spread=1.2, extra_p=2, seed=5)
    om[0, 1, 0, 2] = np.nan
    go = np.random.default_rng(6).standard_normal((1, *o.out_size(3, 4), 8)).astype(dtype)
    g_x, g_om = central_differences(x, om, go, o)
    g_om = np.nan_to_num(g_om)  # the NaN tap counts as outside: its gradients are zero
    g_om_sides = [np.nan_to_num(central_differences(x, om, go, o, sides=s)[1]) for s in ((1, 0), (0, -1))] \
        if dtype == BF16 else None
    rtol = 1e-4 if dtype == np.float32 else 2e-3
    for cfg in (DCNv4Config(4, 4, scatter="owner"), DCNv4Config(2, 2, scatter="owner"),
                DCNv4Config(4, 2, scatter="atomic"), DCNv4Config(1, 1, scatter="atomic"),
                DCNv4Config(4, 2, scatter="fixed"), DCNv4Config(1, 1, scatter="fixed"),
                DCNv4Config(2, 2, scatter="gather"), DCNv4Config(1, 1, scatter="gather", gather_margin=0),
                DCNv4Config(2, 1, scatter="gather", interleave=True, prefetch=True),
                DCNv4Config(2, 2, scatter="fixed", prefetch=True)):
        g_in, g_offset_mask = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
        if dtype == BF16:     # (offsets on the pixel grid: either side's derivative, as above)
            assert_bf16_close(g_in, g_x, 1e-4, f"input gradient {cfg}")
            assert_bf16_close(g_offset_mask, g_om_sides[0], 1e-4, f"offset gradient {cfg}", also=g_om_sides[1])
            continue
        assert_close(g_in, g_x, rtol, f"input gradient {cfg}")
        assert_close(g_offset_mask, g_om, rtol, f"offset gradient {cfg}")


@pytest.mark.oclgrind
@pytest.mark.parametrize("scatter", ["owner", "fixed", "gather"])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=str)
def test_deterministic_backward_bits_do_not_depend_on_work_group_size(device, dtype, scatter):
    """The deterministic backwards (owner: CPUs; gather and fixed point: GPUs), 20 runs over
    work-group sizes 1 to 8 and the device's choice: the same bits every time, both gradients.
    The input gradient is even the same for 1, 2 or 4 channels per work-item (integer sums in
    any grouping; the gather's own work-items do not depend on it); the offset gradients'
    channel sums are grouped by that choice, and the gather's margin (0 or 1 here) decides
    which taps are float terms and which fixed-point ones."""
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.8)
    x, om = make_inputs(o, 2, 3, 4, dtype=dtype, spread=1.5, seed=9)
    go = np.random.default_rng(10).standard_normal((2, *o.out_size(3, 4), 8)).astype(dtype)
    first_in, first_om = {}, {}
    for run in range(20):
        cpw = 2 if scatter == "owner" else (1, 2, 4)[run % 3]
        wg = (0, 1, 2, 4, 8)[run % 5]
        if scatter != "owner" and wg and wg < 4 // cpw:
            wg = 0      # a group's slots (4 / cpw of them) share one work-group
        cfg = DCNv4Config(cpw, math.gcd(cpw, 2), scatter=scatter, work_group_size=wg, gather_margin=run % 2)
        g_in, g_om = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
        # The gather's margin decides which taps are float terms and which fixed-point ones.
        variant = cfg.gather_margin if scatter == "gather" else None
        first_in.setdefault(variant, g_in)
        first_om.setdefault(cpw, g_om)
        np.testing.assert_array_equal(g_in.view(np.uint8), first_in[variant].view(np.uint8), err_msg=str(cfg))
        np.testing.assert_array_equal(g_om.view(np.uint8), first_om[cpw].view(np.uint8), err_msg=str(cfg))
    assert len(first_om) == (1 if scatter == "owner" else 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=str)
def test_interleaved_channels_give_the_same_bits(device, dtype):
    """interleave and prefetch change which work-item loads what and when, not any channel's
    arithmetic: the forward's bits are those of the contiguous layout, and so is the
    deterministic backward's input gradient (its sums do not depend on who adds a term);
    prefetch alone keeps the offset gradients' bits too (the same sums in the same order),
    at every gather margin and a stride above 1."""
    o = DCNv4Options(group=2, group_channels=16, offset_scale=1.25, stride_h=2, pad_w=2)
    x, om = make_inputs(o, 2, 6, 7, dtype=dtype, spread=2.0, seed=21)
    plain = dcnv4(x, om, **call_opts(o), device=device, config=DCNv4Config(8, 4))
    # Tiles change which work-item takes which pixel: tiles that divide the output, that do not
    # (edge tiles part empty), wider and taller than it, one pixel.
    tiles = [dict(tile_rows=r, tile_cols=c) for r, c in ((1, 1), (2, 2), (2, 3), (4, 8), (5, 1))]
    for cfg in (DCNv4Config(8, 4, interleave=True), DCNv4Config(8, 2, interleave=True, prefetch=True),
                DCNv4Config(4, 4, prefetch=True), DCNv4Config(16, 4, interleave=True),
                *(DCNv4Config(8, 4, prefetch=True, **t) for t in tiles),
                DCNv4Config(16, 8, interleave=False, work_group_size=8, **tiles[2])):
        out = dcnv4(x, om, **call_opts(o), device=device, config=cfg)
        np.testing.assert_array_equal(out.view(np.uint8), plain.view(np.uint8), err_msg=str(cfg))
    if not device.info.int64_atomics:
        return
    go = np.random.default_rng(22).standard_normal(plain.shape).astype(dtype)
    for scatter in ("gather", "fixed"):
        g_plain, _ = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=DCNv4Config(8, 4, scatter=scatter))
        g_inter, _ = dcnv4_backward(go, x, om, **call_opts(o), device=device,
                                    config=DCNv4Config(8, 4, scatter=scatter, interleave=True))
        np.testing.assert_array_equal(g_inter.view(np.uint8), g_plain.view(np.uint8), err_msg=scatter)
        for margin in (0, 1, 2):
            cfg = DCNv4Config(8, 4, scatter=scatter, gather_margin=margin)
            plain_both = dcnv4_backward(go, x, om, **call_opts(o), device=device, config=cfg)
            ahead = dcnv4_backward(go, x, om, **call_opts(o), device=device,
                                   config=dataclasses.replace(cfg, prefetch=True))
            for a, p in zip(ahead, plain_both):
                np.testing.assert_array_equal(a.view(np.uint8), p.view(np.uint8), err_msg=str(cfg))


# ---------------------------------------------------------------- vendor paths and wrappers

def test_nvidia_inline_ptx_falls_back_where_refused(device):
    """Another vendor's compiler refuses NVIDIA's inline PTX: the launcher must then build
    the portable variant and still compute the right result."""
    if device.info.vendor == "nvidia" or device.info.is_simulator:
        pytest.skip("needs a non-NVIDIA compiler to refuse the PTX")
    fake = dataclasses.replace(device.info, vendor="nvidia")
    o = DCNv4Options(group=1, group_channels=8)
    x, om = make_inputs(o, 1, 4, 4, dtype=np.float16)
    dx, dom = cla.to_device(device.queue, x), cla.to_device(device.queue, om)
    out = cla.empty(device.queue, x.shape, np.float16)
    saved = dict(dcnv4_module._ptx_refused)
    try:
        with pytest.warns(UserWarning, match="refused inline PTX"):
            dcnv4_module.enqueue_forward(device, dx, dom, o, DCNv4Config(8, 8), out=out, info=fake)
        assert_close(out.get(), reference(x, om, o), 1e-3)
    finally:
        dcnv4_module._ptx_refused.clear()
        dcnv4_module._ptx_refused.update(saved)


def test_package_attribute_stays_the_function():
    first = clkernels.dcnv4
    assert clkernels.dcnv4 is first is dcnv4


def test_torch_autograd_wrapper(device):
    torch = pytest.importorskip("torch")
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.5)
    x, om = make_inputs(o, 1, 4, 5, seed=11)
    go = np.random.default_rng(12).standard_normal((1, 4, 5, 8)).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    tom = torch.tensor(om, requires_grad=True)
    out = dcnv4_module.torch_dcnv4(tx, tom, device=device, **call_opts(o))
    assert_close(out.detach().numpy(), reference(x, om, o), 1e-5)
    out.backward(torch.tensor(go))
    g_x, g_om = central_differences(x, om, go, o)
    assert_close(tx.grad.numpy(), g_x, 1e-4)
    assert_close(tom.grad.numpy(), g_om, 1e-4)


def test_torch_bfloat16_tensors(device):
    """torch.bfloat16 tensors in and out, the same bits as the ml_dtypes path, gradients too."""
    torch = pytest.importorskip("torch")
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.5)
    x, om = make_inputs(o, 1, 4, 5, seed=11, dtype=BF16)
    go = np.random.default_rng(12).standard_normal((1, 4, 5, 8)).astype(BF16)
    as_torch = lambda a: torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)  # noqa: E731
    tx, tom = as_torch(x).requires_grad_(), as_torch(om).requires_grad_()
    out = dcnv4_module.torch_dcnv4(tx, tom, device=device, **call_opts(o))
    assert out.dtype == torch.bfloat16
    want = dcnv4(x, om, **call_opts(o), device=device)
    np.testing.assert_array_equal(out.detach().view(torch.int16).numpy(), want.view(np.int16))
    out.backward(as_torch(go))
    g_in, g_om = dcnv4_backward(go, x, om, **call_opts(o), device=device)
    np.testing.assert_array_equal(tx.grad.view(torch.int16).numpy(), g_in.view(np.int16))
    np.testing.assert_array_equal(tom.grad.view(torch.int16).numpy(), g_om.view(np.int16))
