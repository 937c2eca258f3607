"""Tracing, folding, CSE and orders; random expression graphs against the complex step."""
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyclad as pc
from pyclad.graph import Graph

# -- tracing ---------------------------------------------------------------------------


def test_constant_folding_and_cse():
    def fn(x):
        k = pc.sqrt(4.0) * 3.0 + pc.cos(0.0)      # folds to the constant 7
        a = pc.sin(x[0]) * x[1]
        b = pc.sin(x[0]) * x[1]                   # the same expression: reused, not repeated
        return [a + b * k, x[2] * 1.0 - 0.0 * 5.0]  # x - (+0) is x; x + 0 is not (x = -0)
    traced = pc.trace(fn, (3,))
    ops = [traced.graph.ops[n] for n in traced.order]
    assert ops.count("sin") == 1 and ops.count("mul") == 2  # sin*x1 once, then *7
    consts = [traced.graph.consts[n] for n in traced.order if traced.graph.ops[n] == "const"]
    assert consts == [7.0]
    # x2 * 1 - 0 is x2 itself: the second output is the input node
    assert traced.outputs[1] == traced.inputs[0][2]


def test_node_ids_are_creation_order_and_reverse_is_topological():
    traced = pc.trace(lambda x: pc.exp(x[0] * x[1]) / (x[0] + 1.0), (2,))
    g = traced.graph
    position = {n: i for i, n in enumerate(traced.order)}
    for n in traced.order:
        for arg in g.args[n]:
            assert arg < n and position[arg] < position[n]
    rev = traced.reverse_order()
    assert [n for n in rev] == sorted(rev, reverse=True)


def test_negative_zero_and_nan_constants_are_kept_apart():
    g = Graph()
    assert g.const(0.0).id != g.const(-0.0).id
    assert g.const(float("nan")).id == g.const(float("nan")).id


def test_python_control_flow_is_a_clear_error():
    def fn(x):
        if x[0] > 0:
            return x[0]
        return -x[0]
    with pytest.raises(TypeError, match="pyclad.where"):
        pc.BatchFunction(fn, params=(1,))


def test_vector_helpers():
    def fn(a, b):
        return [pc.dot(a, b), *pc.cross(a, b), pc.norm(a), *(a * 2.0 - b / 4.0)]
    a, b = np.array([1.0, -2.0, 0.5]), np.array([0.3, 4.0, -1.0])
    f = pc.BatchFunction(fn, params=(3, 3), backend="numpy")
    values = f.values([a[None], b[None]], [[0, 0]])[0]
    np.testing.assert_allclose(values, [a @ b, *np.cross(a, b), np.linalg.norm(a), *(a * 2 - b / 4)],
                               rtol=1e-15)


def test_vector_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="lengths differ"):
        pc.trace(lambda a: a[0:2] + a[0:3], (3,))


# -- random graphs ------------------------------------------------------------------------

# Ops kept analytic and finite on the whole real line, so the complex step applies.
UNARY = {
    "sin": (pc.sin, np.sin), "cos": (pc.cos, np.cos), "tanh": (pc.tanh, np.tanh),
    "atan": (pc.atan, np.arctan), "neg": (lambda a: -a, lambda a: -a),
    "square": (lambda a: a ** 2, lambda a: a * a),
    "soft_sqrt": (lambda a: pc.sqrt(1.0 + a * a), lambda a: np.sqrt(1.0 + a * a)),
    "soft_log": (lambda a: pc.log(1.0 + a * a), lambda a: np.log(1.0 + a * a)),
    "soft_exp": (lambda a: pc.exp(pc.tanh(a)), lambda a: np.exp(np.tanh(a))),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "soft_div": (lambda a, b: a / (1.0 + b * b), lambda a, b: a / (1.0 + b * b)),
}
N_INPUTS = 3


def _trees(depth):
    leaf = st.one_of(st.tuples(st.just("x"), st.integers(0, N_INPUTS - 1)),
                     st.tuples(st.just("c"), st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 3))))
    if depth == 0:
        return leaf
    sub = _trees(depth - 1)
    return st.one_of(leaf,
                     st.tuples(st.sampled_from(sorted(UNARY)), sub),
                     st.tuples(st.sampled_from(sorted(BINARY)), sub, sub))


