"""Fused warp-affine preprocessing against OpenCV: warpAffine (INTER_LINEAR, BORDER_CONSTANT),
then the swap and normalisation written out in numpy from the specification.

OpenCV >= 4.11 computes warpAffine for 8-bit images in float (warp_kernels.simd.hpp); the
kernel follows that order of rounding, so values are identical except for a few samples
(OpenCV's scalar remainder columns, which round the coordinates in another order), and
never differ by more than one level.
"""
import importlib

import cv2  # OpenCV and scikit-image are test requirements (setup.cfg's [test] extra)
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
import skimage.data as skdata

import clkernels

from bf16 import BF16
from clkernels import launch

wa = importlib.import_module("clkernels.warp_affine")  # the package; clkernels.warp_affine is the function
# The calls read the per-device choices (_lanes, _fma_name, _unaligned_io, _alloc_limit) through
# this module's names, which the tests override to run every kernel mapping on any device.
wa_ops = importlib.import_module("clkernels.warp_affine.ops")

assert tuple(int(v) for v in cv2.__version__.split(".")[:2]) >= (4, 11), \
    f"OpenCV >= 4.11 is needed (its float sampling is what this follows), found {cv2.__version__}"

LINEAR = dict(flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)


def photo(name):
    """A real photograph from scikit-image, as OpenCV's BGR."""
    return np.ascontiguousarray(getattr(skdata, name)()[..., ::-1])


