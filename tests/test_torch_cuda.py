"""CUDA tensors through the OpenCL ops on the same GPU (clkernels.interop): skipped where PyTorch
has no CUDA device or no OpenCL device shares memory with it (CI's machine has neither; the GPU
machine runs these). The references are the CPU tensors' path on the same OpenCL device."""
import gc
import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from clkernels.interop.torch_cuda import InteropUnavailable, bridge_for  # noqa: E402

try:
    BRIDGE = bridge_for(torch.device("cuda", 0))
except InteropUnavailable as exc:       # a CUDA GPU whose OpenCL driver cannot share memory: say why
    pytest.skip(f"no memory sharing here: {exc}", allow_module_level=True)

dcnv4_module = importlib.import_module("clkernels.dcnv4")
from clkernels.deformable_aggregation import deformable_aggregation_torch  # noqa: E402
from test_deformable_aggregation import problem, smooth_locations  # noqa: E402

CUDA = torch.device("cuda", 0)
OPTS = dict(group=4, group_channels=16, offset_scale=0.5)
CPU_DEVICE = BRIDGE.cl_device        # the CPU tensors' path on the same OpenCL device


def _dcnv4_inputs(seed=0, n=2, h=9, w=11, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, w, 64, generator=g).to(dtype)
    om = (torch.randn(n, h, w, 4 * 27 + 4, generator=g) * 0.5).to(dtype)
    go = torch.randn(n, h, w, 64, generator=g).to(dtype)
    return x, om, go


def _run_dcnv4(x, om, go):
    x, om = x.clone().requires_grad_(), om.clone().requires_grad_()
    out = dcnv4_module.torch_dcnv4(x, om, device=CPU_DEVICE if x.device.type == "cpu" else None, **OPTS)
    out.backward(go)
    return out.detach(), x.grad, om.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dcnv4_values_and_gradients_match_the_cpu_tensors_path(dtype):
    x, om, go = _dcnv4_inputs(dtype=dtype)
    want = _run_dcnv4(x, om, go)
    got = _run_dcnv4(x.to(CUDA), om.to(CUDA), go.to(CUDA))
    assert all(g.device == CUDA for g in got)
    assert torch.equal(got[0].cpu(), want[0])                # the same kernel: the same bits
    tol = 1e-5 if dtype == torch.float32 else 1e-2           # the GPU's backward sums with atomics
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g.cpu().float(), w.float(), rtol=tol, atol=tol)


def _count_input_copies(monkeypatch):
    """A list that gets, for each input the bridge takes, whether it was copied into the pool."""
    copies = []
    original = BRIDGE.in_pool

    def counting(t, settled=False):
        result = original(t, settled)
        copies.append(result[0].data_ptr() != t.data_ptr())
        return result
    monkeypatch.setattr(BRIDGE, "in_pool", counting)
    return copies


def test_outputs_live_in_the_shared_pool_and_feed_the_next_call_without_a_copy(monkeypatch):
    x, om, _ = _dcnv4_inputs()
    x, om = x.to(CUDA), om.to(CUDA)
    out = dcnv4_module.torch_dcnv4(x, om, **OPTS)
    assert BRIDGE.pool.block_of_ptr(out.data_ptr()) is not None
    copies = _count_input_copies(monkeypatch)
    again = dcnv4_module.torch_dcnv4(out, om, **OPTS)
    assert copies == [False, True]       # out was in the pool; om (from torch's allocator) was copied
    assert torch.equal(again.cpu(), dcnv4_module.torch_dcnv4(out.cpu(), om.cpu(), device=CPU_DEVICE, **OPTS))


def test_deformable_aggregation_matches_and_passes_gradcheck_on_the_gpu():
    rng = np.random.default_rng(13)
    feat, shape, start, loc, weights = problem(rng, bs=1, A=2, P=2, cams=2, C=4, G=2, special=False)
    loc = smooth_locations(rng, loc, shape, margin=0.05)
    loc[0, 0, 0, 0] = [1.5, 0.5]
    cpu = (torch.from_numpy(feat), torch.from_numpy(shape.astype(np.int64)), torch.from_numpy(start.astype(np.int64)),
           torch.from_numpy(loc), torch.from_numpy(weights))
    gpu = tuple(t.to(CUDA) for t in cpu)
    for t in (gpu[0], gpu[3], gpu[4]):
        t.requires_grad_()
    out = deformable_aggregation_torch(*gpu)
    assert out.device == CUDA
    import clkernels
    with clkernels.use_device(CPU_DEVICE):
        want = deformable_aggregation_torch(*cpu)
    torch.testing.assert_close(out.detach().cpu(), want, rtol=1e-6, atol=1e-6)
    # float32 kernels: gradcheck's steps and tolerances as the CPU test's (no op takes float64)
    assert torch.autograd.gradcheck(deformable_aggregation_torch, gpu, eps=1e-3, atol=2e-3, rtol=2e-3,
                                    nondet_tol=1e-5)


