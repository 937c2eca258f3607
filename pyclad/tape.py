"""The ``tape`` backend: the original design of a generic interpreter kernel.

The graph is flattened into a node table (compact ids in forward order, so the forward
sweep is a plain loop over the table) and the reverse sequences; one kernel per (parameter layout, dtype) runs any graph of that layout, so
"compiling" a new function costs no OpenCL build. Values and adjoints live in a global
scratch buffer, which bounds the chunk of tuples evaluated per launch.
"""
from __future__ import annotations

from typing import List

import numpy as np

from clkernels import templates

from .ops import LEAVES, OPS, to_c
from .trace import Traced

_LEAF_CODES = {leaf: 100 + i for i, leaf in enumerate(LEAVES)}  # past every op code
GUARDED = 128  # added to the op code of a guarded node (see pyclad.ops on guards)


def _operand_loads(arity: int) -> str:
    return "".join(f"const real_t x{s} = V(nd.{f}); " for s, f in list(zip("abc", "yzw"))[:arity])


# The op table's operand names (a, b, c; r the result, g its adjoint) as the kernel's locals.
_NAMES = {s: f"x{s}" for s in "abcrg"}


def forward_cases(real: str) -> List[str]:
    names = _NAMES
    return [f"case OP_{op.name.upper()}: {{ {_operand_loads(op.arity)}r = {to_c(op.forward, names, real)}; break; }}"
            for op in OPS.values()]


def reverse_cases(real: str) -> List[str]:
    names = _NAMES
    cases = []
    for op in OPS.values():
        if not op.differentiable:
            continue
        for guarded in ((False, True) if op.singular else (False,)):
            adds = " ".join(f"A(nd.{f}) += {to_c(vjp, names, real)};"
                            for f, vjp in zip("yzw", op.vjp_exprs(guarded)) if vjp is not None)
            label = f"OP_{op.name.upper()}" + (f" + {GUARDED}" if guarded else "")
            cases.append(f"case {label}: {{ {_operand_loads(op.arity)}{adds} break; }}")
    return cases


def render(group_sizes, data_size: int, n_outputs: int, real: str, jacobians: bool) -> str:
    """The interpreter kernel for a parameter layout (independent of the graph)."""
    opcodes = [(op.name, op.code) for op in OPS.values()] + list(_LEAF_CODES.items())
    return templates.render(
        "pyclad/tape.cl.mako", real=real, opcodes=opcodes, n_groups=len(group_sizes),
        group_sizes=tuple(group_sizes), data_size=data_size, n_outputs=n_outputs,
        jacobians=jacobians, forward_cases=forward_cases(real), reverse_cases=reverse_cases(real),
        guard_bit=GUARDED)


class Tables:
    """The host-side node table and sequences of a traced graph, compactly numbered."""

    def __init__(self, traced: Traced, dtype):
        graph = traced.graph
        compact = {node: i for i, node in enumerate(traced.order)}
        n = len(traced.order)
        self.nodes = np.zeros((n, 4), np.int32)
        self.consts = np.zeros(n, dtype)
        for node, i in compact.items():
            op = graph.ops[node]
            if op in LEAVES:
                self.nodes[i, 0] = _LEAF_CODES[op]
                if op == "const":
                    self.consts[i] = graph.consts[node]
                else:
                    self.nodes[i, 1:3] = graph.leaf[node]
            else:
                self.nodes[i, 0] = OPS[op].code + (GUARDED if node in traced.guarded else 0)
                for k, arg in enumerate(graph.args[node]):
                    self.nodes[i, 1 + k] = compact[arg]
        # One reverse sequence per output, concatenated: a sweep visits only the nodes its
        # output depends on, as the unrolled codegen sweeps do (so both give the same bits).
        sweeps = [[compact[x] for x in traced.reverse_order(o)] for o in traced.outputs]
        self.rev = np.array([x for sweep in sweeps for x in sweep], np.int32)
        self.rev_offsets = np.cumsum([0] + [len(sw) for sw in sweeps]).astype(np.int32)
        self.outputs = np.array([compact[o] for o in traced.outputs], np.int32)
        self.seeds = np.array([compact[o] if o in traced.active else -1 for o in traced.outputs], np.int32)
        self.leaves = np.array([compact[x] if x >= 0 else -1 for row in traced.inputs for x in row], np.int32)
        if self.rev.size == 0:
            self.rev = np.zeros(1, np.int32)  # OpenCL buffers cannot be empty
        self.n_nodes = n
