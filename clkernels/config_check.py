"""Field checks for the kernels' configuration dataclasses (``dcnv4.DCNv4Config``,
``deformable_aggregation.AggregationConfig``), run when one is made: a wrong value then names its
field and what it may be, instead of surfacing later as a driver or pyopencl error (a negative
work-group size reached pyopencl as ``std::bad_cast``)."""
from __future__ import annotations

import numbers


def integer(cls: str, field: str, value, minimum: int = 1, allowed=None, meaning: str = "") -> None:
    """``value`` an integer (not a bool) >= ``minimum``, and in ``allowed`` when given."""
    where = f"{cls}.{field}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where} must be an integer, got {type(value).__name__} {value!r}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{where} must be one of {', '.join(str(a) for a in allowed)}, got {value}")
    if value < minimum:
        raise ValueError(f"{where} must be an integer >= {minimum}{meaning}, got {value}")


def boolean(cls: str, field: str, value) -> None:
    if not isinstance(value, bool) and type(value).__name__ != "bool_":   # numpy's bool too
        raise TypeError(f"{cls}.{field} must be True or False, got {type(value).__name__} {value!r}")


def choice(cls: str, field: str, value, allowed) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{cls}.{field} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
