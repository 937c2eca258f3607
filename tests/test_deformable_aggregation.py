"""Sparse4D deformable aggregation against a numpy reference written from the operator's
definition, and its backward against central differences of that reference. Every test
uses small shapes and is marked ``oclgrind``, so all of them also run on the simulator."""
import numpy as np
import pyopencl.array as cla
import pytest

import clkernels
from clkernels.deformable_aggregation import AggregationConfig

from bf16 import BF16, assert_bf16_close

SPECIAL = np.array([0.0, 1.0, 2.0**-24, 1.0 - 2.0**-24, 0.5, -0.05, 1.05, np.nan, np.inf, -np.inf],
                   dtype=np.float32)


# ----------------------------------------------------------------------------- reference

def reference(feat, shape, start, loc, weights):
    """The operator from its definition, in float64, one sample at a time."""
    feat, loc, weights = (np.asarray(a, np.float64) for a in (feat, loc, weights))
    bs, _, C = feat.shape
    _, A, P, cams, _ = loc.shape
    S, G = shape.shape[1], weights.shape[-1]
    group = np.arange(C) // (C // G)
    out = np.zeros((bs, A, C))
    for b, a, p, k in np.ndindex(bs, A, P, cams):
        x, y = loc[b, a, p, k]
        if not (0 < x < 1 and 0 < y < 1):  # NaN fails both tests too
            continue
        for s in range(S):
            H, W = int(shape[k, s, 0]), int(shape[k, s, 1])
            h, w = y * H - 0.5, x * W - 0.5
            h0, w0 = int(np.floor(h)), int(np.floor(w))
            lh, lw = h - h0, w - w0
            value = np.zeros(C)
            for dy, dx, c in ((0, 0, (1 - lh) * (1 - lw)), (0, 1, (1 - lh) * lw),
                              (1, 0, lh * (1 - lw)), (1, 1, lh * lw)):
                if 0 <= h0 + dy < H and 0 <= w0 + dx < W:  # corners outside read zero
                    value += c * feat[b, start[k, s] + (h0 + dy) * W + w0 + dx]
            out[b, a] += weights[b, a, p, k, s, group] * value
    return out


def central_difference(grad_out, args, which, step):
    """d sum(grad_out * reference(*args)) / d args[which], element by element."""
    args = [np.array(a, np.float64) if i in (0, 3, 4) else a for i, a in enumerate(args)]
    x = args[which]
    grad = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        keep = x[i]
        x[i] = keep + step
        up = np.sum(grad_out * reference(*args))
        x[i] = keep - step
        down = np.sum(grad_out * reference(*args))
        x[i] = keep
        grad[i] = (up - down) / (2 * step)
    return grad


def problem(rng, bs=2, A=3, P=2, cams=2, C=8, G=2, maps=((4, 5), (2, 3)), dtype=np.float32,
            special=True):
    """Random features in the feature_maps_format layout, built here by hand; locations
    uniform in [-0.1, 1.1], part of them replaced by the special values."""
    sizes = [H * W for H, W in maps]
    per_cam = sum(sizes)
    shape = np.array([list(maps)] * cams, dtype=np.int32).reshape(cams, len(maps), 2)
    start = np.array([[k * per_cam + sum(sizes[:s]) for s in range(len(maps))]
                      for k in range(cams)], dtype=np.int32).reshape(cams, len(maps))
    feat = rng.standard_normal((bs, cams * per_cam, C)).astype(dtype)
    loc = rng.uniform(-0.1, 1.1, (bs, A, P, cams, 2)).astype(np.float32)
    if special:
        pick = rng.random(loc.shape) < 0.4
        loc[pick] = rng.choice(SPECIAL, pick.sum())
    weights = rng.standard_normal((bs, A, P, cams, len(maps), G)).astype(dtype)
    return feat, shape, start, loc, weights


def smooth_locations(rng, loc, shape, margin=0.02):
    """Redraw locations inside (0, 1) until every scale's pixel position is at least
    ``margin`` pixels from an integer (where bilinear sampling has kinks) and from 0 and 1."""
    loc = loc.copy()
    for idx in np.ndindex(*loc.shape[:4]):
        k = idx[3]
        while True:
            x, y = (float(v) for v in loc[idx])
            ok = margin < x < 1 - margin and margin < y < 1 - margin
            for H, W in shape[k]:
                for t in (np.float32(y) * np.float32(H) - 0.5, np.float32(x) * np.float32(W) - 0.5):
                    ok &= abs(t - round(t)) > margin
            if ok:
                break
            loc[idx] = rng.uniform(0, 1, 2).astype(np.float32)
    return loc


