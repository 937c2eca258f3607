"""One factory for the ops' ``torch.autograd.Function`` wrappers (torch is imported only when a
wrapper is first used).

CPU tensors share their memory with numpy (no copy for contiguous tensors; ``torch.bfloat16``
becomes ``ml_dtypes.bfloat16`` on the same bits) and go through the op's numpy path. CUDA tensors
go through :mod:`clkernels.interop.torch_cuda`: the OpenCL device of the same GPU works on memory
that CUDA shares with it, and the results are CUDA tensors, with no host round trip. The backward
calls the op's backward function the same way and hands torch the gradients of the
differentiable inputs.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence, Tuple

import numpy as np

from . import dtypes

__all__ = ["autograd_function", "check_devices", "apply", "cuda_bridge", "numpy_of", "tensor_of"]


def check_devices(tensors: Sequence, names: Sequence[str], wrapper: str):
    """The one device of the tensors: None for CPU tensors, else the ``torch.device`` of CUDA ones;
    tensors on two devices, or on another kind of device, are an error naming them."""
    found = {}
    for t, name in zip(tensors, names):
        device = getattr(t, "device", None)
        if device is None:
            continue
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {device}; {wrapper} takes CPU or CUDA tensors")
        found.setdefault(device, name)
    if len(found) > 1:
        (d1, n1), (d2, n2) = list(found.items())[:2]
        raise ValueError(f"{n1} is on {d1} and {n2} on {d2}; {wrapper} takes its tensors on one device")
    device = next(iter(found), None)
    return device if device is not None and device.type == "cuda" else None


def apply(function, tensors: Sequence, options: dict, wrapper: str, names: Sequence[str],
          allow_host_copy: bool = False):
    """``function.apply(*tensors, options)`` for CPU or CUDA tensors. CUDA tensors need the interop
    (:mod:`clkernels.interop.torch_cuda`); where it is unavailable the error says why, unless
    ``allow_host_copy``: then the tensors go through host memory, with a warning once."""
    cuda = check_devices(tensors, names, wrapper)
    if cuda is None:
        return function.apply(*tensors, options)
    if cuda_bridge(cuda, wrapper, allow_host_copy, options.get("device")) is None:
        out = function.apply(*(t.cpu() if hasattr(t, "cpu") else t for t in tensors), options)
        return out.to(cuda)
    return function.apply(*tensors, options)


def cuda_bridge(cuda, wrapper: str, allow_host_copy: bool = False, device=None):
    """The :class:`~clkernels.interop.torch_cuda.CudaBridge` of CUDA device ``cuda``; where there is
    none, its error, or with ``allow_host_copy`` None (take the host path; warned once per wrapper).
    ``device``: the wrapper's ``device=``, which CUDA tensors do not take."""
    if device is not None:
        raise ValueError(f"{wrapper}: device= chooses the OpenCL device of CPU tensors; CUDA tensors run "
                         "on the OpenCL device of their own GPU (leave device= out)")
    from .interop.torch_cuda import InteropUnavailable, bridge_for, host_copy_warning
    try:
        return bridge_for(cuda)
    except InteropUnavailable as exc:
        if not allow_host_copy:
            raise
        host_copy_warning(wrapper, str(exc))
        return None


def _cuda_device(tensors):
    for t in tensors:
        device = getattr(t, "device", None)
        if device is not None and device.type == "cuda":
            return device
    return None


def numpy_of(t):
    """A CPU tensor's memory as a numpy array (torch.bfloat16 as ml_dtypes.bfloat16)."""
    import torch
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:       # numpy has no bfloat16 of its own: the same bits
        return t.view(torch.int16).numpy().view(dtypes.bfloat16())
    return t.numpy()


def tensor_of(a):
    """A numpy result as a tensor on its memory (ml_dtypes.bfloat16 as torch.bfloat16)."""
    import torch
    if dtypes.is_bfloat16(a.dtype):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _cuda_options(options: dict) -> dict:
    """The op's options for a CUDA call: without ``device`` (the bridge's queue decides)."""
    return {k: v for k, v in options.items() if k != "device"}


@functools.lru_cache(maxsize=None)
def autograd_function(name: str, forward: Callable, backward: Callable,
                      differentiable: Tuple[bool, ...]):
    """A ``torch.autograd.Function`` subclass named ``name``.

    ``forward(*arrays, **options)`` returns one numpy array; ``backward(grad_out, *arrays,
    **options)`` returns the gradients of the inputs marked in ``differentiable``, in order.
    Apply it as ``Function.apply(*tensors)`` or ``Function.apply(*tensors, options_dict)``:
    one tensor per entry of ``differentiable``, then optionally the ops' keyword options.
    """
    import torch
    n = len(differentiable)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            tensors, options = args[:n], (args[n] if len(args) > n else {})
            ctx.save_for_backward(*tensors)
            ctx.options, ctx.with_options = options, len(args) > n
            cuda = _cuda_device(tensors)
            if cuda is not None:
                from .interop.torch_cuda import bridge_for
                return bridge_for(cuda).run(lambda *a: forward(*a, **_cuda_options(options)), tensors)
            return tensor_of(forward(*(numpy_of(t) for t in tensors), **options))

        @staticmethod
        def backward(ctx, grad_out):
            saved = ctx.saved_tensors
            cuda = _cuda_device(saved)
            if cuda is not None:
                from .interop.torch_cuda import bridge_for
                grads = iter(bridge_for(cuda).run(
                    lambda *a: tuple(backward(*a, **_cuda_options(ctx.options))), [grad_out, *saved],
                    n_outputs=sum(differentiable)))
                out = tuple(next(grads) if d else None for d in differentiable)
            else:
                grads = iter(backward(numpy_of(grad_out), *(numpy_of(t) for t in saved), **ctx.options))
                out = tuple(tensor_of(next(grads)) if d else None for d in differentiable)
            return out + ((None,) if ctx.with_options else ())

    Function.__name__ = Function.__qualname__ = name
    Function.__doc__ = f"{name}: an autograd Function over CPU or CUDA tensors through the OpenCL kernels."
    return Function
