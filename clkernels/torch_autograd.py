"""One factory for the ops' ``torch.autograd.Function`` wrappers (torch is optional and is
imported only when a wrapper is first used).

The wrappers take CPU tensors, share their memory with numpy (no copy for contiguous
tensors; ``torch.bfloat16`` becomes ``ml_dtypes.bfloat16`` on the same bits) and call the op's
numpy path; the backward calls the op's backward function and
hands torch the gradients of the differentiable inputs.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence, Tuple

import numpy as np

from . import dtypes

__all__ = ["autograd_function", "check_cpu"]


def check_cpu(tensors: Sequence, names: Sequence[str], wrapper: str) -> None:
    """A tensor on another device than the CPU is an error naming it and the fix."""
    for t, name in zip(tensors, names):
        device = getattr(t, "device", None)
        if device is not None and device.type != "cpu":
            raise ValueError(f"{name} is on {device}; {wrapper} takes CPU tensors "
                             f"(use {name}.cpu())")


def _numpy(t):
    """A CPU tensor's memory as a numpy array (torch.bfloat16 as ml_dtypes.bfloat16)."""
    import torch
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:       # numpy has no bfloat16 of its own: the same bits
        return t.view(torch.int16).numpy().view(dtypes.bfloat16())
    return t.numpy()


def _tensor(a):
    """A numpy result as a tensor on its memory (ml_dtypes.bfloat16 as torch.bfloat16)."""
    import torch
    if dtypes.is_bfloat16(a.dtype):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


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
            return _tensor(forward(*(_numpy(t) for t in tensors), **options))

        @staticmethod
        def backward(ctx, grad_out):
            grads = iter(backward(_numpy(grad_out), *(_numpy(t) for t in ctx.saved_tensors),
                                  **ctx.options))
            out = tuple(_tensor(next(grads)) if d else None for d in differentiable)
            return out + ((None,) if ctx.with_options else ())

    Function.__name__ = Function.__qualname__ = name
    Function.__doc__ = f"{name}: an autograd Function over CPU tensors through the OpenCL kernels."
    return Function
