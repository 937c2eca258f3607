"""What a traced function works with: :class:`Vector` (a short vector of scalar nodes),
the math functions (on nodes, vectors or plain numbers), and the geometry helpers
(``dot``, ``cross``, ``norm``, ``rotate_angle_axis``)."""
from __future__ import annotations

from typing import Iterable, List, Union

import numpy as np

from .graph import Node
from .ops import FUNCTIONS as TABLE_FUNCTIONS, OPS

OPS_BY_FUNCTION = {op.function: op for op in OPS.values() if op.function}

Scalar = Union[Node, float, int]

# Ceres compares theta^2 with the double epsilon; using the same threshold makes the
# Jacobian at and near w = 0 match Ceres' exactly.
ANGLE_AXIS_EPSILON = float(np.finfo(np.float64).eps)
"""Below this squared angle :func:`rotate_angle_axis` takes the first-order branch, as Ceres' ``AngleAxisRotatePoint`` does."""


class Vector:
    """A fixed-length vector of traced scalars: indexing, slicing, elementwise arithmetic
    (with vectors of the same length, scalars or numbers), ``len`` and iteration."""
    __array_priority__ = 1000
    is_pyclad_vector = True   # a Node on the other side of an operator defers to the Vector

    def __init__(self, items: Iterable[Scalar], name: str = None):
        self.items: List[Scalar] = list(items)
        self.name = name      # what the traced function was given (its errors name it), or None

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return Vector(self.items[key])
        try:
            return self.items[key]
        except IndexError:
            if self.name is None:
                raise
            n = len(self.items)
            raise IndexError(f"the traced function reads {self.name}[{key}], but {self.name} has {n} "
                             f"entries ({self.name}[0] to {self.name}[{n - 1}]); give it at least "
                             f"{key + 1 if isinstance(key, int) and key >= 0 else n + 1} entries per row, "
                             "or read fewer") from None

    def __repr__(self):
        return f"Vector({self.items!r})"

    def _zip(self, other, fn):
        if isinstance(other, Vector):
            if len(other) != len(self):
                raise ValueError(f"vector lengths differ: {len(self)} and {len(other)}")
            return Vector(fn(a, b) for a, b in zip(self.items, other.items))
        if isinstance(other, (list, tuple, np.ndarray)):
            return self._zip(Vector(other), fn)
        return Vector(fn(a, other) for a in self.items)

    def __add__(self, o): return self._zip(o, lambda a, b: a + b)
    def __radd__(self, o): return self._zip(o, lambda a, b: b + a)
    def __sub__(self, o): return self._zip(o, lambda a, b: a - b)
    def __rsub__(self, o): return self._zip(o, lambda a, b: b - a)
    def __mul__(self, o): return self._zip(o, lambda a, b: a * b)
    def __rmul__(self, o): return self._zip(o, lambda a, b: b * a)
    def __truediv__(self, o): return self._zip(o, lambda a, b: a / b)
    def __rtruediv__(self, o): return self._zip(o, lambda a, b: b / a)
    def __pow__(self, o): return self._zip(o, lambda a, b: a ** b)
    def __rpow__(self, o): return self._zip(o, lambda a, b: b ** a)
    def __neg__(self): return Vector(-a for a in self.items)
    def __pos__(self): return self
    def __abs__(self): return Vector(abs(a) for a in self.items)

    def __bool__(self):
        raise TypeError("a pyclad Vector has no truth value; compare its elements and "
                        "use pyclad.where")


def vector(items: Iterable[Scalar]) -> Vector:
    """Build a :class:`Vector` from scalars, inside a traced function.

    Args:
        items: traced scalars or numbers.

    Returns:
        A :class:`Vector` of them, for elementwise arithmetic and the vector helpers.
    """
    return Vector(items)


def _graph_of(*values):
    for v in values:
        if isinstance(v, Node):
            return v.graph
        if isinstance(v, Vector):
            g = _graph_of(*v.items)
            if g is not None:
                return g
    return None


def _elementwise(name: str, *args):
    """Apply a table op to scalars or vectors (broadcasting scalars over vectors)."""
    length = next((len(a) for a in args if isinstance(a, Vector)), None)
    if length is not None:
        parts = [a if isinstance(a, Vector) else Vector([a] * length) for a in args]
        if any(len(p) != length for p in parts):
            raise ValueError(f"{name}: vector lengths differ")
        return Vector(_elementwise(name, *items) for items in zip(*(p.items for p in parts)))
    graph = _graph_of(*args)
    if graph is None:  # plain numbers: evaluate with the same table the kernels use
        from .ops import OPS, evaluate
        return float(evaluate(OPS[name].forward, **dict(zip("abc", map(np.float64, args)))))
    return graph.apply(name, *args)


