"""The OpenCL Schur-complement products: the segmented gather kernel against numpy, and the
OpenCL normal equations against the numpy ones and a dense solve."""
import numpy as np
import pyopencl.array as cla
import pytest

from solvers.ba.schur import NormalEquations
from solvers.ba.ordering import cut_runs
from solvers.ba.schur_device import ClStructure, NormalEquationsCL
from solvers.linalg.segment_products_device import Segments, segment_products

from small_systems import dense_solution, sized_system, small_system


def reference(starts, i1, i2, X, Y):
    nseg = len(starts) - 1
    out = np.zeros((nseg, X.shape[1], Y.shape[1]))
    for s in range(nseg):                     # the plain loops (reference only)
        for p in range(starts[s], starts[s + 1]):
            a = p if i1 is None else i1[p]
            b = p if i2 is None else i2[p]
            out[s] += X[a] @ Y[b].T
    return out


@pytest.mark.oclgrind
@pytest.mark.parametrize("NA,NB,K", [(9, 9, 3), (3, 1, 2), (2, 1, 9)])
@pytest.mark.parametrize("identity", [False, True])
@pytest.mark.parametrize("x_t,y_t", [(False, False), (True, True), (True, False)])
def test_segment_products_against_loops(device, NA, NB, K, identity, x_t, y_t):
    rng = np.random.default_rng(NA * 100 + NB * 10 + K)
    n = 13
    X = rng.standard_normal((n, NA, K))
    Y = rng.standard_normal((n if identity else 7, NB, K))
    starts = np.array([0, 3, 3, 4, 9, 13])                      # an empty segment too
    i1 = None if identity else rng.integers(0, n, 13)
    i2 = None if identity else rng.integers(0, len(Y), 13)
    seg = Segments(device, starts, i1, i2, n, len(Y))
    Xd = cla.to_device(device.queue, np.ascontiguousarray(X.transpose(0, 2, 1)) if x_t else X)
    Yd = cla.to_device(device.queue, np.ascontiguousarray(Y.transpose(0, 2, 1)) if y_t else Y)
    got = segment_products(seg, Xd, Yd, x_t, y_t).get()
    np.testing.assert_allclose(got, reference(starts, i1, i2, X, Y), rtol=1e-13, atol=1e-13)


@pytest.mark.oclgrind
def test_segments_validate_indices(device):
    with pytest.raises(ValueError, match="i2 must hold"):
        Segments(device, np.array([0, 2]), None, np.array([0, 5]), 2, 5)
    with pytest.raises(ValueError, match="identity i1"):
        Segments(device, np.array([0, 3]), None, np.array([0, 1, 2]), 2, 5)
    with pytest.raises(ValueError, match="non-decreasing"):
        Segments(device, np.array([0, 2, 1]), None, None, 4, 4)
    seg = Segments(device, np.array([0, 2]), None, None, 2, 2)
    x = cla.to_device(device.queue, np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match="inner size"):
        segment_products(seg, x, cla.to_device(device.queue, np.zeros((2, 3, 4))))
    with pytest.raises(ValueError, match="float64"):
        segment_products(seg, x, cla.to_device(device.queue, np.zeros((2, 3, 2), np.float32)))


def test_split_segments():
    starts = np.array([0, 5, 5, 12])
    runs = cut_runs(starts, 3, min_runs=1)        # as schur_cl's reducers cut their segments
    new, first = runs.start, runs.item_run[:-1]
    assert new.tolist() == [0, 3, 5, 5, 8, 11, 12]
    assert first.tolist() == [0, 2, 3]


@pytest.mark.parametrize("method", ["sparse_schur", "iterative_schur"])
def test_opencl_normal_equations_match_numpy_and_dense(device, method, monkeypatch, keep_on_simulator):
    """The OpenCL products, with iterative_schur's CG on the host (scipy products)."""
    _check_normal_equations(device, method, False, monkeypatch, keep_on_simulator)


@pytest.mark.oclgrind
def test_implicit_schur_product_on_the_device(device, monkeypatch, keep_on_simulator):
    """iterative_schur's default path: the whole CG on the device (solvers.linalg.schur_pcg_device)."""
    _check_normal_equations(device, "iterative_schur", True, monkeypatch, keep_on_simulator)


@pytest.mark.parametrize("method,device_cg", [("sparse_schur", False), ("iterative_schur", False),
                                              ("iterative_schur", True)])
@pytest.mark.parametrize("C,P,R", [(10, 3, 2), (6, 1, 3)], ids=["C10-P3-R2", "C6-P1-R3"])
def test_opencl_normal_equations_other_block_sizes(device, method, device_cg, C, P, R, monkeypatch,
                                                   keep_on_simulator):
    """The host reference's device products (and the device CG) for blocks other than BAL's."""
    _check_normal_equations(device, method, device_cg, monkeypatch, keep_on_simulator,
                            sized_system(C, P, R, seed=7))


def _check_normal_equations(device, method, device_cg, monkeypatch, keep_on_simulator, system=None):
    import solvers.ba.schur_device as schur_cl
    monkeypatch.setattr(schur_cl, "MAX_SEGMENT", 4)     # force split segments and host reductions
    st, r, jc, jp = system or small_system(seed=5)
    a = NormalEquations(st, r, jc, jp)
    cs = ClStructure(st, device)
    cs.device_cg = device_cg                            # the implicit Schur product on the device (default)
    b = NormalEquationsCL(st, r, jc, jp, cs)
    for f in ("B", "V", "gc", "gp"):
        np.testing.assert_allclose(getattr(b, f), getattr(a, f), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(b.W, a.W, rtol=1e-12, atol=1e-12)
    D = np.random.default_rng(2).uniform(0.05, 1.0, st.C * st.nc + st.P * st.npt)
    want, _ = dense_solution(st, r, jc, jp, D)
    kw = dict(eta=-np.inf, r_tolerance=1e-13, max_iterations=1000) if method == "iterative_schur" else {}
    got = b.solve(D, method, **kw)
    assert got.ok
    np.testing.assert_allclose(got.y, want, rtol=1e-6, atol=1e-8 * np.abs(want).max())
    keep_on_simulator(b, cs)