def test_work_on_another_stream_is_waited_for():
    """The input is made by a long chain of kernels on a side stream, the op called in that
    stream's context: it reads the finished input."""
    x, om, _ = _dcnv4_inputs(seed=3, n=4, h=32, w=32)
    want = dcnv4_module.torch_dcnv4(x * 0.5, om, device=CPU_DEVICE, **OPTS)
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device=CUDA)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):                 # tens of milliseconds of work before the input is ready
            big = big @ big * 1e-3
        xs = x.to(CUDA, non_blocking=True) * 0.5 + big[0, 0] * 0
        out = dcnv4_module.torch_dcnv4(xs, om.to(CUDA), **OPTS)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), want)


def test_a_thousand_calls_keep_the_pool_the_same_size():
    x, om, _ = _dcnv4_inputs(seed=5)
    x, om = x.to(CUDA), om.to(CUDA)
    for _ in range(10):
        dcnv4_module.torch_dcnv4(x, om, **OPTS)
    gc.collect()
    before = BRIDGE.pool.stats()["bytes_held"]
    for _ in range(1000):
        out = dcnv4_module.torch_dcnv4(x, om, **OPTS)
    del out
    gc.collect()
    assert BRIDGE.pool.stats()["bytes_held"] == before


def test_a_tensor_freed_while_torch_still_reads_it_is_not_reused_too_early():
    """An output read by queued work on a side stream and dropped there: its block waits for that
    stream (the event recorded when it came back), so the calls that follow on the default stream,
    whose input copies take returned blocks, do not overwrite what the side stream still reads."""
    x, om, _ = _dcnv4_inputs(seed=7)
    x, om = x.to(CUDA), om.to(CUDA)
    first = dcnv4_module.torch_dcnv4(x, om, **OPTS)
    want = first.double().sum().item()
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device=CUDA)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):                  # tens of milliseconds of work, then the read of `first`
            big = big @ big * 1e-3
        total = first.double().sum() + big[0, 0].double() * 0
        del first
        gc.collect()
    for seed in range(5):                    # inputs of the same size copied into returned blocks
        xi = _dcnv4_inputs(seed=100 + seed)[0].to(CUDA)
        dcnv4_module.torch_dcnv4(xi, om, **OPTS)
    torch.cuda.synchronize()
    assert total.item() == want


def test_index_tables_are_read_again_when_they_change():
    t = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32, device=CUDA)
    assert BRIDGE.host_table(t).tolist() == [[1, 2], [3, 4]]
    assert BRIDGE.host_table(t) is BRIDGE.host_table(t)        # read once while unchanged
    t.add_(1)                                                    # in place: a new version
    assert BRIDGE.host_table(t).tolist() == [[2, 3], [4, 5]]
    u = t.clone()
    u[0, 0] = 9                                                  # another tensor: its own values
    assert BRIDGE.host_table(u).tolist() == [[9, 3], [4, 5]]


