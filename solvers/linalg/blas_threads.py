"""Run a small dense LAPACK call on one thread.

OpenBLAS starts its threads for matrices of a few hundred rows; on a machine whose cores are busy
(the OpenCL CPU device's workers, other processes) such a call can wait 10-100x longer than it
computes. The reduced camera matrix of a BAL problem is that small, so its Cholesky runs on one
thread: the OpenBLAS libraries loaded in this process (numpy's and scipy's builds) are found in
/proc/self/maps and their thread count set to 1 for the duration, then restored. Where none is
found (another BLAS, another OS) nothing changes.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

_lock = threading.Lock()
_controls = None


def _find_controls():
    found = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return found
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
            get, put = f"{prefix}_get_num_threads{suffix}", f"{prefix}_set_num_threads{suffix}"
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                found.append((getter, setter))
                break
    return found


@contextlib.contextmanager
def single_threaded_blas():
    """Inside the block, OpenBLAS uses one thread (restored afterwards)."""
    global _controls
    with _lock:
        if _controls is None:
            _controls = _find_controls()
        before = [(setter, getter()) for getter, setter in _controls]
        for setter, _ in before:
            setter(1)
        try:
            yield
        finally:
            for setter, n in before:
                setter(n)