def _default(device, direction):
    import importlib
    return importlib.import_module("clkernels.deformable_aggregation").default_config(device.info, 8, 2, direction)


def tolerance(ref, rel):
    return dict(rtol=rel, atol=rel * max(1.0, float(np.abs(ref).max())))


CONFIGS = [None, AggregationConfig(cpt=1, vec=1), AggregationConfig(cpt=4, vec=2), AggregationConfig(cpt=2, vec=1, interleave=True),
           AggregationConfig(cpt=2, vec=2, split=4, local_size=64)]


# ----------------------------------------------------------------------------- forward

@pytest.mark.oclgrind
@pytest.mark.parametrize("variant,config", [("optimized", None), ("optimized", CONFIGS[4]),
                                            ("original", None)])
def test_forward_tiny(device, variant, config):
    rng = np.random.default_rng(1)
    args = problem(rng, bs=1, A=2, P=2, cams=2, C=8, G=2, maps=((3, 4), (2, 2)))
    out = clkernels.deformable_aggregation(*args, device=device, variant=variant, config=config)
    assert out.dtype == np.float32 and out.shape == (1, 2, 8)
    ref = reference(*args)
    np.testing.assert_allclose(out, ref, **tolerance(ref, 1e-5))


@pytest.mark.oclgrind
@pytest.mark.parametrize("config", CONFIGS)
def test_forward_matches_reference(device, config):
    rng = np.random.default_rng(2)
    args = problem(rng, bs=2, A=5, P=3, cams=3, C=16, G=2, maps=((5, 7), (3, 4), (1, 2)))
    ref = reference(*args)
    out = clkernels.deformable_aggregation(*args, device=device, config=config)
    np.testing.assert_allclose(out, ref, **tolerance(ref, 1e-5))
    # Same configuration, same bits: the forward is a gather in a fixed order.
    np.testing.assert_array_equal(out, clkernels.deformable_aggregation(*args, device=device, config=config))


@pytest.mark.oclgrind
def test_original_design_matches_reference(device):
    rng = np.random.default_rng(3)
    args = problem(rng, bs=2, A=4, P=3, cams=2, C=12, G=3, maps=((4, 6), (2, 3)))
    ref = reference(*args)
    out = clkernels.deformable_aggregation(*args, device=device, variant="original")
    np.testing.assert_allclose(out, ref, **tolerance(ref, 1e-5))


@pytest.mark.oclgrind
def test_special_locations_one_by_one(device):
    """Each special value alone in x or y: exactly 0 and 1, NaN and Inf add nothing; values
    just inside add a sample whose outside corners read zero."""
    rng = np.random.default_rng(4)
    feat, shape, start, _, weights = problem(rng, bs=1, A=1, P=1, cams=1, C=4, G=1, maps=((3, 5),))
    for value in SPECIAL:
        for axis in (0, 1):
            loc = np.full((1, 1, 1, 1, 2), 0.37, np.float32)
            loc[..., axis] = value
            out = clkernels.deformable_aggregation(feat, shape, start, loc, weights, device=device)
            ref = reference(feat, shape, start, loc, weights)
            inside = 0 < value < 1
            assert np.any(ref != 0) == inside, value
            np.testing.assert_allclose(out, ref, **tolerance(ref, 1e-6))
    # Just inside the corner: only the single pixel (0, 0), with weight 1/4 and the rest zero.
    loc = np.full((1, 1, 1, 1, 2), 2.0**-24, np.float32)
    out = clkernels.deformable_aggregation(feat, shape, start, loc, weights, device=device)
    np.testing.assert_allclose(out[0, 0], 0.25 * weights[0, 0, 0, 0, 0, 0] * feat[0, 0], rtol=1e-5)


@pytest.mark.oclgrind
def test_half_storage(device):
    """float16 features and weights, float accumulation: within the half rounding of the
    result (relative 2**-11) of the float64 reference computed from the same half values."""
    rng = np.random.default_rng(5)
    args = problem(rng, bs=2, A=4, P=3, cams=2, C=16, G=4, maps=((4, 6), (2, 3)), dtype=np.float16)
    ref = reference(*args)
    out = clkernels.deformable_aggregation(*args, device=device)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=2.0**-10, atol=1e-5)
    mixed = (args[0], args[1], args[2], args[3], args[4].astype(np.float32))
    out = clkernels.deformable_aggregation(*mixed, device=device, variant="original")
    np.testing.assert_allclose(out.astype(np.float64), reference(*mixed), rtol=2.0**-10, atol=1e-5)


