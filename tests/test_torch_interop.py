"""The CUDA interop's logic and error paths, on any machine (CPU torch, PoCL): which device a
wrapper's tensors are on, what a machine without the interop says, and the launch layer's
output-pool hook that the interop puts its shared memory behind. The GPU half is
``tests/test_torch_cuda.py`` (skipped without a CUDA device)."""
import importlib

import numpy as np
import pyopencl.array as cla
import pytest

import clkernels
from clkernels import dcnv4, torch_autograd

dcnv4_module = importlib.import_module("clkernels.dcnv4")     # (clkernels.dcnv4 is the function)
from clkernels.interop import opencl_external

torch = pytest.importorskip("torch")


class _OnDevice:
    """An object with a torch device, as a tensor on a device this machine may lack."""

    def __init__(self, device):
        self.device = torch.device(device)


def test_the_wrappers_tell_the_device_of_their_tensors():
    cpu = torch.zeros(2)
    assert torch_autograd.check_devices([cpu, cpu], ["a", "b"], "op") is None
    assert torch_autograd.check_devices([_OnDevice("cuda:1"), 3], ["a", "b"], "op") == torch.device("cuda:1")
    with pytest.raises(ValueError, match="a is on cpu and b on cuda:0; op takes its tensors on one device"):
        torch_autograd.check_devices([cpu, _OnDevice("cuda:0")], ["a", "b"], "op")
    with pytest.raises(ValueError, match="x is on meta; op takes CPU or CUDA tensors"):
        torch_autograd.check_devices([torch.zeros(2, device="meta")], ["x"], "op")


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests a machine without CUDA")
def test_cuda_tensors_without_cuda_say_why():
    from clkernels.interop.torch_cuda import InteropUnavailable
    x = _OnDevice("cuda:0")
    with pytest.raises(InteropUnavailable, match=r"no CUDA device.*allow_host_copy=True"):
        torch_autograd.apply(dcnv4_module._torch_function(), (x, x), {"device": None}, "torch_dcnv4",
                             ("input", "offset_mask"))
    with pytest.raises(ValueError, match="leave device= out"):
        torch_autograd.apply(dcnv4_module._torch_function(), (x, x), {"device": "pocl"}, "torch_dcnv4",
                             ("input", "offset_mask"))


def test_opencl_side_reports_what_a_device_lacks():
    for d in clkernels.list_devices():
        missing = opencl_external.missing_extensions(d)
        have = set(d.extensions.split())
        assert all(e not in have for e in missing if e.startswith("cl_"))
        if "cl_khr_device_uuid" in have:
            assert len(opencl_external.device_uuid(d)) == 16
    pocl = [d for d in clkernels.list_devices() if "Portable" in d.platform.name]
    if pocl:   # PoCL's CPU device shares no memory with CUDA
        assert "cl_khr_external_memory" in opencl_external.missing_extensions(pocl[0])


class _CountingPool:
    """An output allocator as the interop's: buffers of the runtime's context, counted."""

    def __init__(self, rt):
        self.rt, self.sizes, self.buffers = rt, [], []

    def allocate(self, nbytes):
        import pyopencl as cl
        self.sizes.append(nbytes)
        buf = cl.Buffer(self.rt.context, cl.mem_flags.READ_WRITE, max(1, nbytes))
        self.buffers.append(buf)
        return buf


def test_a_runtimes_output_pool_receives_the_outputs(device):
    """With Runtime.output_pool set, a launch's outputs come from it (and nothing else does):
    dcnv4 on device arrays, the same values as without it."""
    import pyopencl as cl
    rt = clkernels.get_runtime(device)
    if rt.info.is_simulator:
        pytest.skip("the launch layer's allocation path is the same on the simulator")
    q = cl.CommandQueue(rt.context, rt.device)
    from clkernels.runtime import runtime_for_queue
    own = runtime_for_queue(q)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 6, 32)).astype(np.float32)
    om = (rng.standard_normal((1, 6, 6, 112)) * 0.3).astype(np.float32)
    want = dcnv4(x, om, group=2, group_channels=16, device=rt)
    pool = _CountingPool(own)
    own.output_pool = pool
    try:
        out = dcnv4(cla.to_device(q, x), cla.to_device(q, om), group=2, group_channels=16)
    finally:
        own.output_pool = None
    assert pool.sizes == [want.nbytes]
    assert out.base_data.int_ptr == pool.buffers[0].int_ptr
    np.testing.assert_array_equal(out.get(), want)
    # Unset, the queue's own pool again.
    again = dcnv4(cla.to_device(q, x), cla.to_device(q, om), group=2, group_channels=16)
    assert len(pool.sizes) == 1
    np.testing.assert_array_equal(again.get(), want)


def test_batch_function_sends_cuda_tensors_to_the_interop():
    """BatchFunction tells CUDA tensors by their type's module and device, without importing
    torch itself; device= with them is an error, and without CUDA the interop says why."""
    import pyclad as pc

    class CudaTensorLike:
        def __init__(self):
            self.device = torch.device("cuda:0")
    CudaTensorLike.__module__ = "torch.testing_stand_in"
    f = pc.BatchFunction(lambda a, b: [a[0] * b[0]], params=(1, 1))
    x = CudaTensorLike()
    with pytest.raises(ValueError, match="leave device= and devices= out"):
        f.values([x, x], x, device="pocl")
    if not torch.cuda.is_available():
        from clkernels.interop.torch_cuda import InteropUnavailable
        with pytest.raises(InteropUnavailable, match="no CUDA device"):
            f.values([x, x], x)