def noise(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def cv_warp(img, M, dsize, fill=114):
    fill = (fill,) * 3 if np.isscalar(fill) else tuple(fill)
    return cv2.warpAffine(np.ascontiguousarray(img), M, dsize, borderValue=fill, **LINEAR)


def spec_i2d(src_w, src_h, dst_w, dst_h):
    """The letterbox matrix exactly as the issue writes it."""
    s = min(dst_w / src_w, dst_h / src_h)
    return np.array([[s, 0, -s * src_w / 2 + dst_w / 2 + s / 2 - 0.5],
                     [0, s, -s * src_h / 2 + dst_h / 2 + s / 2 - 0.5]])


def cv_blob(img, size, fill=114, swap_rb=True, mean=(0, 0, 0), std=(1, 1, 1), alpha=1 / 255,
            beta=None):
    """OpenCV's warp, then swap and normalise in float64 as the issue defines them."""
    h, w = img.shape[:2]
    v = cv_warp(img, spec_i2d(w, h, *size), size, fill).astype(np.float64)
    if swap_rb:
        v = v[..., ::-1]
    if beta is None:
        out = (v * alpha - np.asarray(mean, float)) / np.asarray(std, float)
    else:
        out = v * alpha + np.asarray(beta, float)
    return out.transpose(2, 0, 1)


def check_levels(ours, ref, level, min_exact=0.9999):
    """Every value within one level of OpenCV's; nearly all on the same level. ``level``:
    one intensity level after normalisation, per channel (broadcasts over [3, H, W])."""
    ours = ours.astype(np.float64)
    level = np.asarray(level, float).reshape(-1, 1, 1) if np.ndim(level) else level
    diff = np.abs(ours - ref)
    tol = level * (1 + 1e-5) + 1e-6 * np.abs(ref)  # float32 rounding of the result
    assert np.all(diff <= tol), f"max diff {diff.max()} > one level"
    same = np.mean(diff < 0.5 * level)
    assert same >= min_exact, f"only {same:.6f} of the values on OpenCV's level"
    return same


def rotation(img, angle, scale, dsize):
    h, w = img.shape[:2]
    M = cv2.getRotationMatrix2D((w / 2, h / 2), angle, scale)
    M[:, 2] += (np.array(dsize) - (w, h)) / 2  # keep it centred in the output
    return M


# --------------------------------------------------------------------------- warp_affine

WARPS = {
    "upscale+rotate": lambda img: (rotation(img, 23.0, 1.7, (301, 247)), (301, 247)),
    "downscale": lambda img: (np.array([[0.37, 0, 3.25], [0, 0.41, -2.5]]), (160, 131)),
    "rotate-with-borders": lambda img: (rotation(img, -117.0, 0.8, (256, 256)), (256, 256)),
    "shifted-half-outside": lambda img: (np.array([[1.0, 0, 90.5], [0, 1.0, -60.25]]), (200, 160)),
    "mirror+shear": lambda img: (np.array([[-0.9, 0.2, 250.0], [0.1, 0.75, 5.0]]), (240, 200)),
    "letterbox": lambda img: (spec_i2d(img.shape[1], img.shape[0], 320, 320), (320, 320)),
}


@pytest.mark.parametrize("case", sorted(WARPS))
@pytest.mark.parametrize("source", ["astronaut", "chelsea", "noise"])
def test_warp_affine_matches_opencv(device, source, case):
    img = photo(source) if source != "noise" else noise(233, 311, seed=len(case))
    M, dsize = WARPS[case](img)
    ours = clkernels.warp_affine(img, M, dsize, border_value=114, device=device)
    ref = cv_warp(img, M, dsize)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    check_levels(ours, ref.astype(np.float64), 1, min_exact=0.999)


def test_fraction_exactly_equal_to_opencv_on_photographs(device):
    """The headline figure: values identical to OpenCV's, over photographs and transforms."""
    same, total = 0, 0
    for name in ("astronaut", "coffee", "rocket"):
        img = photo(name)
        for case in ("upscale+rotate", "rotate-with-borders", "mirror+shear", "letterbox"):
            M, dsize = WARPS[case](img)
            ours = clkernels.warp_affine(img, M, dsize, device=device)
            ref = cv_warp(img, M, dsize)
            same += int(np.sum(ours == ref))
            total += ours.size
            assert np.abs(ours.astype(int) - ref).max() <= 1
    fraction = same / total
    print(f"\nexactly equal to OpenCV {cv2.__version__}: {fraction:.7f} of {total} values")
    assert fraction >= 0.99999  # seen: 0.9999985; without the fma order about 0.99997


@pytest.mark.oclgrind
def test_warp_affine_tiny(device):
    img = noise(5, 7, seed=3)
    for M, dsize in (([[1.6, 0.5, -1.0], [-0.4, 1.3, 0.7]], (9, 6)),
                     ([[0.5, 0, 0], [0, 0.5, 0]], (3, 2))):
        M = np.array(M)
        ours = clkernels.warp_affine(img, M, dsize, border_value=(10, 20, 30), device=device)
        check_levels(ours, cv_warp(img, M, dsize, (10, 20, 30)).astype(np.float64), 1, 0.95)


@pytest.mark.oclgrind
def test_identity_warp_is_a_copy_up_to_the_buffers_last_byte(device):
    """Every pixel read, the first and last bytes of an exactly sized device buffer among
    them (4-byte corner loads must not step outside it); 1x1 and 1-row images too."""
    for h, w in ((5, 7), (1, 1), (1, 2), (3, 1)):
        img = noise(h, w, seed=h * w)
        dev = cla.to_device(device.queue, img)
        eye = np.eye(2, 3)
        assert np.array_equal(clkernels.warp_affine(dev, eye, (w, h), device=device).get(), img)
        assert np.array_equal(clkernels.warp_affine(img, eye, (w, h), device=device), img)


@pytest.mark.oclgrind
def test_non_finite_matrix_reads_nothing_and_gives_border(device):
    img = noise(4, 6, seed=1)
    for bad in (np.nan, np.inf, 1e30):
        M = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, bad]])
        ours = clkernels.warp_affine(img, M, (5, 3), border_value=(7, 8, 9), device=device)
        assert np.array_equal(ours, np.broadcast_to(np.array([7, 8, 9], np.uint8), (3, 5, 3)))


# --------------------------------------------------------------------------- letterbox

# (200, 200) is a 1/3 downscale: every source row is an integer (ay == 0), the kernel's path
# that reads its zero-weight second row from the first.
@pytest.mark.parametrize("size", [(640, 640), (320, 192), (333, 257), (200, 200)])
def test_letterbox_matches_opencv_pipeline(device, size):
    img = photo("coffee")  # 600 x 400: bands above and below
    blob, d2i = clkernels.letterbox(img, size=size, device=device)
    assert blob.shape == (1, 3, size[1], size[0]) and blob.dtype == np.float32
    check_levels(blob[0], cv_blob(img, size), 1 / 255)
    levels = blob[0].astype(np.float64) * 255  # rounded to integer levels before scaling
    assert np.abs(levels - np.round(levels)).max() < 1e-3
    assert d2i.shape == (2, 3)
    np.testing.assert_allclose(d2i, cv2.invertAffineTransform(spec_i2d(600, 400, *size)),
                               rtol=1e-14, atol=1e-12)