@pytest.mark.oclgrind
def test_bfloat16_storage(device):
    """bfloat16 features and weights (ml_dtypes), float accumulation: the float64 reference of
    the same bfloat16 values rounded to bfloat16, to one unit in the last place; both variants,
    and with float32 weights."""
    rng = np.random.default_rng(5)
    args = problem(rng, bs=2, A=4, P=3, cams=2, C=16, G=4, maps=((4, 6), (2, 3)), dtype=BF16)
    for variant in ("optimized", "original"):
        assert_bf16_close(clkernels.deformable_aggregation(*args, device=device, variant=variant),
                          reference(*args), what=variant)
    mixed = (args[0], args[1], args[2], args[3], args[4].astype(np.float32))
    assert_bf16_close(clkernels.deformable_aggregation(*mixed, device=device), reference(*mixed), what="mixed")


@pytest.mark.oclgrind
def test_device_arrays_in_device_arrays_out(device):
    rng = np.random.default_rng(6)
    args = problem(rng)
    dev = [cla.to_device(device.queue, np.ascontiguousarray(a)) for a in args]
    out = clkernels.deformable_aggregation(*dev, device=device)
    assert isinstance(out, cla.Array)
    np.testing.assert_array_equal(out.get(), clkernels.deformable_aggregation(*args, device=device))
    go = cla.to_device(device.queue, rng.standard_normal(out.shape).astype(np.float32))
    grads = clkernels.deformable_aggregation_backward(go, *dev, device=device)
    assert all(isinstance(g, cla.Array) for g in grads)


# ----------------------------------------------------------------------------- backward

def _check_backward(device, args, go, variant, config, rel):
    g_feat, g_loc, g_w = clkernels.deformable_aggregation_backward(
        go, *args, device=device, variant=variant, config=config)
    ref_w = central_difference(go, list(args), 4, 1.0)        # linear in the weights and
    ref_feat = central_difference(go, list(args), 0, 1.0)     # features: exact differences
    ref_loc = central_difference(go, list(args), 3, 1e-6)
    on_border = np.any((args[3] == 0) | (args[3] == 1), axis=-1)
    ref_loc[on_border] = 0  # outside by definition; differences there would see the step
    np.testing.assert_allclose(g_feat.astype(np.float64), ref_feat, **tolerance(ref_feat, rel))
    np.testing.assert_allclose(g_w.astype(np.float64), ref_w, **tolerance(ref_w, rel))
    np.testing.assert_allclose(g_loc, ref_loc, **tolerance(ref_loc, max(rel, 1e-4)))
    return g_feat, g_loc, g_w


def _backward_problem(seed, dtype=np.float32, **kw):
    rng = np.random.default_rng(seed)
    feat, shape, start, loc, weights = problem(rng, dtype=dtype, special=False, **kw)
    loc = smooth_locations(rng, loc, shape)
    # A few samples outside, on the border, or NaN: zero gradient, and the differences agree.
    loc[0, 0, 0, 0] = [1.0, 0.5]
    loc[0, -1, 0, -1] = [np.nan, 0.5]
    loc[-1, 0, -1, 0] = [0.5, -0.2]
    go = rng.standard_normal((loc.shape[0], loc.shape[1], feat.shape[2])).astype(dtype)
    return (feat, shape, start, loc, weights), go


@pytest.mark.oclgrind
@pytest.mark.parametrize("variant,config", [("optimized", None), ("optimized", AggregationConfig(cpt=2, interleave=True)),
                                            ("original", None)])
def test_backward_tiny(device, variant, config):
    args, go = _backward_problem(7, bs=1, A=2, P=1, cams=2, C=4, G=2, maps=((3, 3), (1, 2)))
    g_feat, g_loc, g_w = _check_backward(device, args, go, variant, config, 1e-5)
    for g in (g_loc[0, 0, 0, 0], g_loc[0, -1, 0, -1], g_w[0, 0, 0, 0], g_w[0, -1, 0, -1]):
        np.testing.assert_array_equal(g, 0)  # outside and NaN: exactly zero, never NaN


