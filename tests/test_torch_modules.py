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
