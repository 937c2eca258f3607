"""A ``BatchFunction`` batch split across several OpenCL devices: ``f.values(..., devices=[...])``.

The split, the threads and the measured shares are :mod:`clkernels.multi_device`'s. Here the
tuples are the batch: every device gets the parameter tables whole (a tuple may use any row) and
its range of the index and data. Every tuple is the one-device kernel's arithmetic, so on devices
that compile alike the result equals one device's bit for bit.
"""
from __future__ import annotations

import numpy as np

from clkernels import multi_device as md

# A device's share is too short to time below this many tuples.
MIN_TIMED = 1024


def throughputs() -> md.Throughputs:
    """The per-device rates of one function (each BatchFunction keeps its own)."""
    return md.Throughputs(min_timed=MIN_TIMED)


def run(f, params, index, data, jacobians: bool, devices):
    """``f``'s outputs (and Jacobians) for host arrays, split across ``devices``;
    what ``f._run`` returns for one device."""
    md.refuse_device_arrays([*(params if isinstance(params, (list, tuple)) else [params]), index, data])
    params, index, data = f._check(params, index, data)
    f._validate_range(None, params, index)          # once, for every range

    def work(rt, a, b):
        return f._run(params, index[a:b], data[a:b] if data is not None else None, jacobians, rt,
                      index_checked=True)

    parts = md.split(index.shape[0], devices, f._throughputs, work)
    if len(parts) == 1:
        return parts[0]
    out = np.concatenate([p[0] for p in parts])
    return out, [np.concatenate([p[1][g] for p in parts]) for g in range(len(parts[0][1]))]
