"""The shared device code in clkernels/common.cl.mako, against numpy."""
import numpy as np
import pyopencl.array as cla
import pytest

from clkernels import arrays, templates

COMMON = '<%namespace name="common" file="/clkernels/common.cl.mako"/>\n'


@pytest.mark.oclgrind
@pytest.mark.parametrize("real", ["float", "double"])
def test_atomic_add_sums_every_contribution(device, real):
    if real == "double" and not (device.info.fp64 and device.info.int64_atomics):
        pytest.skip("device has no fp64 or no 64-bit atomics")  # a capability, not a failure
    dtype = np.float32 if real == "float" else np.float64
    src = templates.render_string(COMMON + """
${common.fp64_pragma()}
${common.atomic_add(info, real)}
__kernel void scatter(__global const ${real} *v, __global const int *bin, __global ${real} *out)
{
    const int i = get_global_id(0);
    atomic_add_${real}(out + bin[i], v[i]);
}""", info=device.info, real=real)
    kernel = templates.build(src, device).scatter
    rng = np.random.default_rng(0)
    n, bins = 512, 5  # many work-items per bin, so updates really collide
    # Small integers: every order of summation gives the exact same result.
    v = rng.integers(-8, 9, n).astype(dtype)
    b = rng.integers(0, bins, n).astype(np.int32)
    out = arrays.zeros(device, bins, dtype)
    kernel(device.queue, (n,), None, cla.to_device(device.queue, v).data,
           cla.to_device(device.queue, b).data, out.data)
    np.testing.assert_array_equal(out.get(), np.bincount(b, weights=v, minlength=bins).astype(dtype))


def _taps_reference(h, w, H, W):
    """Bilinear corners written from the definition: zero weight outside the map."""
    h0, w0 = int(np.floor(h)), int(np.floor(w))
    lh, lw = h - h0, w - w0
    idx, wt = [], []
    for dh, dw, weight in ((0, 0, (1 - lh) * (1 - lw)), (0, 1, (1 - lh) * lw),
                           (1, 0, lh * (1 - lw)), (1, 1, lh * lw)):
        y, x = h0 + dh, w0 + dw
        inside = 0 <= y < H and 0 <= x < W
        idx.append(y * W + x if inside else -1)
        wt.append(weight if inside else 0.0)
    return idx, wt


@pytest.mark.oclgrind
def test_bilinear_taps_match_reference(device):
    src = templates.render_string(COMMON + """
${common.bilinear_taps('float')}
__kernel void taps(__global const float2 *hw, int H, int W, __global int *idx, __global float *wt)
{
    const int i = get_global_id(0);
    int k[4]; float c[4]; float lh, lw;
    bilinear_taps_float(hw[i].x, hw[i].y, H, W, k, c, &lh, &lw);
    for (int j = 0; j < 4; ++j) { idx[4 * i + j] = k[j]; wt[4 * i + j] = c[j]; }
}""")
    kernel = templates.build(src, device).taps
    H, W = 5, 7
    rng = np.random.default_rng(1)
    # Inside, on integer positions, and straddling every border (the caller's range -1 < h < H).
    hw = np.concatenate([rng.uniform(-0.999, [H - 0.001, W - 0.001], (40, 2)),
                         [[0, 0], [-0.5, -0.5], [H - 1, W - 1], [H - 0.5, W - 0.5], [2, 3.25]]]).astype(np.float32)
    idx = cla.empty(device.queue, (len(hw), 4), np.int32)
    wt = cla.empty(device.queue, (len(hw), 4), np.float32)
    kernel(device.queue, (len(hw),), None, cla.to_device(device.queue, hw).data, np.int32(H), np.int32(W),
           idx.data, wt.data)
    for i, (h, w) in enumerate(hw.astype(np.float64)):
        ref_idx, ref_wt = _taps_reference(h, w, H, W)
        np.testing.assert_array_equal(idx.get()[i], ref_idx)
        np.testing.assert_allclose(wt.get()[i], ref_wt, atol=1e-6)


@pytest.mark.oclgrind
def test_half_storage_round_trips(device):
    st = templates.Storage(np.float16)
    src = templates.render_string("""
__kernel void twice(__global const ${st.ptr} *a, __global ${st.ptr} *b)
{
    const int i = get_global_id(0);
    ${st.storen(4, st.loadn(4, 'a', 'i') + ' * 2.0f', 'b', 'i')};
}""", st=st)
    a = np.linspace(-3, 3, 64).astype(np.float16)
    b = cla.empty(device.queue, 64, np.float16)
    templates.build(src, device).twice(device.queue, (16,), None, cla.to_device(device.queue, a).data, b.data)
    np.testing.assert_array_equal(b.get(), (a.astype(np.float32) * 2).astype(np.float16))