def _table_function(op) -> callable:
    """The pyclad function of one row of the op table: elementwise over scalars, vectors and
    numbers (numbers alone are evaluated with the table's own expression)."""
    def fn(*args):
        if len(args) != op.arity:
            raise TypeError(f"{op.function}() takes {op.arity} argument{'s' if op.arity > 1 else ''}, "
                            f"got {len(args)}")
        return _elementwise(op.name, *args)
    fn.__name__ = fn.__qualname__ = op.function
    fn.__doc__ = (op.doc or f"Elementwise {op.function} of traced scalars, vectors or numbers.") + _OPERANDS.format(
        n=op.arity, s="" if op.arity == 1 else "s", name=op.function)
    return fn


# The reference's sections of every table function (the summary line is the table's own).
_OPERANDS = """

Args:
    *args: {n} operand{s}: traced scalars, :class:`Vector` objects of one length, or numbers,
        mixed in any order (a scalar or number is used for every entry of a vector).

Returns:
    A traced scalar; a :class:`Vector` when an operand is one; a float when every operand is a
    number (evaluated with the same expression the kernels use).

Raises:
    TypeError: not {n} operand{s}.
    ValueError: vectors of different lengths.
"""


# One function per row of pyclad/ops.py that names one: adding an op there adds it here and to
# the package. ``abs`` is kept as ``abs_`` in this module, which uses the builtin itself.
FUNCTIONS = {name: _table_function(OPS_BY_FUNCTION[name]) for name in TABLE_FUNCTIONS}
_ATTRIBUTE = {"abs": "abs_"}
globals().update({_ATTRIBUTE.get(name, name): fn for name, fn in FUNCTIONS.items()})
# The ones the geometry helpers below use, by name for the reader (and for static checks).
sqrt, where, sin, cos = (FUNCTIONS[name] for name in ("sqrt", "where", "sin", "cos"))


def dot(a: Vector, b: Vector) -> Scalar:
    """Inner product of two vectors of the same length.

    Args:
        a: a :class:`Vector` (or a sequence of traced scalars and numbers).
        b: another, of the same length.

    Returns:
        A traced scalar, ``sum(a[i] * b[i])``.

    Raises:
        ValueError: the lengths differ.
    """
    a, b = Vector(a), Vector(b)
    if len(a) != len(b):
        raise ValueError(f"dot: vector lengths differ: {len(a)} and {len(b)}")
    total = a[0] * b[0]
    for x, y in zip(a.items[1:], b.items[1:]):
        total = total + x * y
    return total


def cross(a: Vector, b: Vector) -> Vector:
    """Cross product of two 3-vectors.

    Args:
        a: a :class:`Vector` of length 3 (or a sequence of traced scalars and numbers).
        b: another.

    Returns:
        A :class:`Vector` of length 3, ``a x b``.

    Raises:
        ValueError: either is not of length 3.
    """
    a, b = Vector(a), Vector(b)
    if len(a) != 3 or len(b) != 3:
        raise ValueError("cross needs two 3-vectors")
    return Vector([a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]])


def norm(a: Vector) -> Scalar:
    """Euclidean norm, ``sqrt(dot(a, a))``.

    Args:
        a: a :class:`Vector` (or a sequence of traced scalars and numbers).

    Returns:
        A traced scalar. Its derivative at the zero vector is not finite, as ``sqrt``'s at 0.
    """
    return sqrt(dot(a, a))


def rotate_angle_axis(w: Vector, x: Vector) -> Vector:
    """Rotate ``x`` by the angle-axis vector ``w`` (Rodrigues), as Ceres'
    ``AngleAxisRotatePoint``: for theta^2 > DBL_EPSILON the closed form, otherwise the
    first-order ``x + w x x``, so values and Jacobians match Ceres', at w = 0 too.

    Both forms are traced and selected with :func:`where`; the closed form is fed a safe
    theta^2 of 1 when it is not taken, so its (unused) derivative stays finite."""
    w, x = Vector(w), Vector(x)
    if len(w) != 3 or len(x) != 3:
        raise ValueError("rotate_angle_axis needs two 3-vectors")
    theta2 = dot(w, w)
    big = theta2 > ANGLE_AXIS_EPSILON
    theta = sqrt(where(big, theta2, 1.0))
    cos_t, sin_t = cos(theta), sin(theta)
    unit = w * (1.0 / theta)
    full = x * cos_t + cross(unit, x) * sin_t + unit * (dot(unit, x) * (1.0 - cos_t))
    small = x + cross(w, x)
    rotated = Vector(where(big, f, s) for f, s in zip(full, small))
    graph = _graph_of(w, x)
    if graph is not None:   # the tape may run these nodes as one instruction (pyclad.regions)
        graph.mark_region("rotate_angle_axis", [*w.items, *x.items], rotated.items)
    return rotated


__all__ = ["Vector", "vector", "dot", "cross", "norm", "rotate_angle_axis", "ANGLE_AXIS_EPSILON",
           "FUNCTIONS", *(_ATTRIBUTE.get(name, name) for name in FUNCTIONS)]