def test_the_dcnv4_module_on_cuda_tensors_matches_it_on_cpu_ones():
    from clkernels.torch import DCNv4
    import clkernels
    torch.manual_seed(1)
    m = DCNv4(channels=64, group=4, dw_kernel_size=3, center_feature_scale=True)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    x = torch.randn(2, 81, 64)
    with clkernels.use_device(CPU_DEVICE):
        want = m(x)
    got = m.to(CUDA)(x.to(CUDA))
    assert got.device == CUDA
    # The linear layers run in cuBLAS on one side and on the CPU on the other: float32 rounding.
    torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-4)
    got.square().mean().backward()
    assert all(p.grad is not None and p.grad.device == CUDA for p in m.parameters())


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_batch_function_takes_and_returns_cuda_tensors(backend):
    """Values and Jacobians of every observation's Snavely residual from CUDA tensors (the index
    stays on the GPU), equal to the same call with numpy arrays on the same OpenCL device."""
    import pyclad as pc
    from solvers.models.snavely import snavely_residual
    rng = np.random.default_rng(4)
    cams = rng.normal(0, 0.1, (7, 9))
    cams[:, 6] = 500 + rng.random(7)
    cams[:, 5] = -5
    pts = rng.normal(0, 1, (40, 3))
    index = np.stack([rng.integers(0, 7, 300), rng.integers(0, 40, 300)], axis=1).astype(np.int32)
    obs = rng.normal(0, 50, (300, 2))
    f = pc.BatchFunction(snavely_residual, params=(9, 3), data=2, backend=backend, device=CPU_DEVICE)
    want, want_j = f.values_and_jacobians([cams, pts], index, data=obs)
    t = lambda a: torch.from_numpy(a).to(CUDA)  # noqa: E731
    got, got_j = f.values_and_jacobians([t(cams), t(pts)], t(index), data=t(obs))
    assert got.device == CUDA and all(j.device == CUDA for j in got_j)
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    for g, w in zip(got_j, want_j):
        np.testing.assert_array_equal(g.cpu().numpy(), w)
    assert torch.equal(f.values([t(cams), t(pts)], t(index), data=t(obs)).cpu(), torch.from_numpy(want))


def test_letterbox_and_warp_affine_on_cuda_images():
    from clkernels.torch import letterbox, warp_affine
    import clkernels
    rng = np.random.default_rng(9)
    images = torch.from_numpy(rng.integers(0, 256, (3, 45, 61, 3), dtype=np.uint8))
    M = torch.tensor([[0.6, 0.1, 3.0], [-0.1, 0.6, 2.0]], dtype=torch.float64)
    with clkernels.use_device(CPU_DEVICE):
        want, want_d2i = letterbox(images, (64, 48), dtype=torch.float16)
        want_w = warp_affine(images[1], M, (40, 30))
    blob, d2i = letterbox(images.to(CUDA), (64, 48), dtype=torch.float16)
    warped = warp_affine(images[1].to(CUDA), M, (40, 30))
    assert blob.device == CUDA and warped.device == CUDA and BRIDGE.pool.block_of_ptr(blob.data_ptr()) is not None
    assert torch.equal(blob.cpu(), want) and torch.equal(d2i.cpu(), want_d2i) and torch.equal(warped.cpu(), want_w)


def test_out_in_the_pool_is_written_in_place_and_any_other_by_one_copy(monkeypatch):
    from clkernels import torch_autograd
    from clkernels.torch import empty, letterbox
    x, om, _ = _dcnv4_inputs()
    want = dcnv4_module.torch_dcnv4(x, om, device=CPU_DEVICE, **OPTS)
    x, om = x.to(CUDA), om.to(CUDA)
    copies = []
    original = torch_autograd.write_out
    monkeypatch.setattr(torch_autograd, "write_out", lambda *a: copies.append(1) or original(*a))
    pooled = empty(want.shape, device=CUDA)
    assert BRIDGE.block_of(pooled) is not None
    assert dcnv4_module.torch_dcnv4(x, om, out=pooled, **OPTS) is pooled and copies == []
    plain = torch.empty(want.shape, device=CUDA)          # torch's own allocator: one copy into it
    assert dcnv4_module.torch_dcnv4(x, om, out=plain, **OPTS) is plain and copies == [1]
    assert torch.equal(pooled.cpu(), want) and torch.equal(plain.cpu(), want)
    images = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (45, 61, 3), dtype=np.uint8))
    blob = empty(1, 3, 48, 64, device=CUDA)
    got, _ = letterbox(images.to(CUDA), (64, 48), out=blob)
    assert got is blob and copies == [1]
    import clkernels
    with clkernels.use_device(CPU_DEVICE):
        want_blob, _ = letterbox(images, (64, 48))
    assert torch.equal(blob.cpu(), want_blob)


def test_a_pool_tensor_from_empty_is_an_input_without_a_copy(monkeypatch):
    from clkernels.torch import empty
    x, om, _ = _dcnv4_inputs()
    xs = empty(x.shape, device=CUDA)
    xs.copy_(x.to(CUDA))
    copies = _count_input_copies(monkeypatch)
    got = dcnv4_module.torch_dcnv4(xs, om.to(CUDA), **OPTS)
    assert copies == [False, True]
    assert torch.equal(got.cpu(), dcnv4_module.torch_dcnv4(x, om, device=CPU_DEVICE, **OPTS))