def test_letterbox_batch_of_mixed_sizes_in_one_launch(device):
    images = [photo("astronaut"), photo("chelsea"), noise(37, 211, seed=5), noise(250, 3, seed=6)]
    blob, d2i = clkernels.letterbox(images, size=(256, 224), device=device)
    assert blob.shape == (4, 3, 224, 256) and d2i.shape == (4, 2, 3)
    for i, img in enumerate(images):
        check_levels(blob[i], cv_blob(img, (256, 224)), 1 / 255, min_exact=0.999)
        h, w = img.shape[:2]
        np.testing.assert_allclose(d2i[i], cv2.invertAffineTransform(spec_i2d(w, h, 256, 224)),
                                   rtol=1e-14, atol=1e-12)


def test_letterbox_4d_batch_equals_list(device):
    batch = np.stack([noise(90, 120, seed=s) for s in range(3)])
    a, da = clkernels.letterbox(batch, size=(64, 64), device=device)
    b, db = clkernels.letterbox(list(batch), size=(64, 64), device=device)
    assert np.array_equal(a, b) and np.array_equal(da, db)


@pytest.mark.parametrize("options", [
    dict(swap_rb=False),
    dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    dict(alpha=1.0, mean=(123.7, 116.3, 103.5), std=(58.4, 57.1, 57.4)),
    dict(alpha=2 / 255, beta=-1.0),
    dict(alpha=1.0, beta=(-10.0, 0.0, 10.0), swap_rb=False),
    dict(fill=(0, 128, 255)),
])
def test_letterbox_options(device, options):
    img = photo("chelsea")
    blob, _ = clkernels.letterbox(img, size=(200, 160), device=device, **options)
    alpha = options.get("alpha", 1 / 255)
    std = np.asarray(options.get("std", (1, 1, 1)), float) if "beta" not in options else 1.0
    check_levels(blob[0], cv_blob(img, (200, 160), **options), alpha / np.abs(std))


