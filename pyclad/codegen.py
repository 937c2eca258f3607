"""The ``codegen`` backend: a traced graph becomes straight-line OpenCL C.

Every node is a private variable (``v<id>``), constants are inlined as exact hexadecimal
literals, and each output's reverse sweep is unrolled: a node's adjoint (``a<id>``) is
declared at its first contribution and only contributions the op table does not mark as
structurally zero are emitted. No branching on op types is left for the device.
"""
from __future__ import annotations

import math
from typing import Dict, List

import numpy as np

from clkernels import templates

from .ops import OPS, to_c
from .trace import Traced


def literal(value: float, real: str) -> str:
    """An exact C literal of ``value`` in the kernel's type."""
    if math.isnan(value):
        return "((real_t)NAN)"
    if math.isinf(value):
        return "((real_t)INFINITY)" if value > 0 else "((real_t)(-INFINITY))"
    if real == "float":
        return f"({float(np.float32(value)).hex()}f)"
    return f"({value.hex()})"


class _Sweep:
    """The statements of one reverse sweep and where each input's adjoint ended up."""

    def __init__(self, traced: Traced, output: int, names: Dict[int, str], real: str):
        self.traced, self.lines = traced, []
        self.declared: set = set()
        graph = traced.graph
        if output not in traced.active:
            return  # the output does not depend on any parameter: all zeros
        self._add(output, "(real_t)1")
        for node in traced.reverse_order():
            if node not in self.declared:
                continue  # nothing flowed here in this sweep
            op = graph.ops[node]
            if op == "input":
                continue
            spec = OPS[op]
            operands = graph.args[node]
            symbols = {s: names[arg] for s, arg in zip("abc", operands)}
            symbols.update(r=names[node], g=f"a{node}")
            for arg, vjp in zip(operands, spec.vjp_exprs(node in traced.guarded)):
                if vjp is None or arg not in traced.active:
                    continue
                self._add(arg, to_c(vjp, symbols, real))

    def _add(self, node: int, expr: str):
        if node in self.declared:
            self.lines.append(f"a{node} += {expr};")
        else:
            self.declared.add(node)
            self.lines.append(f"real_t a{node} = {expr};")

    def adjoint(self, group: int, component: int) -> str:
        node = self.traced.inputs[group][component]
        return f"a{node}" if node in self.declared else "(real_t)0"


def node_names(traced: Traced, real: str) -> Dict[int, str]:
    """C expression for each node's value: a literal for constants, else its variable."""
    graph = traced.graph
    return {n: literal(graph.consts[n], real) if graph.ops[n] == "const" else f"v{n}"
            for n in traced.order}


def forward_lines(traced: Traced, names: Dict[int, str], real: str) -> List[str]:
    graph, lines = traced.graph, []
    for n in traced.order:
        op = graph.ops[n]
        if op == "const":
            continue
        if op == "input":
            g, j = graph.leaf[n]
            lines.append(f"const real_t v{n} = LOAD_P{g}({j});")
        elif op == "data":
            lines.append(f"const real_t v{n} = LOAD_D({graph.leaf[n][1]});")
        else:
            symbols = {s: names[a] for s, a in zip("abc", graph.args[n])}
            lines.append(f"const real_t v{n} = {to_c(OPS[op].forward, symbols, real)};")
    return lines


def stage_size(traced: Traced, itemsize: int, info) -> int:
    """Work-group size for staging Jacobian rows in local memory, or 0 for direct stores.

    GPUs only (on a CPU local memory is ordinary memory: staging is a pure extra copy), and
    only when a useful group (>= 32 work-items) fits in half the local memory."""
    if info.is_cpu:
        return 0
    row_bytes = traced.n_outputs * sum(traced.group_sizes) * itemsize
    wg = 128
    while wg >= 32 and (wg * row_bytes > info.local_mem_bytes // 2 or wg > info.max_work_group_size):
        wg //= 2
    return wg if wg >= 32 else 0


def lanes(info, real: str) -> int:
    """Tuples per work-item: the device's native vector width on CPUs (explicit SIMD through
    OpenCL vector types; math calls in scalar code keep CPU compilers from vectorising
    across work-items), 1 on GPUs, where work-items are the SIMD lanes."""
    if not info.is_cpu:
        return 1
    width = info.native_vector_width_double if real == "double" else info.native_vector_width_float
    return max(1, min(8, width))


def render(traced: Traced, real: str, jacobians: bool, name: str = "pyclad_eval",
           stage_wg: int = 0, lanes: int = 1) -> str:
    """The kernel source for ``traced`` (values only, or values and Jacobians)."""
    names = node_names(traced, real)
    if lanes not in (1, 2, 4, 8, 16):
        raise ValueError(f"lanes must be 1, 2, 4, 8 or 16, not {lanes}")
    return templates.render(
        "pyclad/codegen.cl.mako", name=name, real=real, lanes=lanes,
        stage_wg=stage_wg if jacobians and lanes == 1 else 0,
        n_groups=len(traced.group_sizes), group_sizes=traced.group_sizes,
        data_size=traced.data_size, n_outputs=traced.n_outputs, jacobians=jacobians,
        forward=forward_lines(traced, names, real),
        output_values=[names[o] for o in traced.outputs],
        sweeps=[_Sweep(traced, o, names, real) for o in traced.outputs] if jacobians else [])