BACKWARD_CONFIGS = [
    ("optimized", None),
    ("optimized", AggregationConfig(cpt=1, vec=1, feature_grad="scatter")),
    ("optimized", AggregationConfig(cpt=2, interleave=True, local_size=32, feature_grad="scatter")),
    ("optimized", AggregationConfig(cpt=4, vec=2, feature_grad="gather", index_size=4, groups_per_item=2)),
    ("optimized", AggregationConfig(cpt=2, interleave=True, feature_grad="gather", index_size=1)),
    ("original", None)]


@pytest.mark.oclgrind
@pytest.mark.parametrize("variant,config", BACKWARD_CONFIGS)
def test_backward_matches_central_differences(device, variant, config):
    args, go = _backward_problem(8, bs=2, A=3, P=2, cams=2, C=8, G=2)
    g_feat, g_loc, g_w = _check_backward(device, args, go, variant, config, 1e-5)
    np.testing.assert_array_equal(g_loc[0, 0, 0, 0], 0)
    # Location and weight gradients are reduced in a fixed order, and the gathered feature
    # gradient sums in sample order: same bits every run.
    again = clkernels.deformable_aggregation_backward(go, *args, device=device, variant=variant, config=config)
    used = config or _default(device, "backward")
    if variant == "optimized":
        np.testing.assert_array_equal(again[1], g_loc)
        np.testing.assert_array_equal(again[2], g_w)
        if used.feature_grad == "gather":
            np.testing.assert_array_equal(again[0], g_feat)


@pytest.mark.oclgrind
@pytest.mark.parametrize("feature_grad", ["scatter", "gather"])
def test_blocks_may_overlap_or_leave_gaps(device, feature_grad):
    """scale_start_index need not tile mc_ms_feat: rows in no block get no gradient, rows in
    two blocks get both contributions."""
    rng = np.random.default_rng(14)
    shape = np.array([[[3, 4], [2, 2]], [[2, 3], [1, 1]]], np.int32)
    start = np.array([[2, 10], [20, 21]], np.int32)  # (0, 0), (0, 1) share rows 10..13; 0, 1, 14..19, 26.. unused
    feat = rng.standard_normal((2, 30, 8)).astype(np.float32)
    loc = smooth_locations(rng, rng.uniform(0, 1, (2, 3, 2, 2, 2)).astype(np.float32), shape)
    weights = rng.standard_normal((2, 3, 2, 2, 2, 2)).astype(np.float32)
    args = (feat, shape, start, loc, weights)
    ref = reference(*args)
    np.testing.assert_allclose(clkernels.deformable_aggregation(*args, device=device), ref, **tolerance(ref, 1e-5))
    go = rng.standard_normal(ref.shape).astype(np.float32)
    g_feat, _, _ = _check_backward(device, args, go, "optimized", AggregationConfig(cpt=2, vec=2, feature_grad=feature_grad), 1e-5)
    np.testing.assert_array_equal(g_feat[:, list(range(2)) + list(range(14, 20)) + list(range(26, 30))], 0)


@pytest.mark.oclgrind
def test_backward_half_storage(device):
    """float16 features, weights and grad_out: half results within their rounding (2**-10
    relative), float32 location gradients within float accumulation."""
    args, go = _backward_problem(9, dtype=np.float16, bs=1, A=3, P=2, cams=2, C=8, G=2)
    for variant, config in (("optimized", AggregationConfig(cpt=2, vec=2, feature_grad="gather")),
                            ("optimized", AggregationConfig(cpt=2, vec=2, feature_grad="scatter")), ("original", None)):
        g = _check_backward(device, args, go, variant, config, 2.0**-10)
        assert g[0].dtype == np.float16 and g[1].dtype == np.float32 and g[2].dtype == np.float16


@pytest.mark.oclgrind
def test_backward_bfloat16_storage(device):
    """bfloat16 features, weights and grad_out: bfloat16 feature and weight gradients, the exact
    differences (linear in both) rounded to bfloat16 to one unit in the last place; float32
    location gradients within float accumulation."""
    args, go = _backward_problem(9, dtype=BF16, bs=1, A=3, P=2, cams=2, C=8, G=2)
    ref_feat = central_difference(go, list(args), 0, 1.0)
    ref_w = central_difference(go, list(args), 4, 1.0)
    ref_loc = central_difference(go, list(args), 3, 1e-6)
    ref_loc[np.any((args[3] == 0) | (args[3] == 1), axis=-1)] = 0
    for variant, config in (("optimized", AggregationConfig(cpt=2, vec=2, feature_grad="gather")),
                            ("optimized", AggregationConfig(cpt=2, vec=2, feature_grad="scatter")), ("original", None)):
        g_feat, g_loc, g_w = clkernels.deformable_aggregation_backward(go, *args, device=device, variant=variant,
                                                                       config=config)
        assert g_loc.dtype == np.float32
        assert_bf16_close(g_feat, ref_feat, what=f"{variant} {config} features")
        assert_bf16_close(g_w, ref_w, what=f"{variant} {config} weights")
        np.testing.assert_allclose(g_loc, ref_loc, **tolerance(ref_loc, 1e-4))