def test_letterbox_float16_storage(device):
    img = photo("astronaut")
    blob, _ = clkernels.letterbox(img, size=(96, 96), dtype=np.float16,
                                  mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), device=device)
    assert blob.dtype == np.float16
    ref = cv_blob(img, (96, 96), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    # one level, plus half a float16 step of rounding
    tol = 4 / 255 + np.abs(ref) * 2.0 ** -11 + 1e-7
    assert np.all(np.abs(blob[0].astype(np.float64) - ref) <= tol)


def test_letterbox_bfloat16_storage(device):
    """bfloat16 blob (ml_dtypes): within OpenCV's blob by one level plus bfloat16 rounding
    (2^-9 relative), and bit for bit the float32 blob rounded to nearest even by ml_dtypes."""
    img = photo("astronaut")
    kw = dict(size=(96, 96), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), device=device)
    blob, _ = clkernels.letterbox(img, dtype=BF16, **kw)
    assert blob.dtype == BF16
    ref = cv_blob(img, (96, 96), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    tol = 4 / 255 + np.abs(ref) * 2.0 ** -9 + 1e-7
    assert np.all(np.abs(blob[0].astype(np.float64) - ref) <= tol)
    f32, _ = clkernels.letterbox(img, dtype=np.float32, **kw)
    np.testing.assert_array_equal(blob.view(np.uint16), f32.astype(BF16).view(np.uint16))


@pytest.mark.oclgrind
def test_letterbox_tiny_bfloat16(device):
    img = noise(4, 6, seed=4)
    blob, _ = clkernels.letterbox(img, size=(5, 5), dtype=BF16, device=device)
    f32, _ = clkernels.letterbox(img, size=(5, 5), dtype=np.float32, device=device)
    np.testing.assert_array_equal(blob.view(np.uint16), f32.astype(BF16).view(np.uint16))
    ref = cv_blob(img, (5, 5))
    assert np.all(np.abs(blob[0].astype(np.float64) - ref) <= 1 / 255 + ref * 2.0 ** -9)


@pytest.mark.oclgrind
def test_letterbox_tiny_mixed_batch(device):
    images = [noise(3, 5, seed=1), noise(6, 2, seed=2), noise(1, 1, seed=3)]
    blob, _ = clkernels.letterbox(images, size=(7, 4), fill=(1, 2, 3), device=device)
    for i, img in enumerate(images):
        check_levels(blob[i], cv_blob(img, (7, 4), fill=(1, 2, 3)), 1 / 255, min_exact=0.95)


@pytest.mark.oclgrind
def test_letterbox_tiny_float16(device):
    img = noise(4, 6, seed=4)
    blob, _ = clkernels.letterbox(img, size=(5, 5), dtype=np.float16, device=device)
    ref = cv_blob(img, (5, 5))
    assert np.all(np.abs(blob[0].astype(np.float64) - ref) <= 1 / 255 + ref * 2.0 ** -11)


# --------------------------------------------------------------------------- memory layouts

@pytest.mark.oclgrind
def test_strided_views_are_read_in_place(device):
    big = noise(9, 11, seed=7)
    bgra = np.random.default_rng(8).integers(0, 256, (6, 5, 4), dtype=np.uint8)
    for view in (big[2:8, 3:10], big[::2, ::3], bgra[..., :3]):
        assert not view.flags.c_contiguous
        ours, _ = clkernels.letterbox(view, size=(8, 6), device=device)
        ref, _ = clkernels.letterbox(np.ascontiguousarray(view), size=(8, 6), device=device)
        assert np.array_equal(ours, ref)
        check_levels(ours[0], cv_blob(view, (8, 6)), 1 / 255, min_exact=0.95)


@pytest.mark.oclgrind
def test_device_arrays_in_device_arrays_out(device):
    q = device.queue
    images = [noise(5, 8, seed=1), noise(7, 4, seed=2)]
    host_blob, host_d2i = clkernels.letterbox(images, size=(6, 6), device=device)
    separate = [cla.to_device(q, im) for im in images]  # two allocations: packed on device
    blob, d2i = clkernels.letterbox(separate, size=(6, 6), device=device)
    assert isinstance(blob, cla.Array)
    assert np.array_equal(blob.get(), host_blob) and np.array_equal(d2i, host_d2i)
    batch = cla.to_device(q, np.stack([images[0], images[0][::-1].copy()]))  # read in place
    blob, _ = clkernels.letterbox(batch, size=(6, 6), device=device)
    ref, _ = clkernels.letterbox([images[0], images[0][::-1].copy()], size=(6, 6), device=device)
    assert np.array_equal(blob.get(), ref)
    big = noise(9, 11, seed=3)
    crop = cla.to_device(q, big)[2:8, 3:10]  # a strided view of a device array, read in place
    blob, _ = clkernels.letterbox(crop, size=(6, 6), device=device)
    ref, _ = clkernels.letterbox(np.ascontiguousarray(big[2:8, 3:10]), size=(6, 6), device=device)
    assert np.array_equal(blob.get(), ref)
    warped = clkernels.warp_affine(separate[1], np.array([[0.5, 0.1, 1.0], [0.0, 1.2, -0.5]]),
                                   (5, 9), device=device)
    assert isinstance(warped, cla.Array) and warped.shape == (9, 5, 3)
    assert np.array_equal(warped.get(), clkernels.warp_affine(
        images[1], np.array([[0.5, 0.1, 1.0], [0.0, 1.2, -0.5]]), (5, 9), device=device))


@pytest.mark.oclgrind
def test_out_argument_is_filled_and_returned(device):
    images = [noise(5, 8, seed=1), noise(7, 4, seed=2)]
    ref, _ = clkernels.letterbox(images, size=(6, 4), device=device)
    out = np.full((2, 3, 4, 6), np.nan, np.float32)
    blob, _ = clkernels.letterbox(images, size=(6, 4), out=out, device=device)
    assert blob is out and np.array_equal(out, ref)
    dev_out = cla.empty(device.queue, (2, 3, 4, 6), np.float32)
    dev_images = cla.to_device(device.queue, np.stack([images[0], images[0]]))
    blob, _ = clkernels.letterbox(dev_images, size=(6, 4), out=dev_out, device=device)
    assert blob is dev_out and np.array_equal(dev_out.get()[0], ref[0])
    with pytest.raises(ValueError, match=r"out has shape"):
        clkernels.letterbox(images, size=(6, 4), out=np.empty((2, 3, 6, 4), np.float32), device=device)
    with pytest.raises(TypeError, match="out has dtype"):
        clkernels.letterbox(images, size=(6, 4), out=np.empty((2, 3, 4, 6), np.float16), device=device)
    with pytest.raises(TypeError, match="out must be a numpy array"):
        clkernels.letterbox(images, size=(6, 4), out=dev_out, device=device)
    with pytest.raises(ValueError, match="C-contiguous"):
        clkernels.letterbox(images, size=(6, 4), out=np.empty((2, 3, 4, 12), np.float32)[..., ::2],
                            device=device)


@pytest.mark.oclgrind
def test_every_code_path_gives_the_same_values(device, monkeypatch):
    """Copy instead of zero-copy, one pixel per work-item (the GPU path) and several,
    and a batch split over several launches: identical results."""
    images = [noise(6, 9, seed=11), noise(8, 5, seed=12), noise(4, 4, seed=13)]
    M = np.array([[0.7, -0.3, 2.0], [0.25, 0.9, -1.0]])
    ref, _ = clkernels.letterbox(images, size=(16, 8), device=device)
    ref_w = clkernels.warp_affine(images[0], M, (16, 5), device=device)
    # A 1/3 downscale: integer source rows and columns, whose zero-weight corners the CPU
    # path (word loads) does not read and the byte-load path does.
    third = noise(12, 18, seed=14)
    ref_third, _ = clkernels.letterbox(third, size=(16, 4), device=device)
    variants = [dict(_zero_copy=False)]
    if not device.info.is_simulator:  # Oclgrind counts host-pointer memory as uninitialised
        variants.append(dict(_zero_copy=True))
    for kw in variants:
        assert np.array_equal(clkernels.letterbox(images, size=(16, 8), device=device, **kw)[0], ref)
    for lanes, fma, unaligned in ((1, "fma", False), (1, None, True), (2, None, False),
                                  (8, "fma", True), (8, None, False), (16, None, True)):
        monkeypatch.setattr(wa_ops, "_lanes", lambda runtime, w, lanes=lanes: lanes)
        # GPUs' loads and stores (bytes, vstoren) or CPUs' (words, unaligned vectors).
        monkeypatch.setattr(wa_ops, "_unaligned_io", lambda runtime, u=unaligned: u)
        if fma:  # the library fma, as GPUs get it
            monkeypatch.setattr(wa_ops, "_fma_name", lambda runtime: fma)
        assert np.array_equal(clkernels.letterbox(images, size=(16, 8), device=device)[0], ref)
        assert np.array_equal(clkernels.letterbox(images[1], size=(16, 8), device=device)[0],
                              ref[1:2])
        assert np.array_equal(clkernels.warp_affine(images[0], M, (16, 5), device=device), ref_w)
        assert np.array_equal(clkernels.letterbox(third, size=(16, 4), device=device)[0], ref_third)
        monkeypatch.undo()
    # Host images: the outputs of two images fill a buffer, so three take two launches.
    monkeypatch.setattr(wa_ops, "_alloc_limit", lambda runtime: 16 * 8 * 3 * 4 * 2)
    assert np.array_equal(clkernels.letterbox(images, size=(16, 8), device=device)[0], ref)
    # Device images in separate allocations: packed inputs of two images fill a buffer.
    big = [noise(20, 30, seed=s) for s in range(3)]  # 1800 bytes, 1856 aligned, each
    ref, _ = clkernels.letterbox(big, size=(4, 4), device=device)
    monkeypatch.setattr(wa_ops, "_alloc_limit", lambda runtime: 4000)
    dev = [cla.to_device(device.queue, im) for im in big]
    assert np.array_equal(clkernels.letterbox(dev, size=(4, 4), device=device)[0].get(), ref)
    with pytest.raises(ValueError, match="output .* is larger than one buffer"):
        clkernels.letterbox(dev, size=(40, 40), device=device)


def test_image_larger_than_a_buffer_is_refused_clearly(device, monkeypatch):
    monkeypatch.setattr(wa_ops, "_alloc_limit", lambda runtime: 1000)
    with pytest.raises(ValueError, match=r"images\[1\].*CL_DEVICE_MAX_MEM_ALLOC_SIZE"):
        clkernels.letterbox([noise(5, 5), noise(40, 40)], size=(8, 8), device=device)


# --------------------------------------------------------------------------- the launch layer

@pytest.mark.oclgrind
def test_arrays_on_a_callers_own_context_and_queue(device):
    """Images made on a context and queue the library did not create: no device=, results
    on that context and queue; queue= runs host images there."""
    ctx = cl.Context([device.device])
    q = cl.CommandQueue(ctx)
    images = [noise(5, 8, seed=1), noise(7, 4, seed=2)]
    M = np.array([[0.5, 0.1, 1.0], [0.0, 1.2, -0.5]])
    ref, ref_d2i = clkernels.letterbox(images, size=(6, 6), device=device)
    ref_w = clkernels.warp_affine(images[1], M, (5, 9), device=device)
    for dev_images in ([cla.to_device(q, im) for im in images],          # packed on the device
                       cla.to_device(q, np.stack([images[0], images[0]]))):  # read in place
        blob, d2i = clkernels.letterbox(dev_images, size=(6, 6))
        assert isinstance(blob, cla.Array) and blob.context == ctx and blob.queue is q
        expect = ref if isinstance(dev_images, list) else np.stack([ref[0], ref[0]])
        assert np.array_equal(blob.get(), expect) and np.array_equal(d2i[0], ref_d2i[0])
    one = cla.to_device(q, images[0])
    blob, _ = clkernels.letterbox(one, size=(6, 6))
    assert blob.queue is q and np.array_equal(blob.get(), ref[:1])
    warped = clkernels.warp_affine(cla.to_device(q, images[1]), M, (5, 9))
    assert warped.context == ctx and warped.shape == (9, 5, 3)
    assert np.array_equal(warped.get(), ref_w)
    # Host images on the caller's queue: numpy results.
    blob, _ = clkernels.letterbox(images, size=(6, 6), queue=q)
    assert isinstance(blob, np.ndarray) and np.array_equal(blob, ref)
    assert np.array_equal(clkernels.warp_affine(images[1], M, (5, 9), queue=q), ref_w)
    assert launch.runtime_for_queue(q).plans   # it ran there
    # Another context than the images': a clear error, not a stray pointer.
    with pytest.raises(ValueError, match=r"images\[0\] lives on another OpenCL context"):
        clkernels.letterbox(one, size=(6, 6), device=device)


@pytest.mark.oclgrind
def test_warp_affine_out_host_and_device(device):
    img = noise(6, 7, seed=4)
    M = np.array([[1.3, 0.2, -0.5], [-0.1, 0.9, 0.75]])
    ref = clkernels.warp_affine(img, M, (8, 5), device=device)
    out = np.zeros((5, 8, 3), np.uint8)
    assert clkernels.warp_affine(img, M, (8, 5), out=out, device=device) is out
    assert np.array_equal(out, ref)
    dev_out = cla.zeros(device.queue, (5, 8, 3), np.uint8)
    dev_img = cla.to_device(device.queue, img)
    assert clkernels.warp_affine(dev_img, M, (8, 5), out=dev_out, device=device) is dev_out
    assert np.array_equal(dev_out.get(), ref)
    with pytest.raises(ValueError, match=r"out has shape \(5, 8, 4\)"):
        clkernels.warp_affine(img, M, (8, 5), out=np.zeros((5, 8, 4), np.uint8), device=device)
    with pytest.raises(TypeError, match="out has dtype float32"):
        clkernels.warp_affine(img, M, (8, 5), out=np.zeros((5, 8, 3), np.float32), device=device)
    with pytest.raises(TypeError, match="out must be a numpy array"):
        clkernels.warp_affine(img, M, (8, 5), out=dev_out, device=device)
    with pytest.raises(TypeError, match="out must be a pyopencl.array.Array"):
        clkernels.warp_affine(dev_img, M, (8, 5), out=out, device=device)
    with pytest.raises(ValueError, match="out is read-only"):
        frozen = np.zeros((5, 8, 3), np.uint8)
        frozen.flags.writeable = False
        clkernels.warp_affine(img, M, (8, 5), out=frozen, device=device)


@pytest.mark.oclgrind
def test_letterbox_device_out_errors_name_out(device):
    dev_images = cla.to_device(device.queue, np.stack([noise(5, 8, seed=1)] * 2))
    with pytest.raises(ValueError, match="out has shape"):
        clkernels.letterbox(dev_images, size=(6, 4), device=device,
                            out=cla.empty(device.queue, (2, 3, 6, 4), np.float32))
    with pytest.raises(TypeError, match="out must be a pyopencl.array.Array"):
        clkernels.letterbox(dev_images, size=(6, 4), out=np.empty((2, 3, 4, 6), np.float32),
                            device=device)
    other = cl.CommandQueue(cl.Context([device.device]))
    with pytest.raises(ValueError, match="out lives on another OpenCL context"):
        clkernels.letterbox(dev_images, size=(6, 4), device=device,
                            out=cla.empty(other, (2, 3, 4, 6), np.float32))


@pytest.mark.oclgrind
def test_views_at_changing_offsets_share_a_plan(device):
    """Crops of one image (host or device) whose offsets change from call to call: one plan,
    a new table (batches) or offset (one image) each time, the values of copies."""
    big = noise(12, 14, seed=9)
    dev_big = cla.to_device(device.queue, big)
    plans = None
    for k in range(3):
        crops = [big[0:5, 0:6], big[k:k + 5, 4 + k:10 + k]]
        ref, _ = clkernels.letterbox([np.ascontiguousarray(c) for c in crops], size=(8, 8),
                                     device=device)
        blob, _ = clkernels.letterbox(crops, size=(8, 8), device=device)
        assert np.array_equal(blob, ref)
        dev_crops = [dev_big[0:5, 0:6], dev_big[k:k + 5, 4 + k:10 + k]]
        dev_blob, _ = clkernels.letterbox(dev_crops, size=(8, 8), device=device)
        assert np.array_equal(dev_blob.get(), ref)
        dev_blob, _ = clkernels.letterbox(dev_crops[1], size=(8, 8), device=device)
        assert np.array_equal(dev_blob.get(), ref[1:])
        if plans is None:
            plans = len(device.plans)
        assert len(device.plans) == plans


def test_unaligned_host_out_with_vector_stores(device):
    """A caller's out= aligned to its elements only, with 8 pixels per vector store."""
    img = photo("chelsea")
    ref, _ = clkernels.letterbox(img, size=(64, 48), device=device)
    raw = np.empty(1 * 3 * 48 * 64 * 4 + 64, np.uint8)
    start = (-raw.ctypes.data) % 32 + 4   # 4 bytes past a 32-byte boundary
    out = raw[start:start + ref.nbytes].view(np.float32).reshape(ref.shape)
    blob, _ = clkernels.letterbox(img, size=(64, 48), out=out, device=device)
    assert blob is out and np.array_equal(out, ref)


def test_host_results_are_independent_arrays(device):
    """Each call's numpy result is its own memory for as long as it (or a view) lives."""
    a, b = photo("astronaut"), photo("coffee")
    first, _ = clkernels.letterbox(a, size=(64, 64), device=device)
    expect = first.copy()
    view = first[0, 1]
    del first
    second, _ = clkernels.letterbox(b, size=(64, 64), device=device)
    assert np.array_equal(view, expect[0, 1]) and not np.array_equal(second, expect)
    second += 1.0   # results are writeable
    assert isinstance(second, np.ndarray) and second.flags.c_contiguous


def test_repeated_calls_reuse_one_plan_and_do_not_grow_the_pool(device):
    images = [noise(9, 12, seed=1), noise(7, 5, seed=2)]
    separate = [cla.to_device(device.queue, im) for im in images]   # packed from the pool
    batch = cla.to_device(device.queue, np.stack([images[0]] * 2))  # read in place
    M = np.array([[0.8, 0.1, 0.5], [0.0, 1.1, -0.25]])
    for _ in range(3):   # first calls: plans, pool blocks
        clkernels.letterbox(separate, size=(8, 8), device=device)
        clkernels.letterbox(batch, size=(8, 8), device=device)
        clkernels.letterbox(images[0], size=(8, 8), device=device)
        clkernels.warp_affine(separate[0], M, (6, 6), device=device)
    device.queue.finish()
    plans, pool = len(device.plans), device.pool
    blocks = pool.held_blocks + pool.active_blocks
    for i in range(1000):
        clkernels.letterbox(separate, size=(8, 8), device=device)
        clkernels.letterbox(batch, size=(8, 8), device=device)
        clkernels.letterbox(images[0], size=(8, 8), device=device)
        M[0, 2] = i / 1000   # a new matrix per call: no new plan
        clkernels.warp_affine(separate[0], M, (6, 6), device=device)
    device.queue.finish()
    assert len(device.plans) == plans
    assert pool.held_blocks + pool.active_blocks <= blocks


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call, match", [
    (lambda d: clkernels.letterbox(np.zeros((4, 4, 3), np.float32), device=d), "images has dtype float32"),
    (lambda d: clkernels.letterbox(np.zeros((4, 4, 4), np.uint8), device=d), r"images must be an \[H, W, 3\]"),
    (lambda d: clkernels.letterbox(np.zeros((4, 4), np.uint8), device=d), r"images must be an \[H, W, 3\]"),
    (lambda d: clkernels.letterbox(np.zeros((0, 4, 3), np.uint8), device=d), "images is empty"),
    (lambda d: clkernels.letterbox([], device=d), "images is an empty list"),
    (lambda d: clkernels.letterbox(np.zeros((1, 2**22, 3), np.uint8), device=d), "sides of 4194304"),
    (lambda d: clkernels.letterbox([noise(3, 3), np.zeros((3, 3, 3), np.int16)], device=d), r"images\[1\] has dtype"),
    (lambda d: clkernels.letterbox(noise(4, 4)[::-1], device=d), "ascontiguousarray"),
    (lambda d: clkernels.letterbox(noise(4, 4)[..., ::-1], device=d), "ascontiguousarray"),
    (lambda d: clkernels.letterbox(noise(4, 4), size=(0, 5), device=d), "size must be"),
    (lambda d: clkernels.letterbox(noise(4, 4), size=(-3, 5), device=d), "size must be"),
    (lambda d: clkernels.letterbox(noise(4, 4), size=(2.5, 5), device=d), "size must be"),
    (lambda d: clkernels.letterbox(noise(4, 4), fill=300, device=d), "fill must be"),
    (lambda d: clkernels.letterbox(noise(4, 4), std=(1, 0, 1), device=d), "std must not contain 0"),
    (lambda d: clkernels.letterbox(noise(4, 4), mean=(1, 2), device=d), "mean must be"),
    (lambda d: clkernels.letterbox(noise(4, 4), beta=1.0, mean=(1, 1, 1), device=d), "either beta"),
    (lambda d: clkernels.letterbox(noise(4, 4), dtype=np.float64, device=d), "dtype must be"),
    (lambda d: clkernels.warp_affine(noise(4, 4), np.array([[1, 2, 0], [2, 4, 0]], float), (4, 4), device=d), "M is singular"),
    (lambda d: clkernels.warp_affine(noise(4, 4), np.eye(3), (4, 4), device=d), r"M has shape \(3, 3\)"),
    (lambda d: clkernels.warp_affine(noise(4, 4), np.eye(2, 3), (4, 0), device=d), "dsize must be"),
    (lambda d: clkernels.warp_affine(noise(4, 4), np.eye(2, 3), (4, 4), border_value=-1, device=d), "border_value must be"),
    (lambda d: clkernels.warp_affine(noise(4, 4).astype(np.float64), np.eye(2, 3), (4, 4), device=d), "image has dtype float64"),
    (lambda d: clkernels.warp_affine([noise(4, 4)], np.eye(2, 3), (4, 4), device=d), "one"),
])
def test_bad_input_names_the_argument(device, call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(device)


# --------------------------------------------------------------------------- boxes

def test_scale_boxes_maps_the_image_area_back_to_the_whole_image():
    for (w, h), size in (((1920, 1080), (640, 640)), ((300, 451), (320, 256)), ((7, 3), (5, 9))):
        s = min(size[0] / w, size[1] / h)
        pad_x, pad_y = (size[0] - s * w) / 2, (size[1] - s * h) / 2
        d2i = cv2.invertAffineTransform(spec_i2d(w, h, *size))
        content = [pad_x, pad_y, pad_x + s * w, pad_y + s * h]
        np.testing.assert_allclose(clkernels.scale_boxes(content, d2i), [0, 0, w, h], atol=1e-9)
        # any box: blob edge coordinates are s * source + pad
        rng = np.random.default_rng(0)
        xs = np.sort(rng.uniform(0, w, (10, 2)), axis=1)
        ys = np.sort(rng.uniform(0, h, (10, 2)), axis=1)
        src = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
        blob_boxes = src * s + [pad_x, pad_y, pad_x, pad_y]
        np.testing.assert_allclose(clkernels.scale_boxes(blob_boxes, d2i), src, atol=1e-9)
        clipped = clkernels.scale_boxes([[-50, -50, size[0] + 50, size[1] + 50]], d2i, shape=(h, w))
        np.testing.assert_allclose(clipped, [[0, 0, w, h]])


def test_scale_boxes_with_rotation_is_the_box_around_the_mapped_corners():
    M = cv2.getRotationMatrix2D((50, 40), 30, 1.5)
    d2i = cv2.invertAffineTransform(M)
    box = np.array([10.0, 20.0, 60.0, 45.0])
    corners = np.array([[10, 20], [60, 20], [60, 45], [10, 45]], float) - 0.5
    mapped = corners @ d2i[:, :2].T + d2i[:, 2] + 0.5
    expect = [*mapped.min(0), *mapped.max(0)]
    np.testing.assert_allclose(clkernels.scale_boxes(box, d2i), expect, atol=1e-9)
    with pytest.raises(ValueError, match="boxes must have shape"):
        clkernels.scale_boxes(np.zeros((3, 5)), d2i)
    with pytest.raises(ValueError, match="d2i must be"):
        clkernels.scale_boxes(box, np.zeros((2, 2, 3)))


def test_public_names_are_the_functions():
    assert clkernels.warp_affine is wa.warp_affine and clkernels.letterbox is wa.letterbox
    assert clkernels.scale_boxes is wa.scale_boxes
