"""Tracing: run a plain Python function once on symbolic vectors and keep its graph."""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable, Dict, List, Sequence, Set, Tuple

import numpy as np

from .graph import Graph, Node
from .vector import Vector


@dataclasses.dataclass
class Traced:
    """A traced function: its graph, outputs and the orders the backends walk.

    Made by :func:`pyclad.trace` (a :class:`BatchFunction` keeps its own as ``traced``).
    Node ids index the graph's lists (``graph.ops[i]`` is node i's op).

    Attributes:
        graph: the :class:`pyclad.graph.Graph` of the nodes tracing made.
        group_sizes: the length of each parameter group's row, a tuple of ints.
        data_size: the length of the per-tuple data row (0: none).
        outputs: the node id of each output, in the order the function returned them.
        order: every node the outputs need, operands before their users (a topological order);
            nodes the outputs do not need are left out.
        active: the nodes that carry derivatives: those that depend on a parameter input
            through differentiable ops.
        inputs: ``inputs[g][j]`` is the node id of component j of parameter group g, or -1 when
            the outputs do not use it (its Jacobian column is then zero).
        data: the node id of each data component, or -1 when the outputs do not use it (an
            empty list when ``data_size`` is 0).
        guarded: the nodes of singular ops (``sqrt``, division, ``log``, ...) that a
            :func:`pyclad.where` branch depends on; their zero adjoints stay zero, so the
            branch not taken adds no NaN (see :mod:`pyclad.ops`). Empty by default.
    """
    graph: Graph
    group_sizes: Tuple[int, ...]
    data_size: int
    outputs: List[int]
    order: List[int]
    active: Set[int]
    inputs: List[List[int]]
    data: List[int]
    guarded: Set[int] = dataclasses.field(default_factory=set)  # see pyclad.ops: singular ops in where branches

    @property
    def n_outputs(self) -> int:
        """The number of outputs."""
        return len(self.outputs)

    def reverse_order(self, output: int = None) -> List[int]:
        """Active nodes, users before operands: the order of the reverse sweeps; with
        ``output``, only the nodes that output depends on (its own sweep)."""
        needed = set(self.graph.forward_order([output])) if output is not None else self.active
        return [n for n in reversed(self.order) if n in self.active and n in needed]

    def fingerprint(self) -> str:
        """sha256 of everything the generated kernels depend on (the nodes, their operands,
        constants and leaves, the orders and sets above): equal for equal functions, made once.
        The binary cache keys generated programs by it (clkernels.templates.program_for)."""
        fp = getattr(self, "_fingerprint", None)
        if fp is None:
            g = self.graph
            text = repr((self.group_sizes, self.data_size, self.outputs, self.order, sorted(self.active),
                         self.inputs, self.data, sorted(self.guarded), g.ops, g.args,
                         [repr(c) for c in g.consts], g.leaf, g.regions))
            fp = self._fingerprint = hashlib.sha256(text.encode()).hexdigest()
        return fp

    def summary(self) -> str:
        """One line: the needed nodes (and how many are active), the outputs, the group and data
        sizes, and the count of each op."""
        ops: Dict[str, int] = {}
        for n in self.order:
            ops[self.graph.ops[n]] = ops.get(self.graph.ops[n], 0) + 1
        return (f"{len(self.order)} nodes ({len(self.active)} active), "
                f"{self.n_outputs} outputs, groups {self.group_sizes}, data {self.data_size}: "
                + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))


def _flatten_outputs(result) -> List:
    if isinstance(result, (Node, int, float, np.floating, np.integer)):
        return [result]
    if isinstance(result, Vector):
        return list(result.items)
    if isinstance(result, (list, tuple)):
        out = []
        for item in result:
            out.extend(_flatten_outputs(item))
        return out
    if isinstance(result, np.ndarray):
        return _flatten_outputs(list(result.ravel()))
    raise TypeError(f"a pyclad function must return a scalar, a Vector or a list of them, "
                    f"not {type(result).__name__}")


def trace(fn: Callable, group_sizes: Sequence[int], data_size: int = 0) -> Traced:
    """Call ``fn(group_0, ..., group_{G-1}[, data])`` on symbolic vectors once and record the graph.

    :class:`BatchFunction` does this itself; ``trace`` is for looking at the graph (its size,
    ``Traced.summary()``) without building a kernel.

    Args:
        fn: a plain Python function of one :class:`Vector` per parameter group (and the data
            vector when ``data_size`` > 0), returning a scalar or a list of scalars.
        group_sizes: the length of each parameter group's row.
        data_size: the length of the per-tuple data row (0: ``fn`` takes no data argument).

    Returns:
        A :class:`Traced`: the graph, its outputs in order, and which inputs they use.

    Raises:
        ValueError: a group size below 1, a negative data size, or a function with no outputs.
        TypeError: Python ``if`` (or ``bool``) on a traced value; use :func:`where`.
    """
    group_sizes = tuple(int(d) for d in group_sizes)
    if not group_sizes or any(d < 1 for d in group_sizes):
        raise ValueError(f"params must be a tuple of positive group sizes, got {group_sizes}")
    if data_size < 0:
        raise ValueError(f"data must be a non-negative size, got {data_size}")
    graph = Graph()
    args = [Vector((graph.input(g, j) for j in range(d)), name=f"argument {g}")
            for g, d in enumerate(group_sizes)]
    if data_size:
        args.append(Vector((graph.data(j) for j in range(data_size)), name="data"))
    outputs = [graph.as_node(o).id for o in _flatten_outputs(fn(*args))]
    if not outputs:
        raise ValueError("the traced function returned no outputs")
    order = graph.forward_order(outputs)
    needed = set(order)
    inputs = [[args[g][j].id if args[g][j].id in needed else -1 for j in range(d)]
              for g, d in enumerate(group_sizes)]
    data = [args[-1][j].id if args[-1][j].id in needed else -1 for j in range(data_size)] if data_size else []
    return Traced(graph, group_sizes, data_size, outputs, order, graph.active(order), inputs, data,
                  guarded_nodes(graph, order))


def guarded_nodes(graph: Graph, order: List[int]) -> Set[int]:
    """Singular ops that some where's branch depends on: their zero adjoints must stay zero."""
    from .ops import OPS
    roots = [arg for n in order if graph.ops[n] == "where" for arg in graph.args[n][1:]]
    inside = set(graph.forward_order(roots)) if roots else set()
    return {n for n in inside if graph.ops[n] in OPS and OPS[graph.ops[n]].singular}
