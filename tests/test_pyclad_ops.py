"""Every op's value and derivative against independent references: numpy for values,
the complex step (analytic ops) or central differences (the others) for derivatives, at
several points including edge cases; both backends, both dtypes, every device."""
import numpy as np
import pytest

import pyclad as pc

H_COMPLEX = 1e-30

# name: (pyclad expression of inputs x[0], x[1]; numpy reference (complex-safe where it is
# analytic); sample points (rows of x); derivative method)
UNARY = {
    "neg": (lambda x: -x[0], lambda a: -a, [-2.0, 0.0, 3.5], "complex"),
    "square": (lambda x: x[0] ** 2, lambda a: a * a, [-2.0, 0.0, 3.5], "complex"),
    "sqrt": (lambda x: pc.sqrt(x[0]), np.sqrt, [0.25, 1.0, 7.0], "complex"),
    "exp": (lambda x: pc.exp(x[0]), np.exp, [-3.0, 0.0, 2.0], "complex"),
    "log": (lambda x: pc.log(x[0]), np.log, [0.1, 1.0, 50.0], "complex"),
    "sin": (lambda x: pc.sin(x[0]), np.sin, [-1.0, 0.0, 2.5], "complex"),
    "cos": (lambda x: pc.cos(x[0]), np.cos, [-1.0, 0.0, 2.5], "complex"),
    "tan": (lambda x: pc.tan(x[0]), np.tan, [-1.0, 0.0, 1.2], "complex"),
    "asin": (lambda x: pc.asin(x[0]), np.arcsin, [-0.9, 0.0, 0.5], "complex"),
    "acos": (lambda x: pc.acos(x[0]), np.arccos, [-0.9, 0.0, 0.5], "complex"),
    "atan": (lambda x: pc.atan(x[0]), np.arctan, [-4.0, 0.0, 0.5], "complex"),
    "tanh": (lambda x: pc.tanh(x[0]), np.tanh, [-2.0, 0.0, 0.5], "complex"),
    "pow_const": (lambda x: x[0] ** 3.5, lambda a: a ** 3.5, [0.5, 1.0, 2.0], "complex"),
    "rpow": (lambda x: 2.0 ** x[0], lambda a: 2.0 ** a, [-1.0, 0.0, 3.0], "complex"),
    "abs": (lambda x: abs(x[0]), np.abs, [-2.0, -0.5, 1.5], "central"),
}
BINARY = {
    "add": (lambda x: x[0] + x[1], lambda a, b: a + b, "complex"),
    "sub": (lambda x: x[0] - x[1], lambda a, b: a - b, "complex"),
    "mul": (lambda x: x[0] * x[1], lambda a, b: a * b, "complex"),
    "div": (lambda x: x[0] / x[1], lambda a, b: a / b, "complex"),
    "pow": (lambda x: x[0] ** x[1], lambda a, b: a ** b, "complex"),
    "atan2": (lambda x: pc.atan2(x[0], x[1]), np.arctan2, "central"),
    "minimum": (lambda x: pc.minimum(x[0], x[1]), np.minimum, "central"),
    "maximum": (lambda x: pc.maximum(x[0], x[1]), np.maximum, "central"),
    "where": (lambda x: pc.where(x[0] > x[1], x[0] * x[1], x[1] - x[0]),
              lambda a, b: np.where(a > b, a * b, b - a), "central"),
}
BINARY_POINTS = np.array([[0.7, 1.3], [2.0, 0.5], [1.5, 3.0], [-1.2, 0.4], [0.3, -2.0]])
CONFIGS = [("codegen", np.float64), ("tape", np.float64), ("codegen", np.float32), ("tape", np.float32)]


def _reference_jacobian(fn, x, method):
    """d fn / d x for each row of x, from the complex step or central differences."""
    n, d = x.shape
    jac = np.zeros((n, d))
    for j in range(d):
        if method == "complex":
            xc = x.astype(complex)
            xc[:, j] += 1j * H_COMPLEX
            jac[:, j] = np.imag(fn(*xc.T)) / H_COMPLEX
        else:
            h = 1e-6 * np.maximum(1.0, np.abs(x[:, j]))
            xp, xm = x.copy(), x.copy()
            xp[:, j] += h
            xm[:, j] -= h
            jac[:, j] = (fn(*xp.T) - fn(*xm.T)) / (2 * h)
    return jac


