"""The device's dense Cholesky in float32 and the mixed-precision solve built on it
(solvers.linalg.mixed_cholesky_device): against numpy and against the float64 factorisation on the
same device, on matrices of chosen condition; the hand-over to float64 where float32 cannot do
it; failures flagged as the float64 path flags them; tiny shapes on Oclgrind."""
import numpy as np
import pytest

import clkernels
import clkernels.memory
import solvers
from clkernels import arrays
from solvers.linalg import factorisation_limits
from solvers.linalg.dense_cholesky_device import DenseCholesky
from solvers.bal.__main__ import main as cli_main
from solvers.linalg.mixed_cholesky_device import MixedCholesky
from solvers.linalg.sparse_schur_device import DeviceSparseSchur

from bal_data import bal_file
from small_systems import small_system, spd


def needs_fp64(device):
    if not device.info.fp64:
        pytest.skip("the mixed-precision solve refines in float64")


def mixed_solve(device, S, b, block, keep=None, block32=None):
    mc = MixedCholesky(device, len(b), block=block, block32=block32)
    if keep is not None:
        keep(mc)
    mc.write_host(S, b)
    mc.factor()
    x = arrays.scratch(device, max(1, len(b)), np.float64)
    if keep is not None:
        keep(x)
    mc.solve(x)
    return mc, x.get()[:len(b)]


@pytest.mark.oclgrind
@pytest.mark.parametrize("n", [1, 5, 13])
def test_float32_dense_cholesky_tiny(device, n, keep_on_simulator):
    """The float32 variant of the kernels: the factor and the solution to float32's accuracy."""
    S, b = spd(n, n, 10.0), np.random.default_rng(n).standard_normal(n)
    chol = DenseCholesky(device, n, block=(4, 2), dtype=np.float32)
    keep_on_simulator(chol)
    x, ok = chol.solve_host(S, b)
    assert ok and x.dtype == np.float32
    L = np.linalg.cholesky(S)
    np.testing.assert_allclose(chol.lower_factor(), L, rtol=2e-5, atol=2e-6 * np.abs(L).max())
    np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-4, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize("n", [31, 100, 300])
def test_float32_dense_cholesky_against_numpy(device, n):
    S, b = spd(n, n, 100.0), np.random.default_rng(n).standard_normal(n)
    x, ok = DenseCholesky(device, n, block=(16, 4), dtype=np.float32).solve_host(S, b)
    assert ok
    np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-4, atol=1e-5 * np.abs(x).max())


def test_float32_dense_cholesky_refuses_a_float64_output(device):
    chol = DenseCholesky(device, 8, block=(4, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="x must be float32"):
        chol.solve(arrays.scratch(device, 8, np.float64))
    with pytest.raises(ValueError, match="dtype must be np.float64 or np.float32"):
        DenseCholesky(device, 8, block=(4, 2), dtype=np.float16)


@pytest.mark.parametrize("cond", [1e2, 1e5])
@pytest.mark.parametrize("n", [40, 300])
def test_mixed_solve_reaches_the_float64_factorisations_accuracy(device, n, cond):
    """Refined, not handed over: the residual within a few times the float64 factorisation's
    (on the same device, and numpy's), the solution as close to numpy's."""
    needs_fp64(device)
    S, b = spd(n, 3 + n, cond), np.random.default_rng(n).standard_normal(n)
    mc, x = mixed_solve(device, S, b, (16, 4))
    assert not mc.fell_back and 2 <= mc.steps <= 8 and not mc.failed()
    x64, ok = DenseCholesky(device, n, block=(16, 4)).solve_host(S, b)
    assert ok
    res = np.abs(S @ x - b).max()
    res64 = max(np.abs(S @ x64 - b).max(), np.abs(S @ np.linalg.solve(S, b) - b).max())
    assert res <= 4 * res64
    want = np.linalg.solve(S, b)
    err, err64 = np.abs(x - want).max(), np.abs(x64 - want).max()
    assert err <= 4 * err64 + 1e-15 * np.abs(want).max()


def test_mixed_solve_hands_over_to_float64_where_float32_cannot(device):
    """Condition 1e9: float32's factor is useless (or its factorisation fails); the float64
    factorisation solves, with its own result."""
    needs_fp64(device)
    n = 200
    S, b = spd(n, 11, 1e9), np.random.default_rng(11).standard_normal(n)
    mc, x = mixed_solve(device, S, b, (16, 4))
    assert mc.fell_back and mc.fallbacks == 1 and not mc.failed()
    x64, _ = DenseCholesky(device, n, block=(16, 4)).solve_host(S, b)
    np.testing.assert_array_equal(x, x64)
    # From then on float64 directly, even for a matrix float32 would do (no wasted factorisation).
    S2 = spd(n, 12, 10.0)
    mc.write_host(S2, b)
    mc.factor()
    y = arrays.scratch(device, n, np.float64)
    mc.solve(y)
    assert mc.float64_only and mc.steps == 0 and not mc.fell_back and mc.fallbacks == 1
    np.testing.assert_allclose(y.get(), np.linalg.solve(S2, b), rtol=1e-12)


@pytest.mark.oclgrind
@pytest.mark.parametrize("block32", [None, (8, 2), (2, 1)], ids=["same-blocks", "float32-8x8", "float32-2x2"])
@pytest.mark.parametrize("case", ["good", "zero-rhs", "indefinite", "nan"])
def test_mixed_solve_tiny(device, case, block32, keep_on_simulator):
    """Every kernel of the refinement with 4 x 4 blocks, the float32 factorisation's blocks the
    same, larger (its padding past the float64 matrix's) or smaller; a matrix that is not
    positive definite or not finite is flagged as the float64 factorisation flags it."""
    needs_fp64(device)
    n = 13
    S, b = spd(n, 2, 50.0), np.random.default_rng(2).standard_normal(n)
    if case == "zero-rhs":
        b[:] = 0.0
    elif case == "indefinite":
        S[6, 6] = -1.0
    elif case == "nan":
        S[3, 2] = S[2, 3] = np.nan
    mc, x = mixed_solve(device, S, b, (4, 2), keep=keep_on_simulator, block32=block32)
    if case in ("indefinite", "nan"):
        assert mc.failed()
        return
    assert not mc.failed() and not mc.fell_back
    if case == "zero-rhs":
        assert mc.steps == 0 and np.all(x == 0.0)
    else:
        np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-12, atol=1e-14 * np.abs(x).max())


