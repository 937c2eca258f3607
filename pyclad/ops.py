"""The one table of operations: each op's forward expression and its vector-Jacobian
products, written once and used by every backend (the OpenCL code generator, the OpenCL
tape interpreter, the numpy interpreter and constant folding).

Expressions are in a small language that is valid both as OpenCL C and as Python over
numpy arrays: operands ``a``, ``b``, ``c``; the op's result ``r``; the incoming adjoint
``g``; numbers; ``+ - * /``, comparisons, and the functions of :data:`PY_FUNCTIONS`
(OpenCL builtins plus the ``pc_*`` helpers the kernels define in their preamble).

A vjp of ``None`` means the derivative with respect to that operand is structurally zero
(comparisons, a ``where`` condition): no adjoint code is emitted for it.

A ``where`` passes ``g`` to the taken branch and exactly 0 to the other. Inside the
branches of a ``where`` (the nodes it depends on), ops whose partial can be infinite for
finite operands (``sqrt`` at 0, a division by 0, ``log`` at 0, ...: :attr:`Op.singular`)
guard their vjp with ``g != 0``, so ``where(x > 0, sqrt(x), 0)`` has derivative 0 at
x = 0 rather than ``0 * inf = NaN``. Elsewhere nothing is guarded (as with Ceres' Jets, an
infinite partial times a zero adjoint is NaN), which keeps the kernels lean.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, Optional, Tuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    arity: int
    forward: str
    vjps: Tuple[Optional[str], ...]  # one per operand
    code: int = -1                   # op code for the tape kernel, set below
    singular: bool = False           # a partial can be infinite for finite operands
    function: Optional[str] = None   # the pyclad function that applies it (pc.sin, ...)
    doc: str = ""                    # that function's docstring, when more than "elementwise"

    @property
    def differentiable(self) -> bool:
        return any(v is not None for v in self.vjps)

    def vjp_exprs(self, guarded: bool = False) -> Tuple[Optional[str], ...]:
        """The vjps as the backends evaluate them; ``guarded``: a zero ``g`` gives exactly 0
        (used for singular ops inside a where's branches)."""
        if not (guarded and self.singular):
            return self.vjps
        return tuple(None if v is None else f"pc_where(g != 0, {v}, 0)" for v in self.vjps)


S = "singular"   # the op has a partial that is infinite somewhere on finite operands

_TABLE = [
    # name      arity  forward                 vjp per operand,                        pyclad function, flags
    ("add",     2, "a + b",                 ("g", "g")),
    ("sub",     2, "a - b",                 ("g", "-g")),
    ("mul",     2, "a * b",                 ("g * b", "g * a")),
    ("div",     2, "a / b",                 ("g / b", "-g * r / b"),                      None, S),
    ("neg",     1, "-a",                    ("-g",)),
    ("square",  1, "a * a",                 ("g * 2 * a",)),
    ("pow",     2, "pow(a, b)",             ("g * b * pow(a, b - 1)", "g * r * log(a)"),  "pow", S),
    ("sqrt",    1, "sqrt(a)",               ("g * 0.5 / r",),                             "sqrt", S),
    ("exp",     1, "exp(a)",                ("g * r",),                                   "exp"),
    ("log",     1, "log(a)",                ("g / a",),                                   "log", S),
    ("sin",     1, "sin(a)",                ("g * cos(a)",),                              "sin"),
    ("cos",     1, "cos(a)",                ("-g * sin(a)",),                             "cos"),
    ("tan",     1, "tan(a)",                ("g * (1 + r * r)",),                         "tan"),
    ("asin",    1, "asin(a)",               ("g / sqrt(1 - a * a)",),                     "asin", S),
    ("acos",    1, "acos(a)",               ("-g / sqrt(1 - a * a)",),                    "acos", S),
    ("atan",    1, "atan(a)",               ("g / (1 + a * a)",),                         "atan"),
    ("atan2",   2, "atan2(a, b)",           ("g * b / (a * a + b * b)", "-g * a / (a * a + b * b)"), "atan2", S),
    ("tanh",    1, "tanh(a)",               ("g * (1 - r * r)",),                         "tanh"),
    # |a| as Ceres' Jet does it: slope +1 at exactly 0.
    ("abs",     1, "fabs(a)",               ("pc_where(a < 0, -g, g)",),                  "abs"),
    # Ties go to the first operand; NaN in either operand gives NaN.
    ("minimum", 2, "pc_min(a, b)",          ("pc_where(a <= b, g, 0)", "pc_where(a <= b, 0, g)"), "minimum", "",
     "Elementwise minimum; the derivative follows the smaller operand (the first on ties)."),
    ("maximum", 2, "pc_max(a, b)",          ("pc_where(a >= b, g, 0)", "pc_where(a >= b, 0, g)"), "maximum", "",
     "Elementwise maximum; the derivative follows the larger operand (the first on ties)."),
    ("where",   3, "pc_where(a != 0, b, c)", (None, "pc_where(a != 0, g, 0)", "pc_where(a != 0, 0, g)"), "where", "",
     "``where(cond, a, b)``: ``a`` where ``cond`` is non-zero, else ``b``: a select with no branch "
     "in the kernel.\n\nThe derivative flows through the taken branch only; the other branch "
     "receives exactly zero. Both branches are evaluated, so keep the untaken one finite (for "
     "example ``where(x > 0, sqrt(where(x > 0, x, 1)), 0)``) if its derivative could be infinite."),
    ("lt",      2, "pc_where(a < b, 1, 0)",  (None, None)),
    ("le",      2, "pc_where(a <= b, 1, 0)", (None, None)),
    ("gt",      2, "pc_where(a > b, 1, 0)",  (None, None)),
    ("ge",      2, "pc_where(a >= b, 1, 0)", (None, None)),
    ("eq",      2, "pc_where(a == b, 1, 0)", (None, None)),
    ("ne",      2, "pc_where(a != b, 1, 0)", (None, None)),
    ("and",     2, "pc_where(a != 0, pc_where(b != 0, 1, 0), 0)", (None, None)),
    ("or",      2, "pc_where(a != 0, 1, pc_where(b != 0, 1, 0))", (None, None)),
    ("not",     1, "pc_where(a != 0, 0, 1)", (None,)),
]


def _op(code, name, arity, forward, vjps, function=None, flags="", doc=""):
    return Op(name, arity, forward, vjps, code, flags == S, function, doc)


OPS: Dict[str, Op] = {row[0]: _op(code, *row) for code, row in enumerate(_TABLE)}

# Superinstructions of the tape interpreter (pyclad.tape fuses a product into the sum that is
# its only use): one dispatch and no stored product instead of two instructions. Not functions
# users call; their vjps are the chain rule through the two ops, written so that each partial
# is computed exactly as the unfused pair computes it (pc_mul keeps the compiler from
# contracting the product and the sum into an FMA, which the unfused pair never does).
_FUSED = [
    ("muladd",  3, "pc_mul(a, b) + c",      ("g * b", "g * a", "g")),
    ("mulsub",  3, "pc_mul(a, b) - c",      ("g * b", "g * a", "-g")),
    ("mulrsub", 3, "c - pc_mul(a, b)",      ("(-g) * b", "(-g) * a", "g")),
]
FUSED: Dict[str, Op] = {row[0]: _op(len(_TABLE) + i, *row) for i, row in enumerate(_FUSED)}

# The pyclad functions the table defines, in table order (pyclad.vector makes them).
FUNCTIONS: Tuple[str, ...] = tuple(op.function for op in OPS.values() if op.function)

# Leaves of a graph are not in the table: they have no expression of their own.
LEAVES = ("input", "data", "const")

# The pc_* helpers the expressions use: each one's OpenCL C definition (every kernel's preamble,
# pyclad/preamble.cl.mako, renders these) and the same in numpy, side by side.
HELPERS = (
    # An elementwise select; for vectors the condition is the comparison's per-lane mask.
    ("pc_where", "#define pc_where(c, x, y) ((c) ? (real_t)(x) : (real_t)(y))",
     lambda c, x, y: np.where(c, x, y)),
    # NaN in either operand gives NaN (fmin/fmax would drop it).
    ("pc_min", "real_t pc_min(real_t a, real_t b) { return (isnan(a) || a < b) ? a : b; }",
     lambda x, y: np.where(np.isnan(x) | (x < y), x, y)),
    ("pc_max", "real_t pc_max(real_t a, real_t b) { return (isnan(a) || a > b) ? a : b; }",
     lambda x, y: np.where(np.isnan(x) | (x > y), x, y)),
    # A product that stays rounded on its own (the fused ops above): the compiler contracts
    # a * b + c within one expression, but not across a call.
    ("pc_mul", "real_t pc_mul(real_t a, real_t b) { return a * b; }", lambda x, y: x * y),
)

# The functions expressions may call, as numpy: OpenCL builtins, then the helpers.
PY_FUNCTIONS = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "atan2": np.arctan2, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "pow": np.power, "tanh": np.tanh, "fabs": np.abs,
    **{name: fn for name, _, fn in HELPERS},
}

_OPERAND = re.compile(r"\b([abcrg])\b")
_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*|\d*\.\d+)(?![\w.])")


def to_c(expr: str, names: Dict[str, str], real: str = "double") -> str:
    """Render an expression as OpenCL C with operands renamed (``names`` maps a/b/c/r/g).

    Float literals get an ``f`` suffix in float kernels, so no float kernel computes in
    double by accident (and none needs cl_khr_fp64)."""
    out = _OPERAND.sub(lambda m: names[m.group(1)], expr)
    if real == "float":
        out = _FLOAT_LITERAL.sub(lambda m: m.group(1) + "f", out)
    return out


def evaluate(expr: str, **values):
    """Evaluate an expression over numpy values (a, b, c, r, g as keywords)."""
    with np.errstate(all="ignore"):  # NaN/Inf propagate per element, as on the device
        return eval(expr, {"__builtins__": {}}, {**PY_FUNCTIONS, **values})  # noqa: S307
