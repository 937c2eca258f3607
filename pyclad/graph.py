"""The computation graph that tracing builds: scalar nodes, constant folding, common
subexpression elimination, and the forward/reverse orders.

Nodes are created through :meth:`Graph.apply`, which folds constants, applies a few
algebraic identities that are exact in IEEE arithmetic (x + 0, x * 1, x - 0, x / 1,
--x), and reuses an existing node with the same op and operands (CSE by hash-consing).
Node ids therefore increase in creation order, which is a valid forward order; the
evaluation order used by the backends is a topological sort from the outputs, which also
drops nodes the outputs do not need.
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .ops import LEAVES, OPS, evaluate

CONTROL_FLOW_HELP = (
    "a traced pyclad value has no truth value: Python control flow (if/while/and/or on a "
    "traced value) cannot be recorded in the graph. Use pyclad.where(cond, a, b) to select "
    "between two values, pyclad.minimum/maximum, or & and | to combine conditions.")


class Node:
    """A scalar value in a traced function: what a traced function's arguments hold and what
    operations on them return.

    Nodes are made by tracing (:func:`pyclad.trace`, :class:`pyclad.BatchFunction`), not by
    hand. Arithmetic (``+ - * / **``, unary ``-`` and ``+``, ``abs``) with numbers and other
    nodes of the same graph gives new nodes; constants are folded and an equal node already in
    the graph is reused. Comparisons (``< <= > >= == !=``) and ``& | ~`` give condition nodes
    of value 1.0 or 0.0, with no derivative, for :func:`pyclad.where`. With a
    :class:`pyclad.Vector` on the other side an operator is the Vector's, elementwise.

    Args:
        graph: the graph the node belongs to.
        node_id: its index in the graph.

    Attributes:
        graph: the graph the node belongs to.
        id: the node's index in the graph; ids increase in creation order.

    Raises:
        TypeError: ``bool()`` of a node (Python ``if``, ``while``, ``and``, ``or`` on a traced
            value; use :func:`pyclad.where`), ``float()`` of a node that depends on the
            inputs, use as an index, or an operand that is neither a number nor a node.
        ValueError: an operand that is a node of another traced function.
    """
    __slots__ = ("graph", "id")
    __array_priority__ = 1000  # numpy scalars on the left defer to Node's operators

    def __init__(self, graph: "Graph", node_id: int):
        self.graph, self.id = graph, node_id

    # -- arithmetic ---------------------------------------------------------------
    # With a pyclad Vector on the other side the operators return NotImplemented, so that Python
    # calls the Vector's reflected operator (x[0] * v is v.__rmul__(x[0]), elementwise).
    def _op(self, name, *others):
        return self.graph.apply(name, self, *others)

    def _binary(self, name, o):
        return NotImplemented if getattr(o, "is_pyclad_vector", False) else self.graph.apply(name, self, o)

    def _reflected(self, name, o):
        return NotImplemented if getattr(o, "is_pyclad_vector", False) else self.graph.apply(name, o, self)

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._reflected("add", o)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._reflected("sub", o)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._reflected("mul", o)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._reflected("div", o)
    def __pow__(self, o): return self._binary("pow", o)       # x ** 2 etc.: Graph._identity
    def __rpow__(self, o): return self._reflected("pow", o)
    def __neg__(self): return self._op("neg")
    def __pos__(self): return self
    def __abs__(self): return self._op("abs")

    # -- comparisons and logic: values 1.0 / 0.0, no derivative ----------------------
    def __lt__(self, o): return self._op("lt", o)
    def __le__(self, o): return self._op("le", o)
    def __gt__(self, o): return self._op("gt", o)
    def __ge__(self, o): return self._op("ge", o)
    def __eq__(self, o): return self._op("eq", o)  # noqa: E711 - builds a node
    def __ne__(self, o): return self._op("ne", o)
    def __and__(self, o): return self._op("and", o)
    def __rand__(self, o): return self.graph.apply("and", o, self)
    def __or__(self, o): return self._op("or", o)
    def __ror__(self, o): return self.graph.apply("or", o, self)
    def __invert__(self): return self._op("not")

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(CONTROL_FLOW_HELP)

    def __float__(self):
        value = self.graph.constant_value(self)
        if value is None:
            raise TypeError("a traced pyclad value depends on the inputs and has no fixed "
                            "float value while tracing")
        return float(value)

    def __index__(self):
        raise TypeError("a traced pyclad value cannot be used as an index")

    def __repr__(self):
        return f"<pyclad node {self.id}: {self.graph.ops[self.id]}>"


class Graph:
    """Nodes as parallel lists: ``ops[i]``, ``args[i]`` (operand ids), ``consts[i]``
    (value of a constant), ``leaf[i]`` ((group, component) of an input or data leaf)."""

    def __init__(self):
        self.ops: List[str] = []
        self.args: List[Tuple[int, ...]] = []
        self.consts: List[Optional[float]] = []
        self.leaf: List[Optional[Tuple[int, int]]] = []
        self._cse: Dict[tuple, int] = {}
        # Library helpers' regions: (helper name, input ids, output ids); the tape may run
        # one as a single instruction (pyclad.regions).
        self.regions: List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]] = []

    def __len__(self):
        return len(self.ops)

    # -- node creation ------------------------------------------------------------------
    def _new(self, op, args=(), const=None, leaf=None) -> Node:
        # Constants are keyed by repr: -0.0 stays apart from 0.0 and NaN finds itself.
        key = (op, args, repr(const), leaf)
        existing = self._cse.get(key)
        if existing is not None:
            return Node(self, existing)
        self.ops.append(op)
        self.args.append(args)
        self.consts.append(const)
        self.leaf.append(leaf)
        self._cse[key] = len(self.ops) - 1
        return Node(self, len(self.ops) - 1)

    def const(self, value) -> Node:
        return self._new("const", const=float(value))

    def input(self, group: int, component: int) -> Node:
        return self._new("input", leaf=(group, component))

    def data(self, component: int) -> Node:
        return self._new("data", leaf=(-1, component))

    def as_node(self, value) -> Node:
        if isinstance(value, Node):
            if value.graph is not self:
                raise ValueError("a value from another traced function was mixed in")
            return value
        if isinstance(value, (numbers.Real, np.floating, np.integer, np.bool_)):
            return self.const(float(value))
        raise TypeError(f"cannot use {type(value).__name__} in a traced pyclad function; "
                        "only numbers and pyclad values")

    def constant_value(self, node: Node) -> Optional[float]:
        return self.consts[node.id] if self.ops[node.id] == "const" else None

    def apply(self, name: str, *operands) -> Node:
        op = OPS[name]
        nodes = [self.as_node(o) for o in operands]
        if len(nodes) != op.arity:
            raise TypeError(f"{name} takes {op.arity} operands, got {len(nodes)}")
        values = [self.constant_value(n) for n in nodes]
        if all(v is not None for v in values):  # constant folding, with the op's own expression
            names = dict(zip("abc", (np.float64(v) for v in values)))
            return self.const(evaluate(op.forward, **names))
        simplified = self._identity(name, nodes, values)
        if simplified is not None:
            return simplified
        return self._new(name, tuple(n.id for n in nodes))

    def _identity(self, name, nodes, values) -> Optional[Node]:
        """Rewrites that give bit-identical results for every input, NaN and Inf included, and
        the powers users write as ``x ** 2``, ``x ** 1`` and ``x ** 0.5``: square, the operand
        and sqrt (the last differs from a correctly rounded pow only at -0 and -inf, where pow
        gives +0 and +inf; its derivative is the same everywhere else)."""
        a, b = (values + [None, None])[:2]
        if name == "pow" and b is not None and b in (2.0, 1.0, 0.5):
            if b == 2.0:
                return self._new("square", (nodes[0].id,))
            if b == 1.0:
                return nodes[0]
            return self._new("sqrt", (nodes[0].id,))
        if name == "add" and b == 0.0 and np.copysign(1, b) < 0:   # x + (-0) == x, even for x = -0
            return nodes[0]
        if name == "add" and a == 0.0 and np.copysign(1, a) < 0:
            return nodes[1]
        if name == "sub" and b == 0.0 and np.copysign(1, b) > 0:   # x - (+0) == x
            return nodes[0]
        if name == "mul" and b == 1.0:
            return nodes[0]
        if name == "mul" and a == 1.0:
            return nodes[1]
        if name == "div" and b == 1.0:
            return nodes[0]
        if name == "neg" and self.ops[nodes[0].id] == "neg":
            return Node(self, self.args[nodes[0].id][0])
        return None

    def mark_region(self, name: str, inputs, outputs):
        """Record that library helper ``name`` computed ``outputs`` from ``inputs`` (scalars)."""
        self.regions.append((name, tuple(self.as_node(v).id for v in inputs),
                             tuple(self.as_node(v).id for v in outputs)))

    # -- orders ---------------------------------------------------------------------------
    def forward_order(self, outputs: Sequence[int], stop: Set[int] = frozenset()) -> List[int]:
        """Every node the outputs need, operands before users (iterative DFS postorder);
        ``stop``: nodes neither visited nor expanded."""
        return postorder(outputs, lambda node: self.args[node], stop)

    def active(self, order: Sequence[int]) -> set:
        """Nodes whose value depends on a differentiable input through differentiable ops."""
        active = set()
        for node in order:
            op = self.ops[node]
            if op == "input":
                active.add(node)
            elif op not in LEAVES:
                vjps = OPS[op].vjps
                if any(v is not None and arg in active for arg, v in zip(self.args[node], vjps)):
                    active.add(node)
        return active


def postorder(roots: Sequence, operands: Callable, stop=frozenset()) -> list:
    """Every node the roots reach through ``operands(node)``, operands before users (iterative
    DFS postorder, so deep graphs need no recursion); ``stop``: nodes neither visited nor
    expanded. Graph.forward_order walks a graph with it, the tape its fused instructions."""
    seen, order = set(stop), []
    for root in roots:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((arg, False) for arg in reversed(operands(node)) if arg not in seen)
    return order
