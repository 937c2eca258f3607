"""clkernels.torch's modules against numpy written from the official module's definition: the
value projection, the offsets and masks (after a depthwise convolution where asked), the
deformable convolution (tests/test_dcnv4.py's numpy reference), the centre feature scale and the
output projection. CPU tensors here; tests/test_torch_cuda.py runs CUDA ones."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from clkernels.dcnv4 import DCNv4Options  # noqa: E402
from clkernels.torch import DCNv4, DeformableAggregation  # noqa: E402
from test_dcnv4 import reference  # noqa: E402


def _np(p):
    return p.detach().double().numpy()


def _linear(x, layer):
    y = x @ _np(layer.weight).T
    return y + _np(layer.bias) if layer.bias is not None else y


def _depthwise(image, conv):
    """A depthwise 2-D convolution, stride 1, zero padding (k - 1) // 2: image (N, H, W, C)."""
    w, b = _np(conv.weight), _np(conv.bias)          # (C, 1, k, k), (C,)
    k = w.shape[-1]
    p = (k - 1) // 2
    n, h, wd, c = image.shape
    padded = np.zeros((n, h + 2 * p, wd + 2 * p, c))
    padded[:, p:p + h, p:p + wd] = image
    out = np.zeros_like(image) + b
    for i in range(k):
        for j in range(k):
            out += padded[:, i:i + h, j:j + wd] * w[:, 0, i, j]
    return out


def _module_reference(m: DCNv4, x: np.ndarray, h: int, w: int) -> np.ndarray:
    n, length, c = x.shape
    v = x if m.without_pointwise else _linear(x, m.value_proj)
    source = x
    if m.dw_kernel_size is not None:
        source = _depthwise(x.reshape(n, h, w, c), m.offset_mask_dw).reshape(n, length, c)
    om = _linear(source, m.offset_mask).reshape(n, h, w, -1)
    o = DCNv4Options(kernel_h=m.kernel_size, kernel_w=m.kernel_size, stride_h=m.stride, stride_w=m.stride,
                     pad_h=m.pad, pad_w=m.pad, dilation_h=m.dilation, dilation_w=m.dilation, group=m.group,
                     group_channels=m.group_channels, offset_scale=m.offset_scale,
                     remove_center=bool(m.remove_center))
    y = reference(v.reshape(n, h, w, -1), om, o)
    if m.center_feature_scale:
        gate = 1 / (1 + np.exp(-(y @ _np(m.center_feature_scale_proj_weight).T + _np(m.center_feature_scale_proj_bias))))
        gate = np.repeat(gate, m.group_channels, axis=-1)
        y = y * (1 - gate) + v.reshape(n, h, w, -1) * gate
    y = y.reshape(n, length, -1)
    return y if m.without_pointwise else _linear(y, m.output_proj)


@pytest.mark.parametrize("kw", [dict(), dict(dw_kernel_size=3), dict(center_feature_scale=True),
                                dict(without_pointwise=True, remove_center=True)])
def test_dcnv4_module_matches_its_definition(kw, device):
    torch.manual_seed(0)
    m = DCNv4(channels=32, group=2, offset_scale=0.5, **kw)
    with torch.no_grad():        # away from the zero offsets of the initialisation, so they matter
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x = torch.randn(2, 5 * 7, 32)
    import clkernels
    with clkernels.use_device(device.device):
        out = m(x, shape=(5, 7))
    assert out.shape == (2, 35, 32)
    np.testing.assert_allclose(out.detach().double().numpy(), _module_reference(m, x.double().numpy(), 5, 7),
                               rtol=2e-4, atol=2e-4)
    out.square().mean().backward()       # gradients reach every parameter
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_dcnv4_module_initialises_and_checks_as_the_official_one():
    m = DCNv4(channels=64, group=4)
    assert m.offset_mask.out_features == 112           # 4 groups x 9 taps x 3, padded to 8
    assert not m.offset_mask.weight.any() and not m.offset_mask.bias.any()
    assert not m.value_proj.bias.any() and m.value_proj.weight.abs().max() > 0
    with pytest.raises(ValueError, match="multiple of group"):
        DCNv4(channels=30, group=4)
    with pytest.raises(ValueError, match="pass shape"):
        m(torch.zeros(1, 10, 64))
    # Its parameter names are the official module's, so official state dicts load.
    assert set(dict(DCNv4(channels=32, group=2, dw_kernel_size=3, center_feature_scale=True).named_parameters())) == {
        "offset_mask_dw.weight", "offset_mask_dw.bias", "offset_mask.weight", "offset_mask.bias",
        "value_proj.weight", "value_proj.bias", "output_proj.weight", "output_proj.bias",
        "center_feature_scale_proj_weight", "center_feature_scale_proj_bias"}


