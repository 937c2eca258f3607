"""The ``numpy`` backend: the same op table evaluated over numpy arrays on the host.

Slow next to the kernels, but it needs no OpenCL device and shows in a few lines what
the kernels compute: a forward pass over the topological order, then one reverse sweep
per output.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from .ops import OPS, evaluate
from .trace import Traced


def run(traced: Traced, params: Sequence[np.ndarray], index: np.ndarray,
        data: np.ndarray, jacobians: bool, dtype) -> Tuple[np.ndarray, List[np.ndarray]]:
    graph, n = traced.graph, index.shape[0]
    dtype = np.dtype(dtype)
    values: Dict[int, np.ndarray] = {}
    for node in traced.order:
        op = graph.ops[node]
        if op == "input":
            g, j = graph.leaf[node]
            values[node] = params[g][index[:, g], j]
        elif op == "data":
            values[node] = data[:, graph.leaf[node][1]]
        elif op == "const":
            values[node] = np.full(n, graph.consts[node], dtype)
        else:
            operands = dict(zip("abc", (values[a] for a in graph.args[node])))
            values[node] = np.asarray(evaluate(OPS[op].forward, **operands), dtype)
    out = np.stack([values[o] for o in traced.outputs], axis=1).astype(dtype, copy=False)
    if not jacobians:
        return out, []
    jacs = [np.zeros((n, traced.n_outputs, d), dtype) for d in traced.group_sizes]
    reverse = traced.reverse_order()
    for k, output in enumerate(traced.outputs):
        if output not in traced.active:
            continue
        adjoint = {output: np.ones(n, dtype)}
        for node in reverse:
            if node not in adjoint or graph.ops[node] == "input":
                continue
            spec = OPS[graph.ops[node]]
            symbols = dict(zip("abc", (values[a] for a in graph.args[node])))
            symbols.update(r=values[node], g=adjoint[node])
            for arg, vjp in zip(graph.args[node], spec.vjp_exprs(node in traced.guarded)):
                if vjp is None or arg not in traced.active:
                    continue
                contribution = np.asarray(evaluate(vjp, **symbols), dtype)
                adjoint[arg] = adjoint[arg] + contribution if arg in adjoint else contribution
        for g, row in enumerate(traced.inputs):
            for j, node in enumerate(row):
                if node in adjoint:
                    jacs[g][:, k, j] = adjoint[node]
    return out, jacs