def _build(tree, x, table_index):
    kind = tree[0]
    if kind == "x":
        return x[tree[1]]
    if kind == "c":
        return tree[1]
    if kind in UNARY:
        return UNARY[kind][table_index](_build(tree[1], x, table_index))
    return BINARY[kind][table_index](_build(tree[1], x, table_index), _build(tree[2], x, table_index))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trees=st.lists(_trees(4), min_size=1, max_size=3))
@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_random_graphs_match_complex_step(device, backend, trees):
    def fn(x):
        return [x[0] * 0 + _build(t, x, 0) for t in trees]  # x[0]*0 keeps constant trees traced

    def reference(x):
        return np.stack([x[:, 0] * 0 + _build(t, list(x.T), 1) for t in trees], axis=1)

    rng = np.random.default_rng(len(str(trees)))
    x = rng.uniform(-1.5, 1.5, (16, N_INPUTS))
    # The tape with 2 vectors per work-item: each graph is a build of its own, and the default
    # variant's unrolled cases take several times longer (tests/test_pyclad_tape.py runs it).
    config = pc.TapeConfig(blocks=2) if backend == "tape" else None
    f = pc.BatchFunction(fn, params=(N_INPUTS,), backend=backend, device=device, config=config)
    values, (jac,) = f.values_and_jacobians([x], np.arange(len(x)))
    np.testing.assert_allclose(values, reference(x), rtol=1e-12, atol=1e-12)
    for j in range(N_INPUTS):
        xc = x.astype(complex)
        xc[:, j] += 1e-30j
        np.testing.assert_allclose(jac[:, :, j], reference(xc).imag / 1e-30, rtol=1e-11, atol=1e-11)


# -- operators between numbers, nodes and vectors -----------------------------------------

_OPERATORS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "**": np.power}


def _operand(kind, x):
    """The traced operand of a kind: a number, a node (x[0]) or a 2-vector (x[1], x[2])."""
    return {"number": 1.7, "node": x[0], "vector": pc.vector([x[1], x[2]])}[kind]


def _numpy_operand(kind, x):
    return {"number": 1.7, "node": x[..., 0], "vector": x[..., 1:3]}[kind]


@pytest.mark.parametrize("op", list(_OPERATORS))
@pytest.mark.parametrize("left,right", [(a, b) for a in ("number", "node", "vector")
                                        for b in ("number", "node", "vector")
                                        if (a, b) != ("number", "number")])
def test_every_binary_operator_between_numbers_nodes_and_vectors(op, left, right):
    """a OP b for every pair of kinds, both orders: values against numpy, Jacobians against
    central differences of the same numpy expression."""
    def traced(x):
        out = eval(f"a {op} b", {"a": _operand(left, x), "b": _operand(right, x)})
        return list(out) if isinstance(out, pc.Vector) else [out]

    def reference(x):
        a, b = _numpy_operand(left, x), _numpy_operand(right, x)
        if left == "node" and right == "vector":
            a = a[..., None]
        if left == "vector" and right == "node":
            b = b[..., None]
        out = _OPERATORS[op](a, b)
        return out if out.ndim == x.ndim else out[..., None]

    x = np.random.default_rng(zlib.crc32(f"{op} {left} {right}".encode())).uniform(0.5, 2.0, (7, 3))
    f = pc.BatchFunction(traced, params=(3,), backend="numpy")
    values, (jac,) = f.values_and_jacobians([x], np.arange(7))
    np.testing.assert_allclose(values, reference(x).reshape(7, -1), rtol=1e-14)
    h = 1e-6
    for k in range(3):
        step = np.zeros(3)
        step[k] = h
        numeric = (reference(x + step) - reference(x - step)).reshape(7, -1) / (2 * h)
        np.testing.assert_allclose(jac[:, :, k], numeric, rtol=1e-7, atol=1e-8)


def test_pow_of_a_node_and_a_vector_and_the_power_rewrites():
    def fn(x):
        v = pc.vector([x[1], x[2]])
        return [*pc.pow(x[0], v), *(x[0] ** v), x[0] ** 2, x[0] ** 0.5, x[0] ** 1, pc.pow(x[0], 2)]
    t = pc.trace(fn, (3,))
    ops = [t.graph.ops[n] for n in t.outputs]
    assert ops[:4] == ["pow"] * 4                        # elementwise, not an error
    assert ops[4:] == ["square", "sqrt", "input", "square"]   # the rewrites live in the graph
    with pytest.raises(TypeError, match="cannot use str"):
        pc.trace(lambda x: [x[0] * "a"], (1,))
