"""Library superinstructions of the tape interpreter: a geometry helper as one instruction.

A library helper that traces many nodes (``rotate_angle_axis``: 46 of them, three quarters of
the Snavely camera's forward table) marks them in the graph as a *region*: its inputs and
outputs. The tape runs a region as one instruction with several outputs, whose switch case is
the helper's own trace unrolled (forward; reverse: the vector-Jacobian product of its outputs'
adjoints), so it pays one dispatch and one table read instead of one per node, and keeps the
intermediates in registers.

The case is made from the helper's *canonical* trace (symbolic inputs, nothing folded), so it
is the same for every graph and the interpreter stays one kernel per instruction set. A marked
region is run as the superinstruction only if it is exactly that trace (constant folding or a
shared intermediate change the nodes: then its nodes stay ordinary instructions), nothing
outside it uses its intermediates, and its guards are the canonical ones. Both the case and the
ordinary instructions evaluate the op table's expressions on the same operands, in the same
order within the region, so values are equal; the adjoints differ only by the order in which
the region's contributions are added.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .ops import FUSED, OPS, to_c


def _rotate(inputs):
    from .vector import Vector, rotate_angle_axis
    return list(rotate_angle_axis(Vector(inputs[:3]), Vector(inputs[3:])))


# name -> (the helper on a list of scalars, returning its outputs; number of inputs).
# Adding a superinstruction is one row here and a mark in its helper (Graph.mark_region).
LIBRARY: Dict[str, Tuple[Callable, int]] = {
    "rotate_angle_axis": (_rotate, 6),
}
FIRST_CODE = len(OPS) + len(FUSED)   # past every op and product superinstruction


@dataclasses.dataclass(frozen=True)
class Region:
    """A superinstruction: its canonical trace. ``nodes[j]`` = (op name, operands), an operand
    being ``("in", k)`` (input k), ``("node", i)`` (an earlier node) or ``("const", value)``;
    ``outputs`` index ``nodes``; ``guarded``: the nodes whose vjps are guarded (pyclad.ops);
    ``contributes[k]``: input k receives an adjoint (it has a structurally non-zero partial)."""
    name: str
    code: int
    n_in: int
    nodes: Tuple[Tuple[str, Tuple[tuple, ...]], ...]
    outputs: Tuple[int, ...]
    guarded: frozenset
    contributes: Tuple[bool, ...]

    @property
    def n_out(self) -> int:
        return len(self.outputs)

    # -- table rows: a flat int record, padded to whole rows ------------------------------
    # forward: [code, out slots..., input value slots...] in rows of 8;
    # reverse: [label, 0, 0, mask, own adjoint slots..., input value slots..., input adjoint
    # slots...] in units of 3 x 4 (a reverse instruction's size).
    def forward_rows(self) -> int:
        return -(-(1 + self.n_out + self.n_in) // 8)

    def reverse_units(self) -> int:
        return -(-(4 + self.n_out + 2 * self.n_in) // 12)

    def _operand(self, operand, real) -> str:
        from .codegen import literal
        kind, value = operand
        return {"in": f"u{value}", "node": f"n{value}"}.get(kind) or literal(value, real)

    def _forward_lines(self, real) -> List[str]:
        lines = []
        for j, (op, operands) in enumerate(self.nodes):
            if op == "const":
                continue
            symbols = {s: self._operand(x, real) for s, x in zip("abc", operands)}
            lines.append(f"const real_t n{j} = {to_c(OPS[op].forward, symbols, real)};")
        return lines

    def _reverse_lines(self, real, seeds: Sequence[str]) -> Tuple[List[str], List[Optional[str]]]:
        """The straight-line vjp: lines declaring each node's adjoint ``d<j>`` (outputs start
        from ``seeds``), and each input's summed contribution (None: none)."""
        terms: Dict[int, List[str]] = {j: [s] for j, s in zip(self.outputs, seeds)}
        to_input: List[List[str]] = [[] for _ in range(self.n_in)]
        lines = []
        for j in reversed(range(len(self.nodes))):
            op, operands = self.nodes[j]
            if j not in terms or op == "const" or not OPS[op].differentiable:
                continue
            lines.append(f"const real_t d{j} = {' + '.join(terms[j])};")
            symbols = {s: self._operand(x, real) for s, x in zip("abc", operands)}
            symbols.update(r=f"n{j}", g=f"d{j}")
            for (kind, value), vjp in zip(operands, OPS[op].vjp_exprs(j in self.guarded)):
                if vjp is None or kind == "const":
                    continue
                term = f"({to_c(vjp, symbols, real)})"
                (to_input[value] if kind == "in" else terms.setdefault(value, [])).append(term)
        return lines, [" + ".join(t) if t else None for t in to_input]

    def forward_case(self, real: str, table: str) -> str:
        o = 1 + self.n_out
        loads = " ".join(f"const real_t u{k} = V(F[{o + k}], k);" for k in range(self.n_in))
        stores = " ".join(f"V(F[{1 + q}], k) = n{j};" for q, j in enumerate(self.outputs))
        return (f"case {self.code}: {{ {table} int *F = ({table} int *)(fwd + i); FOR_K {{ {loads} "
                + " ".join(self._forward_lines(real)) + f" {stores} }} i += {self.forward_rows() - 1}; }} break;")

    def reverse_case(self, real: str, table: str, label: int, first: Sequence[bool], joint_outputs: int) -> str:
        """The case of one label: per input, its contribution assigns (``first``) or adds; a
        joint sweep (``joint_outputs`` planes) reads and clears each plane's adjoints."""
        own, value, adjoint = 4, 4 + self.n_out, 4 + self.n_out + self.n_in
        loads = " ".join(f"const real_t u{k} = V(R[{value + k}], k);" for k in range(self.n_in))
        forward = " ".join(self._forward_lines(real))

        def body(plane):
            seeds = " ".join(f"const real_t g{q} = A(R[{own + q}], {plane}, k);" for q in range(self.n_out))
            clear = " ".join(f"A(R[{own + q}], {plane}, k) = 0;" for q in range(self.n_out)) if joint_outputs else ""
            lines, sums = self._reverse_lines(real, [f"g{q}" for q in range(self.n_out)])
            writes = " ".join(f"A(R[{adjoint + k}], {plane}, k) {'=' if first[k] else '+='} {s};"
                              for k, s in enumerate(sums) if s is not None)
            return f"FOR_K {{ {loads} {forward} {seeds} {clear} {' '.join(lines)} {writes} }}"
        if joint_outputs:
            sweep = " ".join(f"if (R[3] & {1 << o}) {body(o)}" for o in range(joint_outputs))
        else:
            sweep = body(0)
        return (f"case {label}: {{ {table} int *R = ({table} int *)(rev + 3 * j); {sweep} "
                f"j += {self.reverse_units() - 1}; }} break;")