def test_deformable_aggregation_module_is_the_op(device):
    from test_deformable_aggregation import problem, reference as da_reference
    rng = np.random.default_rng(3)
    feat, shape, start, loc, weights = problem(rng, bs=1, A=3, P=2, cams=2, C=8, G=2, special=False)
    import clkernels
    with clkernels.use_device(device.device):
        out = DeformableAggregation()(torch.from_numpy(feat), torch.from_numpy(shape), torch.from_numpy(start),
                                      torch.from_numpy(loc), torch.from_numpy(weights))
    np.testing.assert_allclose(out.numpy(), da_reference(feat, shape, start, loc, weights), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_letterbox_and_warp_affine_take_image_tensors(dtype, device):
    """The torch entry points give the array functions' results, bit for bit, as tensors."""
    import clkernels
    from clkernels import letterbox as letterbox_arrays, warp_affine as warp_arrays
    from clkernels.torch import letterbox, warp_affine
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (2, 37, 53, 3), dtype=np.uint8)
    np_dtype = np.float32 if dtype == torch.float32 else __import__("ml_dtypes").bfloat16
    with clkernels.use_device(device.device):
        want, want_d2i = letterbox_arrays(images, (32, 24), dtype=np_dtype)
        blob, d2i = letterbox(torch.from_numpy(images), (32, 24), dtype=dtype)
        M = np.array([[0.6, 0.1, 3.0], [-0.1, 0.6, 2.0]])
        warped = warp_affine(torch.from_numpy(images[0]), torch.from_numpy(M), (40, 30))
        want_warped = warp_arrays(images[0], M, (40, 30))
    assert blob.dtype == dtype and tuple(blob.shape) == want.shape
    np.testing.assert_array_equal(blob.view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy(),
                                  want.view(np.int16) if dtype == torch.bfloat16 else want)
    np.testing.assert_array_equal(d2i.numpy(), want_d2i)
    assert warped.dtype == torch.uint8
    np.testing.assert_array_equal(warped.numpy(), want_warped)


def test_out_takes_the_result_in_its_own_memory_or_by_one_copy(device):
    """out= on CPU tensors: a contiguous out is written in place (the same memory, returned as it
    is), a strided one gets the result copied in; both hold the numpy reference's values."""
    import clkernels
    from clkernels.dcnv4 import torch_dcnv4
    from clkernels.deformable_aggregation import deformable_aggregation_torch
    from clkernels.torch import empty
    from test_deformable_aggregation import problem, reference as da_reference
    rng = np.random.default_rng(5)
    o = DCNv4Options(group=2, group_channels=4, offset_scale=0.7)
    x = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    om = (rng.standard_normal((2, 5, 6, 56)) * 0.5).astype(np.float32)
    want = reference(x, om, o)
    kw = dict(group=2, group_channels=4, offset_scale=0.7, device=device.device)
    contiguous, wide = empty(2, 5, 6, 8), torch.full((2, 5, 6, 16), -7.0)
    strided = wide[..., ::2]
    for out in (contiguous, strided):
        address = out.data_ptr()
        assert torch_dcnv4(torch.from_numpy(x), torch.from_numpy(om), out=out, **kw) is out
        assert out.data_ptr() == address
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    assert torch.all(wide[..., 1::2] == -7.0)                # only out's own elements were written

    feat, shape, start, loc, weights = problem(rng, bs=1, A=3, P=2, cams=2, C=8, G=2, special=False)
    out = empty((1, 3, 8))
    with clkernels.use_device(device.device):
        got = deformable_aggregation_torch(*(torch.from_numpy(a) for a in (feat, shape, start, loc, weights)), out=out)
    assert got is out
    np.testing.assert_allclose(out.numpy(), da_reference(feat, shape, start, loc, weights), rtol=1e-5, atol=1e-5)


