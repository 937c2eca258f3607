"""Work split across several OpenCL devices: the ``devices=`` argument of the batched ops
(here: the vision ops; ``pyclad.BatchFunction`` uses the same pieces).

A batch is cut into contiguous ranges, one per device, in proportion to each device's throughput
for that op as measured by the calls before (equal shares until one has run); each range runs on
its device's own queue, a thread per device waiting for it, so the devices work at once; the
results are gathered in order. Every item is the one-device op's arithmetic, so on devices that
compile alike (two PoCL devices, two GPUs of one kind) the result equals one device's bit for bit
wherever the op itself is deterministic (ops that sum with atomics are not). Host (numpy) arrays
only: device arrays live on one device already.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Sequence, Tuple

import numpy as np
import pyopencl as cl

from . import arrays
from .runtime import Runtime, get_runtime, list_devices, select_device


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
    seen = {}
    for i, rt in enumerate(runtimes):
        first = seen.setdefault(rt.device.int_ptr, i)
        if first != i:
            raise ValueError(f"devices names {rt.info.name!r} twice (entries {first} and {i}: "
                             f"{_entry(devices[first])} and {_entry(devices[i])}): give each device once")
    return runtimes


def _entry(d) -> str:
    return repr(d) if isinstance(d, str) else type(d).__name__


def shares(n: int, rates: Sequence[float]) -> List[Tuple[int, int]]:
    """Contiguous ranges ``[a, b)`` of ``n`` items in proportion to ``rates``."""
    w = np.asarray(rates, np.float64)
    cuts = np.rint(np.cumsum(w) / w.sum() * n).astype(np.int64)
    cuts[-1] = n
    starts = np.concatenate(([0], cuts[:-1]))
    return [(int(a), int(b)) for a, b in zip(starts, cuts)]


class Throughputs:
    """Items per second of one op on each device, per set of devices (a device's share follows
    what it achieved beside the others): the mean of the last measurement and the one before. A
    device's first call is not measured (it builds the kernels), nor a range under ``min_timed``
    items (too short to time)."""

    def __init__(self, min_timed: int = 1):
        self.min_timed = min_timed
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
                if first or c < self.min_timed or s <= 0:
                    continue
                if rates is None:       # the first measurement: the others as fast as this one
                    rates = [c / s] * len(runtimes)
                rates[i] = 0.5 * (rates[i] + c / s)
            if rates is not None:
                self._rates[key] = rates


def refuse_device_arrays(values, name: str = "devices="):
    if any(arrays.is_device_array(a) for a in values if a is not None):
        raise TypeError(f"{name} takes host (numpy) arrays; device arrays live on one device "
                        "already: call with device= instead")


def split(n: int, devices, throughputs: Throughputs, work: Callable[[Runtime, int, int], object]) -> list:
    """``work(runtime, a, b)`` for each device's range of ``n`` items, the devices at once;
    the results of the devices given a non-empty range, in order."""
    runtimes = resolve(devices)
    ranges = shares(n, throughputs.get(runtimes))
    seconds = [0.0] * len(runtimes)

    def one(i):
        (a, b), t0 = ranges[i], time.perf_counter()
        result = work(runtimes[i], a, b)
        seconds[i] = time.perf_counter() - t0
        return result

    busy = [i for i, (a, b) in enumerate(ranges) if b > a] or [0]
    with ThreadPoolExecutor(max_workers=len(busy)) as pool:
        results = list(pool.map(one, busy))
    throughputs.update(runtimes, [b - a for a, b in ranges], seconds)
    return results


_throughputs: dict = {}


def throughputs_of(op: str) -> Throughputs:
    """The :class:`Throughputs` of the op named ``op`` (one per op, made on first use)."""
    return _throughputs.setdefault(op, Throughputs())


def batched(op: str, call: Callable, batch_args: Sequence, devices, out=None, n_outputs: int = 1,
            device=None, queue=None):
    """An op's call split along the leading (batch) axis of ``batch_args``: ``call(*slices,
    out=..., device=runtime)`` per device; the outputs gathered in order (or written into
    ``out``'s slices, host arrays of the result's shape). ``n_outputs`` > 1: a tuple of outputs.
    ``device``/``queue``: the op's own arguments, which devices= excludes."""
    if device is not None or queue is not None:
        raise ValueError("pass device=/queue= (one device) or devices= (several), not both")
    # One entry per output, None where the output is to be made.
    outs = (out,) if n_outputs == 1 else (tuple(out) if out is not None else (None,) * n_outputs)
    refuse_device_arrays([*batch_args, *outs])
    n = len(batch_args[0])
    if any(len(a) != n for a in batch_args):
        raise ValueError(f"devices= splits the leading (batch) axis, which must be the same in every "
                         f"batched input; got {[len(a) for a in batch_args]}")
    if any(o is not None and len(o) != n for o in outs):
        raise ValueError(f"out must have the result's shape; its leading axis is not the batch's {n}")

    def work(rt, a, b):
        sliced = [x[a:b] for x in batch_args]
        if out is None:
            return call(*sliced, out=None, device=rt)
        part = tuple(None if o is None else o[a:b] for o in outs)
        return call(*sliced, out=part if n_outputs > 1 else part[0], device=rt)

    parts = split(n, devices, throughputs_of(op), work)
    if n_outputs == 1:
        return out if out is not None else np.concatenate(parts)
    return tuple(o if o is not None else np.concatenate([p[k] for p in parts]) for k, o in enumerate(outs))