@pytest.mark.oclgrind
def test_gpu_default_configurations(device):
    """The configurations chosen for GPUs (adjacent channels, float4 loads forward; interleaved
    channels and atomics backward) give the same results on whatever device runs the tests."""
    import dataclasses
    import importlib
    gpu = dataclasses.replace(device.info, vendor="nvidia", is_cpu=False, is_simulator=False, type_name="gpu")
    default_config = importlib.import_module("clkernels.deformable_aggregation").default_config
    args, go = _backward_problem(15, bs=1, A=2, P=2, cams=2, C=32, G=4, maps=((3, 4), (2, 2)))
    forward, backward = default_config(gpu, 32, 4, "forward"), default_config(gpu, 32, 4, "backward")
    assert (forward.cpt, forward.vec, backward.interleave, backward.feature_grad) == (4, 4, True, "scatter")
    ref = reference(*args)
    out = clkernels.deformable_aggregation(*args, device=device, config=forward)
    np.testing.assert_allclose(out, ref, **tolerance(ref, 1e-5))
    _check_backward(device, args, go, "optimized", backward, 1e-5)


# ----------------------------------------------------------------------------- formatting

@pytest.mark.oclgrind
def test_feature_maps_format(device):
    rng = np.random.default_rng(10)
    levels = [rng.standard_normal((2, 3, 4, H, W)).astype(np.float32) for H, W in ((3, 5), (2, 2), (1, 3))]
    feat, shape, start = clkernels.feature_maps_format(levels)
    assert feat.shape == (2, 3 * (15 + 4 + 3), 4)
    for k, s, (H, W) in ((k, s, hw) for k in range(3) for s, hw in enumerate(((3, 5), (2, 2), (1, 3)))):
        assert tuple(shape[k, s]) == (H, W)
        assert start[k, s] == k * 22 + (0, 15, 19)[s]
        for b, y, x in np.ndindex(2, H, W):
            np.testing.assert_array_equal(feat[b, start[k, s] + y * W + x], levels[s][b, k, :, y, x])
    for dtype in (np.float16, BF16):
        dev, shape_d, start_d = clkernels.feature_maps_format(
            [cla.to_device(device.queue, l.astype(dtype)) for l in levels], device=device)
        assert isinstance(dev, cla.Array) and dev.dtype == dtype
        np.testing.assert_array_equal(dev.get().view(np.uint16), feat.astype(dtype).view(np.uint16))
    np.testing.assert_array_equal(shape_d, shape)
    np.testing.assert_array_equal(start_d, start)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.oclgrind
