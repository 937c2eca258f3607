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

__all__ = ["autograd_function", "check_devices", "write_out", "call_into", "apply", "cuda_bridge", "numpy_of",
           "tensor_of"]


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


def _check_out(out, tensors: Sequence, names: Sequence[str], wrapper: str, dtype=None) -> None:
    """Check an ``out=`` tensor before any work: a tensor (of ``dtype``, the result's, where
    given), outside autograd (as torch's own ``out=`` functions: nothing records how it was
    written), and sharing no memory with an input (the op reads its inputs while it writes
    ``out``). Its shape is checked where it is written."""
    import torch
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{wrapper}: out must be a torch.Tensor, not {type(out).__name__}")
    if dtype is not None and out.dtype != dtype:
        raise ValueError(f"{wrapper}: out is {out.dtype}, the result {dtype}; pass an out of the result's dtype")
    if torch.is_grad_enabled():
        grads = (["out"] if out.requires_grad else []) + \
            [n for t, n in zip(tensors, names) if getattr(t, "requires_grad", False)]
        if grads:
            raise RuntimeError(f"{wrapper}: out= takes no part in autograd, and {grads[0]} requires grad; "
                               "call it without out= (the result is then differentiable), or under torch.no_grad()")
    if out.numel():
        mine = out.untyped_storage().data_ptr()
        for t, n in zip(tensors, names):
            if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() == mine:
                raise ValueError(f"{wrapper}: out shares its memory with {n}, which the op reads while it "
                                 "writes out; pass a tensor of its own")


def write_out(out, result, wrapper: str):
    """``out`` with ``result`` copied into it (one copy, on the current stream for CUDA tensors),
    after checking that their shapes and dtypes are the same (``copy_`` would broadcast and cast)."""
    if tuple(out.shape) != tuple(result.shape) or out.dtype != result.dtype:
        raise ValueError(f"{wrapper}: out is {out.dtype} {tuple(out.shape)}, the result {result.dtype} "
                         f"{tuple(result.shape)}; pass an out of the result's shape and dtype")
    out.copy_(result)
    return out


def _mark_written(t):
    """``t``, its version counter advanced as an in-place op's would be: an op that wrote its memory
    directly (not through torch) must say so, or a graph that saved ``t`` for its backward would
    use the new values without the error torch gives ("modified by an inplace operation")."""
    from torch.autograd.graph import increment_version
    increment_version(t)
    return t


def apply(function, tensors: Sequence, options: dict, wrapper: str, names: Sequence[str],
          allow_host_copy: bool = False, out=None):
    """``function.apply(*tensors, options)`` for CPU or CUDA tensors. CUDA tensors need the interop
    (:mod:`clkernels.interop.torch_cuda`); where it is unavailable the error says why, unless
    ``allow_host_copy``: then the tensors go through host memory, with a warning once.

    ``out``: a tensor to write the result into, returned (see :func:`call_into`)."""
    if out is not None:
        # (the result has the first input's dtype: the features of both ops)
        op = function.forward_arrays
        return call_into(lambda *a, out=None: op(*a, out=out, **options), tensors, names, wrapper, out,
                         dtype=getattr(tensors[0], "dtype", None), allow_host_copy=allow_host_copy,
                         device=options.get("device"))
    cuda = check_devices(tensors, names, wrapper)
    if cuda is None:
        return function.apply(*tensors, options)
    if cuda_bridge(cuda, wrapper, allow_host_copy, options.get("device")) is None:
        out = function.apply(*(t.cpu() if hasattr(t, "cpu") else t for t in tensors), options)
        return out.to(cuda)
    return function.apply(*tensors, options)


def call_into(fn, tensors: Sequence, names: Sequence[str], wrapper: str, out, *, dtype=None,
              allow_host_copy: bool = False, device=None, n_outputs: int = 1, host_ints: bool = True):
    """``fn(*arrays, out=array or None)`` on CPU or CUDA tensors, outside autograd, with its (first)
    result in ``out``, returned in the result's place; the other results as tensors on the
    tensors' device.

    ``out`` is checked before any work: a tensor of ``dtype`` (the result's, where given), not
    sharing memory with an input, and not while grad mode records an input (or ``out``) that
    requires grad, as torch's own ``out=`` functions; its shape where it is written. The op
    writes into ``out`` itself where it can: a contiguous CPU tensor, a CUDA tensor of the
    shared pool (:func:`clkernels.torch.empty`); any other gets the result by one copy.
    ``device``: the wrapper's ``device=`` (CPU tensors only); ``n_outputs``, ``host_ints``: as
    :meth:`~clkernels.interop.torch_cuda.CudaBridge.run`."""
    _check_out(out, tensors, names, wrapper, dtype)
    cuda = check_devices(list(tensors) + [out], list(names) + ["out"], wrapper)
    bridge = cuda_bridge(cuda, wrapper, allow_host_copy, device) if cuda is not None else None
    if bridge is not None:
        run = dict(n_outputs=n_outputs, host_ints=host_ints)
        written = bridge.block_of(out) is not None          # in the pool: the op writes it
        results = bridge.run(fn, tensors, into=out, **run) if written else bridge.run(fn, tensors, **run)
        results = list(results) if isinstance(results, tuple) else [results]
    else:
        if cuda is not None:                                 # the host path
            tensors = [t.cpu() if hasattr(t, "cpu") else t for t in tensors]
        target = numpy_of(out) if cuda is None and out.is_contiguous() else None  # out's own memory
        results = fn(*(numpy_of(t) for t in tensors), out=target)
        results = list(results) if isinstance(results, tuple) else [results]
        results = [tensor_of(r) if cuda is None else tensor_of(r).to(cuda) for r in results]
        written = target is not None
    first = _mark_written(out) if written else write_out(out, results[0], wrapper)
    return (first, *results[1:]) if n_outputs > 1 else first


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

    Function.forward_arrays = staticmethod(forward)    # apply(out=...) calls it outside autograd
    Function.__name__ = Function.__qualname__ = name
    Function.__doc__ = f"{name}: an autograd Function over CPU or CUDA tensors through the OpenCL kernels."
    return Function