def test_out_of_the_image_ops_matches_their_results(device):
    import clkernels
    from clkernels.torch import empty, letterbox, warp_affine
    rng = np.random.default_rng(6)
    image = torch.from_numpy(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    M = [[0.6, 0.1, 3.0], [-0.1, 0.6, 2.0]]
    with clkernels.use_device(device.device):
        want, want_d2i = letterbox(image, (32, 24), dtype=torch.bfloat16)
        blob = empty(1, 3, 24, 32, dtype=torch.bfloat16)
        got, d2i = letterbox(image, (32, 24), dtype=torch.bfloat16, out=blob)
        want_w = warp_affine(image, M, (40, 30))
        strided = torch.zeros(3, 30, 40, dtype=torch.uint8).permute(1, 2, 0)     # channels apart
        got_w = warp_affine(image, M, (40, 30), out=strided)
    assert got is blob and torch.equal(blob.view(torch.int16), want.view(torch.int16)) and torch.equal(d2i, want_d2i)
    assert got_w is strided and torch.equal(strided, want_w)


def test_a_wrong_out_is_refused_before_anything_is_written(device):
    from clkernels.dcnv4 import torch_dcnv4
    from clkernels.torch import empty, warp_affine
    x, om = torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 56)
    kw = dict(group=2, group_channels=4, device=device.device)
    with pytest.raises(TypeError, match="torch_dcnv4: out must be a torch.Tensor, not ndarray"):
        torch_dcnv4(x, om, out=np.zeros((1, 4, 4, 8), np.float32), **kw)
    with pytest.raises(ValueError, match="out is torch.float64, the result torch.float32"):
        torch_dcnv4(x, om, out=torch.zeros(1, 4, 4, 8, dtype=torch.float64), **kw)
    for bad in (torch.zeros(1, 4, 4, 9), torch.zeros(1, 4, 4, 18)[..., ::2]):   # in place, and by a copy
        with pytest.raises(ValueError, match="shape"):
            torch_dcnv4(x, om, out=bad, **kw)
        assert torch.all(bad == 0)
    with pytest.raises(ValueError, match="out shares its memory with input"):
        torch_dcnv4(x, om, out=x, **kw)
    with pytest.raises(ValueError, match="x is on meta|out is on meta"):
        torch_dcnv4(x, om, out=torch.zeros(1, 4, 4, 8, device="meta"), **kw)
    with pytest.raises(ValueError, match="warp_affine: out is torch.float32, the result torch.uint8"):
        warp_affine(torch.zeros(8, 8, 3, dtype=torch.uint8), [[1, 0, 0], [0, 1, 0]], (4, 4), out=torch.zeros(4, 4, 3))
    with pytest.raises(ValueError, match="clkernels.torch.empty makes CPU or CUDA tensors"):
        empty(3, device="meta")


def test_out_takes_no_part_in_autograd(device):
    """As torch's own out= functions: refused while grad mode records an input that needs it."""
    from clkernels.dcnv4 import torch_dcnv4
    x, om = torch.randn(1, 4, 4, 8, requires_grad=True), torch.randn(1, 4, 4, 56)
    out = torch.zeros(1, 4, 4, 8)
    kw = dict(group=2, group_channels=4, device=device.device)
    with pytest.raises(RuntimeError, match="out= takes no part in autograd, and input requires grad"):
        torch_dcnv4(x, om, out=out, **kw)
    with torch.no_grad():
        torch_dcnv4(x, om, out=out, **kw)
    assert torch.equal(out, torch_dcnv4(x, om, **kw).detach())


def test_a_tensor_written_by_out_is_known_to_autograd_as_changed(device):
    """A graph that saved a tensor refuses its backward after out= overwrote it, as after any
    in-place op (the op writes its memory outside torch, and says so)."""
    from clkernels.dcnv4 import torch_dcnv4
    from clkernels.torch import warp_affine
    w = torch.randn(1, 4, 4, 8, requires_grad=True)
    for strided in (False, True):
        saved = torch.zeros(1, 4, 4, 16)[..., ::2] if strided else torch.zeros(1, 4, 4, 8)
        y = (w * saved).sum()                    # saves `saved` for its backward
        with torch.no_grad():
            torch_dcnv4(torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 56), out=saved, group=2, group_channels=4,
                        device=device.device)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
    image, out = torch.zeros(8, 8, 3, dtype=torch.uint8), torch.zeros(4, 4, 3, dtype=torch.uint8)
    version = out._version
    import clkernels
    with clkernels.use_device(device.device):
        warp_affine(image, [[1, 0, 0], [0, 1, 0]], (4, 4), out=out)
    assert out._version > version