def test_bad_input_names_the_tensor(device):
    rng = np.random.default_rng(11)
    feat, shape, start, loc, weights = problem(rng)
    run = lambda *a: clkernels.deformable_aggregation(*a, device=device)  # noqa: E731
    with pytest.raises(TypeError, match="mc_ms_feat"):
        run(feat.astype(np.float64), shape, start, loc, weights)
    with pytest.raises(TypeError, match="sampling_location"):
        run(feat, shape, start, loc.astype(np.float64), weights)
    with pytest.raises(ValueError, match="sampling_location"):
        run(feat, shape, start, loc[:1], weights)
    with pytest.raises(ValueError, match="weights"):
        run(feat, shape, start, loc, weights[:, :, :1])
    with pytest.raises(ValueError, match="weights"):
        run(feat, shape, start, loc, np.zeros(weights.shape[:5] + (3,), np.float32))  # 3 does not divide 8
    with pytest.raises(ValueError, match="spatial_shape"):
        run(feat, shape[:1], start, loc, weights)
    with pytest.raises(TypeError, match="scale_start_index"):
        run(feat, shape, start.astype(np.float32), loc, weights)
    with pytest.raises(ValueError, match="scale_start_index"):
        run(feat, shape, start[:, :1], loc, weights)
    past = start.copy()
    past[-1, -1] += 1  # the last block now ends one row past num_feat
    with pytest.raises(ValueError, match=r"scale_start_index\[1, 1\].*num_feat"):
        run(feat, shape, past, loc, weights)
    big = shape.copy()
    big[0, 1] = (3, 3)  # the block of (0, 1) would run into the next camera: fine; (1, 1) runs past
    big[1, 1] = (3, 3)
    with pytest.raises(ValueError, match=r"scale_start_index\[1, 1\]"):
        run(feat, big, start, loc, weights)
    negative = shape.copy()
    negative[0, 0, 1] = -1
    with pytest.raises(ValueError, match=r"spatial_shape\[0, 0\]"):
        run(feat, negative, start, loc, weights)
    go = np.zeros((2, 3, 8), np.float16)
    with pytest.raises(TypeError, match="grad_out"):
        clkernels.deformable_aggregation_backward(go, feat, shape, start, loc, weights, device=device)
    with pytest.raises(ValueError, match="grad_out"):
        clkernels.deformable_aggregation_backward(go[:, :1].astype(np.float32), feat, shape, start, loc,
                                                  weights, device=device)
    # (split and feature_grad are refused when the config is made, the others by the call)
    for bad, word in ((dict(cpt=3, vec=1), "cpt"), (dict(cpt=2, vec=4), "vec"), (dict(split=3), "split"),
                      (dict(feature_grad="atomic"), "feature_grad"), (dict(groups_per_item=3), "groups_per_item")):
        with pytest.raises(ValueError, match=word):
            clkernels.deformable_aggregation_backward(np.zeros((2, 3, 8), np.float32), feat, shape, start, loc,
                                                      weights, device=device, config=AggregationConfig(**bad))
    with pytest.raises(ValueError, match="variant"):
        clkernels.deformable_aggregation(feat, shape, start, loc, weights, device=device, variant="fast")
    with pytest.raises(ValueError, match="levels\\[1\\]"):
        clkernels.feature_maps_format([np.zeros((1, 2, 4, 3, 3), np.float32), np.zeros((1, 3, 4, 2, 2), np.float32)])


@pytest.mark.oclgrind
@pytest.mark.parametrize("dims", [dict(bs=0), dict(A=0), dict(P=0), dict(cams=0), dict(C=0, G=1),
                                  dict(maps=())])
def test_empty_dimensions(device, dims):
    rng = np.random.default_rng(12)
    args = problem(rng, **{"maps": ((2, 3),), **dims})
    out = clkernels.deformable_aggregation(*args, device=device)
    np.testing.assert_array_equal(out, reference(*args))  # zeros of the right shape
    assert out.shape == (args[0].shape[0], args[3].shape[1], args[0].shape[2])
    go = np.ones(out.shape, np.float32)
    for variant in ("optimized", "original"):
        g_feat, g_loc, g_w = clkernels.deformable_aggregation_backward(go, *args, device=device, variant=variant)
        assert g_feat.shape == args[0].shape and g_loc.shape == args[3].shape and g_w.shape == args[4].shape
        for g in (g_feat, g_loc, g_w):   # an empty dimension leaves nothing to sample
            np.testing.assert_array_equal(g, 0)


# ----------------------------------------------------------------------------- PyTorch

@pytest.mark.oclgrind
@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")
def test_torch_autograd_gradcheck(device):
    torch = pytest.importorskip("torch")
    from clkernels.deformable_aggregation import DeformableAggregationFunction
    rng = np.random.default_rng(13)
    feat, shape, start, loc, weights = problem(rng, bs=1, A=2, P=2, cams=2, C=4, G=2, special=False)
    loc = smooth_locations(rng, loc, shape, margin=0.05)
    loc[0, 0, 0, 0] = [1.5, 0.5]  # one sample outside
    with clkernels.use_device(device.device):
        fn = DeformableAggregationFunction
        inputs = (torch.from_numpy(feat).requires_grad_(), torch.from_numpy(shape.astype(np.int64)),
                  torch.from_numpy(start.astype(np.int64)), torch.from_numpy(loc).requires_grad_(),
                  torch.from_numpy(weights).requires_grad_())
        out = fn.apply(*inputs)
        np.testing.assert_allclose(out.detach().numpy(), reference(feat, shape, start, loc, weights), rtol=1e-5,
                                   atol=1e-5)
        # float32 kernels: steps of 1e-3 (the map is 4 x 5, so 0.005 pixel, never crossing a kink
        # at 0.05 pixel margin) and float32 tolerances.
        assert torch.autograd.gradcheck(fn.apply, inputs, eps=1e-3, atol=2e-3, rtol=2e-3, nondet_tol=1e-5)