@pytest.mark.parametrize("name", ["problem-21-11315-pre"])
def test_mixed_sparse_schur_follows_the_float64_path_on_bal(device, name, monkeypatch):
    """A real BAL problem factorised on the device both ways: the same steps accepted, the same
    costs to 1e-10, the report saying which."""
    needs_fp64(device)
    monkeypatch.setattr(factorisation_limits, "DEVICE_DENSE_MAX_CPU", 10 ** 6)   # CPU devices too
    problem = solvers.read_bal(bal_file(name))
    kw = dict(linear_solver="sparse_schur", handle_sigint=False, device=device, device_resident=True)
    f64 = solvers.bundle_adjust(problem, **kw)
    mixed = solvers.bundle_adjust(problem, mixed_precision_solves=True, **kw)
    assert "dense Cholesky on the device (float32, refined in float64)" in mixed.linear_solver_detail
    assert "float32" not in f64.linear_solver_detail
    assert [h.step_is_successful for h in mixed.history] == [h.step_is_successful for h in f64.history]
    np.testing.assert_allclose([h.cost for h in mixed.history], [h.cost for h in f64.history], rtol=1e-10)
    assert mixed.termination_type == f64.termination_type
    # The refinement's residuals cross to the host, and the transfers say so.
    assert mixed.transfers["bytes_to_host"] > f64.transfers["bytes_to_host"]


@pytest.mark.parametrize("n", [1, 37, 64])
def test_the_memory_estimate_holds_both_factorisations(device, n):
    """mixed_bytes, which decides whether the mixed solve fits, counts each matrix at its own
    block padding (the float32 one's blocks may be larger): at most a vector's padding above
    what the instance allocates, never below."""
    from solvers.linalg.dense_cholesky_device import device_small_solve_max
    from solvers.linalg.mixed_cholesky_device import mixed_bytes
    mc = MixedCholesky(device, n, block=(8, 2), block32=(16, 4))
    assert 0 <= mixed_bytes(n, 8, 16, device_small_solve_max(device.info)) - mc.nbytes <= 4 * 8
    # Past the one-group solves, the super-blocks' inverses too.
    mc = MixedCholesky(device, n, block=(8, 2), block32=(16, 4), small_solve_max=0)
    assert 0 <= mixed_bytes(n, 8, 16) - mc.nbytes <= 4 * 8


def test_mixed_precision_solves_option_is_checked(device):
    p = solvers.synthetic_problem(4, 20, 2, seed=1)
    with pytest.raises(ValueError, match="mixed_precision_solves must be None, True or False"):
        solvers.bundle_adjust(p, device=device, mixed_precision_solves="yes", handle_sigint=False)


def test_bal_command_line_takes_mixed_precision_solves(device, monkeypatch, capsys):
    """``--mixed-precision-solves`` reaches the solve: the report names the refined factorisation
    (the device factorises here whatever its kind)."""
    needs_fp64(device)
    monkeypatch.setattr(factorisation_limits, "DEVICE_DENSE_MAX_CPU", 10 ** 6)
    assert cli_main(["--iterations", "3", "--mixed-precision-solves", "-q", "--device",
                     device.info.name]) == 0
    out = capsys.readouterr().out
    assert "dense Cholesky on the device (float32, refined in float64)" in out


@pytest.mark.parametrize("mixed", [False, True])
def test_a_system_past_the_devices_memory_is_refused_with_the_ways_out(device, monkeypatch, mixed):
    """Too little memory for the solve: DeviceMemoryError before anything runs, naming the bytes
    and, for mixed-precision solves, turning them off among the ways out."""
    needs_fp64(device)
    monkeypatch.setattr(factorisation_limits, "DEVICE_DENSE_MAX_CPU", 10 ** 6)
    monkeypatch.setattr(clkernels.memory, "available", lambda info: (1000, "a test's limit"))
    st = small_system(seed=5)[0]
    with pytest.raises(clkernels.DeviceMemoryError, match="needs about") as e:
        DeviceSparseSchur(device, st.cam, st.pt, st.nc, st.npt, mixed=mixed)
    assert ("mixed_precision_solves=False" in str(e.value)) == mixed
    assert "iterative_schur" in str(e.value)
