"""Launch shapes chosen by measuring them on the device, kept with the program binaries.

An op whose launch shape has candidates (DCNv4's forward: tiles of output pixels, work-group
sizes, channels per work-item) asks :func:`choose` when it makes a call signature's plan. Every
candidate gives the same bits (each op's tests show it), so a choice changes only the speed.

- ``PYCLAD_AUTOTUNE=1`` (or :func:`set_mode` ``("tune")``): where no choice is stored for this
  device, op and shapes, the call measures the candidates on its own device arrays (each built,
  run once, then timed by its device events, median of 5, on a profiling queue of the same
  context; two rounds, the better kept), keeps the fastest and stores it. The first call of each shape then costs the builds
  and runs of every candidate (about a second or two on a GPU driver); later calls and later
  processes cost nothing more.
- Default (``"cached"``): a stored choice is used, nothing is measured.
- ``PYCLAD_AUTOTUNE=0`` (``"off"``): neither; the device's default shape.

The choices live in the program cache (:mod:`clkernels.cache`, ``tuning/``): keyed by the code's
fingerprint, the device's identity (driver version included), the op and the shapes, written
atomically; a record that does not parse, or names another device or a configuration this code
refuses, is ignored with a warning. Calls on host (numpy) arrays, on the simulator, or with an
explicit ``config=`` never measure.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Callable, Optional, Sequence

from . import cache

ENV = "PYCLAD_AUTOTUNE"
MODES = ("tune", "cached", "off")
RUNS = 5                    # timed runs per candidate and round, after one untimed
ROUNDS = 2
_mode: Optional[str] = None     # set_mode's; None: from the environment
_measured: list = []        # (what, shape_key, {candidate: seconds}) of this process, for tests and reports


def mode() -> str:
    """``"tune"``, ``"cached"`` or ``"off"``: :func:`set_mode`'s, else ``PYCLAD_AUTOTUNE``'s
    (``1``: tune, ``0``: off; unset or empty: cached)."""
    if _mode is not None:
        return _mode
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "cached"):
        return "cached"
    if value in ("1", "tune", "on", "true", "yes"):
        return "tune"
    if value in ("0", "off", "false", "no"):
        return "off"
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: use 1 (measure where nothing is stored), "
                     "0 (never; the device's defaults) or leave it unset (stored choices only)")


def set_mode(value: Optional[str]) -> None:
    """``"tune"``, ``"cached"`` or ``"off"`` for this process (None: back to ``PYCLAD_AUTOTUNE``)."""
    global _mode
    if value is not None and value not in MODES:
        raise ValueError(f"autotune mode {value!r}: choose from {', '.join(MODES)} (or None)")
    _mode = value


def measured() -> list:
    """What this process measured: ``(op, shapes, {candidate: seconds})`` per tuning."""
    return list(_measured)


def choose(runtime, what: str, shape_key, default, candidates: Callable[[], Sequence],
           measure: Optional[Callable[[object], float]]):
    """The launch configuration for ``what`` at ``shape_key`` on ``runtime``'s device.

    ``default`` (a dataclass instance) is the device's choice without measuring; ``candidates()``
    lists the configurations to measure (the same dataclass); ``measure(candidate)`` returns its
    seconds, or None where this call cannot measure (host arrays). A candidate that fails to
    build or launch (too many registers for its work-group, say: a ``ValueError``, a build error
    or the driver's own) is left out with a warning that names the error."""
    m = mode()
    if m == "off" or runtime.info.is_simulator:
        return default
    identity = cache.device_identity(runtime.device)
    key = cache.tuning_key(identity, what, shape_key)
    record = cache.load_tuning(key, identity)
    if record is not None:
        try:
            return type(default)(**record["choice"])
        except (TypeError, ValueError) as exc:
            warnings.warn(f"a stored {what} launch choice for this device is not a configuration this "
                          f"code takes ({exc}); using the default", cache.CacheWarning, stacklevel=3)
    if m != "tune" or measure is None:
        return default
    times = {}
    tried = list(dict.fromkeys([default, *candidates()]))      # in order, once each
    # Two rounds, each candidate's better one kept: the first runs of a process (clocks ramping
    # up, a driver's first-launch work) would otherwise count against whichever comes first.
    for _ in range(ROUNDS):
        for candidate in tried:
            if candidate in times and times[candidate] is None:
                continue
            try:
                t = measure(candidate)
            except Exception as exc:    # pyopencl's errors are not RuntimeErrors: any failure
                warnings.warn(f"autotune: {what} candidate {candidate} left out: "
                              f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)
                t = None
            times[candidate] = t if t is None or candidate not in times else min(times[candidate], t)
    times = {c: t for c, t in times.items() if t is not None}
    if not times:
        return default
    best = min(times, key=times.get)
    _measured.append((what, shape_key, dict(times)))
    cache.store_tuning(key, identity, {
        "what": what, "shapes": repr(shape_key), "choice": dataclasses.asdict(best),
        "times_ms": [[repr(c), t * 1e3] for c, t in times.items()]})
    return best


def event_seconds(launch: Callable[[], object], queue) -> float:
    """Median device time of ``launch()`` (which enqueues on ``queue``, a profiling queue, and
    returns its event) over RUNS runs after one untimed."""
    events = [launch() for _ in range(RUNS + 1)]
    queue.finish()
    times = sorted((e.profile.end - e.profile.start) * 1e-9 for e in events[1:])
    return times[len(times) // 2]       # the median (RUNS is odd)
