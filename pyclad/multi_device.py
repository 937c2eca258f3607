"""A batch split across several OpenCL devices: ``f.values(..., devices=[...])``.

The tuples are cut into contiguous ranges, one per device, in proportion to each device's
throughput for this function as measured by the calls before (equal shares until one has run);
each range runs on its device's own queue, a thread per device waiting for it, so the devices work
at once; the outputs are gathered in tuple order. Every tuple is the single-device kernel's
arithmetic, so on devices that compile alike (two PoCL devices, two GPUs of one kind) the result
equals one device's bit for bit. Host (numpy) arrays only: every device gets the parameter tables
whole (a tuple may use any row) and its range of the index and data.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Sequence, Tuple

import numpy as np
import pyopencl as cl

from clkernels import arrays, get_runtime
from clkernels.runtime import Runtime, list_devices, select_device


def resolve(devices) -> List[Runtime]:
    """The runtimes of ``devices``: a list of device specs, ``pyopencl.Device`` or ``Runtime``
    objects, or ``"all"``: every GPU of the platform the default selection picks (every device
    of that platform when it has no GPU)."""
    if isinstance(devices, str):
        if devices != "all":
            raise ValueError(f"devices must be a list of devices or 'all', not {devices!r} "
                             "(for one device pass device=)")
        chosen = select_device(None)[0]
        same = [d for d in list_devices() if d.platform == chosen.platform]
        gpus = [d for d in same if d.type & cl.device_type.GPU]
        devices = gpus or same
    devices = list(devices)
    if not devices:
        raise ValueError("devices is empty: give at least one device")
    runtimes = [get_runtime(d) for d in devices]
    seen = set()
    for rt in runtimes:
        if rt.device.int_ptr in seen:
            raise ValueError(f"devices names {rt.info.name!r} twice: give each device once")
        seen.add(rt.device.int_ptr)
    return runtimes


def shares(n: int, rates: Sequence[float]) -> List[Tuple[int, int]]:
    """Contiguous ranges ``[a, b)`` of ``n`` tuples in proportion to ``rates``."""
    w = np.asarray(rates, np.float64)
    cuts = np.rint(np.cumsum(w) / w.sum() * n).astype(np.int64)
    cuts[-1] = n
    starts = np.concatenate(([0], cuts[:-1]))
    return [(int(a), int(b)) for a, b in zip(starts, cuts)]


class Throughputs:
    """Tuples per second of one function on each device, per set of devices (a device's share
    follows what it achieved beside the others): the mean of the last measurement and the one
    before. A device's first call is not measured (it builds the kernel), nor a range too short
    to time (under MIN_TIMED tuples)."""

    MIN_TIMED = 1024

    def __init__(self):
        self._rates = {}
        self._ran = set()
        self._lock = threading.Lock()

    def get(self, runtimes) -> List[float]:
        key = tuple(rt.device.int_ptr for rt in runtimes)
        with self._lock:
            return list(self._rates.get(key, [1.0] * len(runtimes)))

    def update(self, runtimes, counts, seconds):
        key = tuple(rt.device.int_ptr for rt in runtimes)
        with self._lock:
            rates = self._rates.get(key)
            for i, (rt, c, s) in enumerate(zip(runtimes, counts, seconds)):
                first = rt.device.int_ptr not in self._ran
                if c:
                    self._ran.add(rt.device.int_ptr)
                if first or c < self.MIN_TIMED or s <= 0:
                    continue
                if rates is None:       # the first measurement: the others as fast as this one
                    rates = [c / s] * len(runtimes)
                rates[i] = 0.5 * (rates[i] + c / s)
            if rates is not None:
                self._rates[key] = rates


def run(f, params, index, data, jacobians: bool, devices):
    """``f``'s outputs (and Jacobians) for host arrays, split across ``devices``
    (see the module docstring); what ``f._run`` returns for one device."""
    arrays_in = [*(params if isinstance(params, (list, tuple)) else [params]), index, data]
    if any(arrays.is_device_array(a) for a in arrays_in if a is not None):
        raise TypeError("devices= takes host (numpy) arrays; device arrays live on one device "
                        "already: call with device= instead")
    runtimes = resolve(devices)
    params, index, data = f._check(params, index, data)
    f._validate_range(None, params, index)          # once, for every range
    n = index.shape[0]
    ranges = shares(n, f._throughputs.get(runtimes))
    seconds = [0.0] * len(runtimes)

    def work(i):
        a, b = ranges[i]
        t0 = time.perf_counter()
        out = f._run(params, index[a:b], data[a:b] if data is not None else None, jacobians,
                     runtimes[i], index_checked=True)
        seconds[i] = time.perf_counter() - t0
        return out

    busy = [i for i, (a, b) in enumerate(ranges) if b > a] or [0]
    with ThreadPoolExecutor(max_workers=len(busy)) as pool:
        parts = list(pool.map(work, busy))
    f._throughputs.update(runtimes, [b - a for a, b in ranges], seconds)
    out = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    jacs = [np.concatenate([p[1][g] for p in parts]) if len(parts) > 1 else parts[0][1][g]
            for g in range(len(parts[0][1]))]
    return out, jacs
