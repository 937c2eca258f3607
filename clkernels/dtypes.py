"""bfloat16, the storage type the ops take besides float32 and float16.

On the host a bfloat16 array is a numpy array of ``ml_dtypes.bfloat16`` (the dtype JAX and
TensorFlow use). ml_dtypes is optional: it is imported only by :func:`bfloat16`, and an array
of that dtype is recognised by its name, so nothing here imports it for a float32 or float16
call. On the device a bfloat16 element is a ``ushort`` holding the high half of a float
(:class:`clkernels.templates.Storage`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["BFLOAT16", "bfloat16", "is_bfloat16", "same", "name_of", "allowed", "require"]

# The name op tables list where a dtype is expected (launch.Param): the dtype object itself
# would need ml_dtypes at import time.
BFLOAT16 = "bfloat16"


def bfloat16() -> np.dtype:
    """``np.dtype(ml_dtypes.bfloat16)``; an ImportError that says how to get it."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("bfloat16 arrays need the ml_dtypes package: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (or the name ``"bfloat16"``)."""
    if isinstance(dtype, str):
        return dtype == BFLOAT16
    try:
        d = np.dtype(dtype)
    except TypeError:
        return False
    return d.name == BFLOAT16 and d.itemsize == 2


def from_torch(dtype):
    """A torch dtype as the numpy dtype of the same bits (``torch.bfloat16`` as ml_dtypes'),
    told by its name, so torch is not imported; anything else is returned as it is."""
    name = str(dtype)
    if not name.startswith("torch."):
        return dtype
    name = name[len("torch."):]
    return bfloat16() if name == BFLOAT16 else np.dtype(name)


def same(dtype, allowed) -> bool:
    """Whether ``dtype`` is ``allowed`` (a numpy dtype, or :data:`BFLOAT16`)."""
    return is_bfloat16(dtype) if is_bfloat16(allowed) else np.dtype(dtype) == allowed


def name_of(dtype) -> str:
    """How errors spell a dtype (``np.float32``, ``ml_dtypes.bfloat16``)."""
    return "ml_dtypes.bfloat16" if is_bfloat16(dtype) else f"np.{np.dtype(dtype)}"


def allowed(dtypes) -> tuple:
    """A table of allowed dtypes as numpy dtypes, :data:`BFLOAT16` kept as its name."""
    return tuple(d if is_bfloat16(d) else np.dtype(d) for d in dtypes)


def require(name: str, dtype, dtypes, why: str = "") -> None:
    """A TypeError naming the argument ``name`` and the fix unless ``dtype`` is one of
    ``dtypes`` (``why``: what the error adds after the list, e.g. " like input")."""
    if dtype in dtypes:     # the usual case, and fast (a launch checks every array it takes)
        return
    if not any(same(dtype, d) for d in dtypes):
        dtypes = allowed(dtypes)
        names = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} has dtype {dtype}, expected {names}{why}; "
                        f"convert it with {name}.astype({name_of(dtypes[0])})")