def _internal(graph, outputs: Sequence[int], inputs: Sequence[int]) -> List[int]:
    """A region's nodes, operands first: everything its outputs need short of its inputs."""
    return graph.forward_order(outputs, stop=set(inputs))


@functools.lru_cache(maxsize=None)
def region(name: str) -> Region:
    """The superinstruction of a library helper, from its canonical trace (made once)."""
    from .graph import Graph, Node
    from .trace import guarded_nodes
    helper, n_in = LIBRARY[name]
    graph = Graph()
    inputs = [graph.input(0, k).id for k in range(n_in)]
    outputs = [graph.as_node(o).id for o in helper([Node(graph, i) for i in inputs])]
    internal = _internal(graph, outputs, inputs)
    index = {node: j for j, node in enumerate(internal)}
    position = {node: k for k, node in enumerate(inputs)}

    def operand(node):
        if node in position:
            return ("in", position[node])
        if graph.ops[node] == "const":
            return ("const", graph.consts[node])
        return ("node", index[node])
    # A constant is a node of its own (the DFS visits it) whose one operand is its value.
    nodes = tuple((graph.ops[n], (("const", graph.consts[n]),) if graph.ops[n] == "const"
                   else tuple(operand(a) for a in graph.args[n])) for n in internal)
    guarded = guarded_nodes(graph, [*inputs, *internal])
    active = graph.active([*inputs, *internal])
    contributes = [False] * n_in
    for n in internal:
        if graph.ops[n] in OPS and n in active:
            for a, vjp in zip(graph.args[n], OPS[graph.ops[n]].vjps):
                if vjp is not None and a in position:
                    contributes[position[a]] = True
    return Region(name, FIRST_CODE + list(LIBRARY).index(name), n_in, nodes,
                  tuple(index[o] for o in outputs), frozenset(index[n] for n in guarded if n in index),
                  tuple(contributes))


def regions() -> List[Region]:
    return [region(name) for name in LIBRARY]


CODES = frozenset(FIRST_CODE + i for i in range(len(LIBRARY)))


@dataclasses.dataclass(frozen=True)
class Found:
    """A marked region of a traced graph that runs as its superinstruction."""
    region: Region
    inputs: Tuple[int, ...]
    outputs: Tuple[int, ...]
    internal: frozenset    # the nodes it absorbs (constants excepted: other nodes may share them)


def find(traced) -> List[Found]:
    """The marked regions of ``traced`` that are exactly their helper's canonical trace and
    whose intermediates nothing else uses (see the module docstring), without overlaps."""
    graph = traced.graph
    in_order = set(traced.order)
    users: Dict[int, set] = {}
    for n in traced.order:
        for a in graph.args[n]:
            users.setdefault(a, set()).add(n)
    found, taken, function_outputs = [], set(), set(traced.outputs)
    for name, inputs, outputs in graph.regions:
        if not in_order.intersection(outputs):
            continue
        canonical = region(name)
        internal = _internal(graph, outputs, inputs)
        if not _matches(graph, canonical, internal, inputs, outputs, traced, in_order):
            continue
        absorbed = {n for n in internal if graph.ops[n] != "const"}
        private = absorbed - set(outputs)
        if absorbed & taken or private & function_outputs \
                or any(not users.get(n, set()) <= absorbed for n in private):
            continue
        taken |= absorbed
        found.append(Found(canonical, tuple(inputs), tuple(outputs), frozenset(absorbed)))
    return found


def _matches(graph, canonical: Region, internal, inputs, outputs, traced, in_order) -> bool:
    """Node for node the canonical trace: the same ops, constants and operands (DFS orders
    from the same outputs align exactly when the graphs do), the same guards."""
    if len(internal) != len(canonical.nodes):
        return False
    index = {node: j for j, node in enumerate(internal)}
    for j, (node, (op, operands)) in enumerate(zip(internal, canonical.nodes)):
        if graph.ops[node] != op:
            return False
        if op == "const":
            if repr(graph.consts[node]) != repr(operands[0][1]):
                return False
            continue
        if len(graph.args[node]) != len(operands):
            return False
        for arg, (kind, value) in zip(graph.args[node], operands):
            if kind == "in" and inputs[value] != arg:
                return False
            if kind == "const" and (graph.ops[arg] != "const" or repr(graph.consts[arg]) != repr(value)):
                return False
            if kind == "node" and index.get(arg) != value:
                return False
        if node in in_order and (node in traced.guarded) != (j in canonical.guarded):
            return False
    return tuple(index.get(o) for o in outputs) == canonical.outputs
