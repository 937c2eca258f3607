"""A call's options besides its images, checked once per distinct set of values: the output size,
border, normalisation and dtype (:class:`Spec`, part of a plan's key), and warp_affine's matrix,
inverted once per distinct matrix."""
from __future__ import annotations

from typing import NamedTuple, Tuple

import numpy as np

from .. import arrays, dtypes
from .geometry import invert_affine
from .images import INT_MAX


class Spec(NamedTuple):
    """What a call computes besides its images (hashable: part of the plan's key)."""
    kernel: str       # "letterbox_blob" or "warp_hwc"
    dst_w: int
    dst_h: int
    border: tuple     # 3 levels, BGR
    values: tuple     # letterbox: scale0-2, shift0-2 per blob channel; warp: ()
    swap_rb: bool
    dtype: np.dtype   # of the result


_specs: dict = {}


def cached_spec(make, *values) -> Spec:
    """``make(*values)``, checked once per distinct set of option values (the checks cost
    more than a launch; a process uses a handful of option sets)."""
    key = (make, values, tuple(map(type, values)))
    try:
        return _specs[key]
    except KeyError:
        pass
    except TypeError:   # an unhashable option (a numpy array): checked on every call
        return make(*values)
    spec = make(*values)
    if len(_specs) < 1024:
        _specs[key] = spec
    return spec


def _channels(value, name: str, default=None) -> np.ndarray:
    """A scalar or 3 values, as float64 [3]."""
    v = np.asarray(default if value is None else value, dtype=np.float64).reshape(-1)
    if v.size == 1:
        v = np.repeat(v, 3)
    if v.size != 3 or not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be a finite number or 3 finite numbers, got {value!r}")
    return v


def _border(value, name: str) -> tuple:
    v = _channels(value, name)
    if np.any(v != np.round(v)) or np.any(v < 0) or np.any(v > 255):
        raise ValueError(f"{name} must be integers in [0, 255] (one, or three in the image's "
                         f"BGR order), got {value!r}")
    return tuple(float(b) for b in v)


def _size(size, name: str) -> Tuple[int, int]:
    if np.isscalar(size):
        size = (size, size)
    try:
        w, h = (int(s) for s in size)
        ok = all(float(s) == int(s) for s in size)
    except (TypeError, ValueError):
        w = h = 0
        ok = False
    if not ok or w <= 0 or h <= 0:
        raise ValueError(f"{name} must be (width, height) with positive integers, got {size!r}")
    if 3 * w * h > INT_MAX:
        raise ValueError(f"{name}={size!r} is too large (over 2^31 values per image)")
    return w, h


def letterbox_spec(size, fill, swap_rb, mean, std, alpha, beta, dtype) -> Spec:
    dst_w, dst_h = _size(size, "size")
    border = _border(fill, "fill")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float16) and not dtypes.is_bfloat16(dtype):
        raise TypeError(f"dtype must be np.float32, np.float16 or ml_dtypes.bfloat16 (storage), not {dtype}")
    alpha = float(alpha)
    if not np.isfinite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha}")
    if beta is not None:
        mean_given = np.any(_channels(mean, "mean", 0) != 0)
        std_given = np.any(_channels(std, "std", 1) != 1)
        if mean_given or std_given:
            raise ValueError("give either beta (v * alpha + beta) or mean/std "
                             "((v * alpha - mean) / std), not both")
        scale, shift = np.full(3, alpha), _channels(beta, "beta")
    else:
        mean, std = _channels(mean, "mean", 0), _channels(std, "std", 1)
        if np.any(std == 0):
            raise ValueError(f"std must not contain 0, got {std.tolist()}")
        scale, shift = alpha / std, -mean / std
    values = tuple(float(np.float32(v)) for v in (*scale, *shift))
    return Spec("letterbox_blob", dst_w, dst_h, border, values, bool(swap_rb), dtype)


def warp_spec(dsize, border_value) -> Spec:
    dst_w, dst_h = _size(dsize, "dsize")
    return Spec("warp_hwc", dst_w, dst_h, _border(border_value, "border_value"), (), False,
                 np.dtype(np.uint8))


_inverses: dict = {}


def inverse_of(M) -> np.ndarray:
    """warp_affine's destination-to-source matrix for ``M``, checked and inverted once per
    distinct matrix (a video pipeline warps with the same one again and again)."""
    if type(M) is np.ndarray and M.shape == (2, 3):
        key = (M.dtype.str, M.tobytes())
        d2i = _inverses.get(key)
        if d2i is None:
            d2i = invert_affine(_checked_matrix(M), "M")
            if len(_inverses) > 256:
                _inverses.clear()
            _inverses[key] = d2i
        return d2i
    return invert_affine(_checked_matrix(M), "M")


def _checked_matrix(M):
    M = arrays.check_array(M, "M", [np.float64, np.float32, np.int64, np.int32], shape=(2, 3))
    if arrays.is_device_array(M):
        raise TypeError("M must be a host array (2x3 numbers), not a device array")
    return M