def _check(device, backend, dtype, expr, ref, x, method):
    f = pc.BatchFunction(expr, params=(x.shape[1],), dtype=dtype, backend=backend, device=device)
    params = x.astype(dtype)
    index = np.arange(len(x))
    values, (jac,) = f.values_and_jacobians([params], index)
    want = ref(*x.T)
    want_jac = _reference_jacobian(ref, x, method)
    if dtype == np.float64:
        rtol, atol_j = 1e-13, (1e-12 if method == "complex" else 1e-7)
    else:
        rtol, atol_j = 2e-6, (2e-5 if method == "complex" else 1e-3)
    np.testing.assert_allclose(values[:, 0], want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(jac[:, 0, :], want_jac, rtol=max(rtol, 1e-6 if method == "central" else rtol),
                               atol=atol_j)


@pytest.mark.parametrize("backend,dtype", CONFIGS, ids=[f"{b}-{np.dtype(d).name}" for b, d in CONFIGS])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op(device, backend, dtype, name):
    expr, ref, points, method = UNARY[name]
    _check(device, backend, dtype, expr, ref, np.array(points)[:, None], method)


@pytest.mark.parametrize("backend,dtype", CONFIGS, ids=[f"{b}-{np.dtype(d).name}" for b, d in CONFIGS])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op(device, backend, dtype, name):
    expr, ref, method = BINARY[name]
    points = BINARY_POINTS.copy()
    if name == "pow":
        points[:, 0] = np.abs(points[:, 0])  # a real power needs a positive base
    _check(device, backend, dtype, expr, ref, points, method)


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_edge_cases(device, backend):
    def fn(x):
        return [pc.sqrt(x[0]), pc.log(x[0]), abs(x[0]), pc.minimum(x[0], x[1]),
                pc.maximum(x[1], x[0]), x[0] / x[1], x[2] < x[1], (x[2] >= x[1]) & (x[0] <= x[1]),
                ~(x[2] == x[0])]
    f = pc.BatchFunction(fn, params=(3,), backend=backend, device=device)
    x = np.array([[0.0, 0.0, 1.0]])
    with np.errstate(divide="ignore", invalid="ignore"):
        values, (jac,) = f.values_and_jacobians([x], [0])
    v, j = values[0], jac[0]
    assert v[0] == 0 and np.isposinf(j[0, 0])          # sqrt'(0) = +inf
    assert np.isneginf(v[1]) and np.isposinf(j[1, 0])  # log(0) = -inf, 1/0
    assert v[2] == 0 and j[2, 0] == 1                  # |x| has slope +1 at 0, as Ceres' Jet
    assert v[3] == 0 and list(j[3, :2]) == [1, 0]      # ties go to the first operand
    assert v[4] == 0 and list(j[4, :2]) == [0, 1]      # maximum(x1, x0): to x1
    assert np.isnan(v[5])                              # 0/0
    assert list(v[6:]) == [0, 1, 1] and not j[6:].any()  # comparisons: 0/1, no derivative


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_nan_in_one_tuple_stays_in_that_tuple(device, backend):
    def fn(x):
        return pc.sin(x[0]) * x[1] + pc.sqrt(x[0] * x[0] + 1.0)
    f = pc.BatchFunction(fn, params=(2,), backend=backend, device=device)
    x = np.array([[0.5, 2.0], [np.nan, 1.0], [1.5, -1.0], [np.inf, 1.0]])
    values, (jac,) = f.values_and_jacobians([x], np.arange(4))
    assert np.isfinite(values[[0, 2]]).all() and np.isfinite(jac[[0, 2]]).all()
    assert np.isnan(values[1]).all() and np.isnan(values[3]).all()
    np.testing.assert_allclose(values[[0, 2], 0], np.sin(x[[0, 2], 0]) * x[[0, 2], 1] + np.sqrt(x[[0, 2], 0] ** 2 + 1))


def test_where_sends_nothing_to_the_untaken_branch(device):
    # The untaken branch has an infinite derivative at x = 0 (sqrt); the result must be finite.
    def fn(x):
        return pc.where(x[0] > 0, pc.sqrt(x[0]), 2.0 * x[0])
    f = pc.BatchFunction(fn, params=(1,), device=device)
    values, (jac,) = f.values_and_jacobians([np.array([[0.0], [4.0]])], [0, 1])
    assert list(values[:, 0]) == [0.0, 2.0]
    assert list(jac[:, 0, 0]) == [2.0, 0.25]


# (pyclad, numpy) pairs of every op, for one kernel holding them all.
ALL_OPS = [
    (lambda a, b, d: -a, lambda a, b, d: -a),
    (lambda a, b, d: a ** 2, lambda a, b, d: a * a),
    (lambda a, b, d: pc.sqrt(b), lambda a, b, d: np.sqrt(b)),
    (lambda a, b, d: pc.exp(a), lambda a, b, d: np.exp(a)),
    (lambda a, b, d: pc.log(b), lambda a, b, d: np.log(b)),
    (lambda a, b, d: pc.sin(a), lambda a, b, d: np.sin(a)),
    (lambda a, b, d: pc.cos(a), lambda a, b, d: np.cos(a)),
    (lambda a, b, d: pc.tan(a), lambda a, b, d: np.tan(a)),
    (lambda a, b, d: pc.asin(a * 0.5), lambda a, b, d: np.arcsin(a * 0.5)),
    (lambda a, b, d: pc.acos(a * 0.5), lambda a, b, d: np.arccos(a * 0.5)),
    (lambda a, b, d: pc.atan(a), lambda a, b, d: np.arctan(a)),
    (lambda a, b, d: pc.tanh(a), lambda a, b, d: np.tanh(a)),
    (lambda a, b, d: b ** 1.5, lambda a, b, d: b ** 1.5),
    (lambda a, b, d: abs(a), lambda a, b, d: np.abs(a)),
    (lambda a, b, d: a + b, lambda a, b, d: a + b),
    (lambda a, b, d: a - b, lambda a, b, d: a - b),
    (lambda a, b, d: a * b, lambda a, b, d: a * b),
    (lambda a, b, d: a / b, lambda a, b, d: a / b),
    (lambda a, b, d: b ** a, lambda a, b, d: b ** a),
    (lambda a, b, d: pc.atan2(a, b), lambda a, b, d: np.arctan2(a, b)),
    (lambda a, b, d: pc.minimum(a, b), lambda a, b, d: np.minimum(a, b)),
    (lambda a, b, d: pc.maximum(a, b), lambda a, b, d: np.maximum(a, b)),
    (lambda a, b, d: pc.where(a > b, a, b * d), lambda a, b, d: np.where(a > b, a, b * d)),
    (lambda a, b, d: a < b, lambda a, b, d: (a < b) * 1.0),
    (lambda a, b, d: a <= b, lambda a, b, d: (a <= b) * 1.0),
    (lambda a, b, d: a >= b, lambda a, b, d: (a >= b) * 1.0),
    (lambda a, b, d: a == b, lambda a, b, d: (a == b) * 1.0),
    (lambda a, b, d: a != b, lambda a, b, d: (a != b) * 1.0),
    (lambda a, b, d: (a < b) | (a > d), lambda a, b, d: ((a < b) | (a > d)) * 1.0),
    (lambda a, b, d: ~(a < b), lambda a, b, d: (a >= b) * 1.0),
]


@pytest.mark.oclgrind
@pytest.mark.parametrize("backend", ["codegen", "tape"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_op_in_one_kernel_tiny(device, backend, dtype, keep_on_simulator):
    """All ops in one graph on a few tuples (the Oclgrind job's check of both kernels),
    against numpy values and central differences."""
    if dtype == np.float64 and not device.info.fp64:
        pytest.skip("device has no fp64")  # a capability; the float32 case still runs

    def fn(x, d):
        return [op(x[0], x[1], d[0]) for op, _ in ALL_OPS]

    def fn_np(a, b, d):
        return np.stack([np.broadcast_to(ref(a, b, d), a.shape) for _, ref in ALL_OPS], axis=-1)

    f = pc.BatchFunction(fn, params=(2,), data=1, dtype=dtype, backend=backend, device=device)
    x = np.array([[0.3, 1.7], [-0.6, 0.4], [0.9, 2.5]])
    d = np.array([[0.5], [-1.0], [2.0]])
    values, (jac,) = f.values_and_jacobians([x.astype(dtype)], np.array([[0], [1], [2]]), data=d.astype(dtype))
    keep_on_simulator(f)   # its tables and scratch (see conftest: Oclgrind's shadow memory)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(values, fn_np(x[:, 0], x[:, 1], d[:, 0]), rtol=tol, atol=tol)
    h = 1e-6
    for j in range(2):
        xp, xm = x.copy(), x.copy()
        xp[:, j] += h
        xm[:, j] -= h
        fd = (fn_np(xp[:, 0], xp[:, 1], d[:, 0]) - fn_np(xm[:, 0], xm[:, 1], d[:, 0])) / (2 * h)
        np.testing.assert_allclose(jac[:, :, j], fd, rtol=1e-6 if dtype == np.float64 else 1e-3,
                                   atol=1e-6 if dtype == np.float64 else 1e-3)


def test_the_op_table_is_the_one_source():
    """Adding an op is one table row plus a test row: every differentiable op has a test row
    here, and every op that names a function is that function of the package (in __all__)."""
    from pyclad.ops import FUNCTIONS, OPS
    for op in OPS.values():
        if op.differentiable:
            assert op.name in UNARY or op.name in BINARY, f"op {op.name!r} has no test row"
    for op in OPS.values():
        if op.function:
            assert op.function in pc.__all__ and callable(getattr(pc, op.function))
            assert getattr(pc, op.function).__name__ == op.function
    assert list(FUNCTIONS) == [op.function for op in OPS.values() if op.function]
    with pytest.raises(TypeError, match="atan2\\(\\) takes 2 arguments"):
        pc.atan2(1.0)
