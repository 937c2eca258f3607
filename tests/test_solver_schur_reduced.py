"""sparse_schur on the device: the dense device Cholesky (solvers.linalg.dense_cholesky_device) against numpy,
the reduced camera system's device assembly (solvers.linalg.schur_reduced_device) against the host's
(solvers.ba.schur), the host factorisers (solvers.linalg.host_cholesky), where the matrix is factorised
(solvers.linalg.sparse_schur_device) and its failure messages, and the device path against the host
path on the BAL problems with each factorisation; tiny shapes on Oclgrind."""
import dataclasses
import os

import numpy as np
import pytest

import solvers
import solvers.linalg.sparse_schur_device as ssd
from solvers.linalg import factorisation_limits
from clkernels import arrays
from solvers.ba import ordering
from solvers.linalg import host_cholesky
from solvers.linalg.dense_cholesky_device import DenseCholesky, block_sizes, dense_bytes, local_bytes, super_rows_for
from solvers.ba.schur import NormalEquations, Structure
from solvers.linalg.schur_reduced_device import ReducedCameraSystem, ReducedPattern
from solvers.linalg.sparse_schur_device import DeviceSparseSchur, choose_factorisation

from bal_data import bal_file
from reference_snavely import ReferenceSnavelyModel
from small_systems import small_system, spd


def needs_fp64(device):
    if not device.info.fp64:
        pytest.skip("the device sparse_schur needs fp64")


# -- the dense device Cholesky -------------------------------------------------------------------

SOLVES = {"one-group": dict(small_solve_max=4096), "per-block": dict(small_solve_max=0, super_rows=4),
          "super-blocks": dict(small_solve_max=0, super_rows=12)}


@pytest.mark.oclgrind
@pytest.mark.parametrize("panel_width", [1, 3])
@pytest.mark.parametrize("solve", list(SOLVES))
@pytest.mark.parametrize("defer", [1, 2])
@pytest.mark.parametrize("n", [1, 3, 4, 13])
def test_dense_cholesky_tiny(device, n, defer, solve, panel_width, keep_on_simulator):
    """4 x 4 blocks: several panels, updates and solve blocks even at n = 13 (Oclgrind's size);
    with the trailing update after every panel, and deferred over two (a panel then also
    updates its deferred neighbour); the solves in one work-group, and per super-block of one
    block or of three (13 unknowns: a super-block of three blocks, then one of one); the
    panel's rows on one work-item each, and spread over three (a row's columns unevenly)."""
    needs_fp64(device)
    S, b = spd(n, n), np.random.default_rng(n).standard_normal(n)
    chol = DenseCholesky(device, n, block=(4, 2), defer=defer, panel_width=panel_width, **SOLVES[solve])
    assert chol.small_solve == (solve == "one-group")
    keep_on_simulator(chol)
    x, ok = chol.solve_host(S, b)
    assert ok
    np.testing.assert_allclose(chol.lower_factor(), np.linalg.cholesky(S), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100, 257, 600])
@pytest.mark.parametrize("block,defer", [(None, 4), ((8, 1), 1), ((8, 1), 3), ((16, 4), 4)],
                         ids=["device-default", "8x1-each", "8x1-defer3", "16x4"])
def test_dense_cholesky_against_numpy(device, n, block, defer):
    """Sizes below, at and above the block size, on the device's own blocks and others; the
    trailing update after every panel or deferred (by 3: a last deferred block cut short). The
    one-group solve (600: more rows than its 256 items) gives what a launch per block gives."""
    needs_fp64(device)
    S, b = spd(n, 7 + n), np.random.default_rng(n).standard_normal(n)
    chol = DenseCholesky(device, n, block=block, defer=defer, small_solve_max=4096)
    x, ok = chol.solve_host(S, b)
    assert ok and chol.small_solve
    for sb in (1, 2, 4, 32):  # blocks per super-block of the solves: the last one short or whole
        nb = (block or block_sizes(device.info))[0]
        x_blocks, ok = DenseCholesky(device, n, block=block, defer=defer, small_solve_max=0,
                                     super_rows=sb * nb).solve_host(S, b)
        assert ok
        np.testing.assert_allclose(x, x_blocks, rtol=1e-12, atol=1e-14 * np.abs(x).max())
    # The panel's rows spread over 8 work-items each: the same factor to rounding.
    wide = DenseCholesky(device, n, block=block, defer=defer, panel_width=8)
    x_wide, ok = wide.solve_host(S, b)
    assert ok
    np.testing.assert_allclose(wide.lower_factor(), np.linalg.cholesky(S), rtol=1e-10,
                               atol=1e-12 * np.abs(np.linalg.cholesky(S)).max())
    np.testing.assert_allclose(x_wide, x, rtol=1e-10, atol=1e-13 * np.abs(x).max())
    L = np.linalg.cholesky(S)
    np.testing.assert_allclose(chol.lower_factor(), L, rtol=1e-10, atol=1e-12 * np.abs(L).max())
    np.testing.assert_allclose(x, np.linalg.solve(S, b), rtol=1e-8, atol=1e-12)


@pytest.mark.oclgrind
@pytest.mark.parametrize("panel_width", [1, 2])
@pytest.mark.parametrize("broken", ["indefinite", "singular", "nan"])
def test_dense_cholesky_flags_a_matrix_that_is_not_positive_definite(device, broken, panel_width, keep_on_simulator):
    needs_fp64(device)
    n = 9
    S = spd(n, 1)
    if broken == "indefinite":
        S[6, 6] = -1.0
    elif broken == "singular":
        S[:, 5] = S[5, :] = 0.0
    else:
        S[3, 2] = S[2, 3] = np.nan
    chol = DenseCholesky(device, n, block=(4, 2), panel_width=panel_width)
    keep_on_simulator(chol)
    _, ok = chol.solve_host(S, np.ones(n))
    assert not ok
    _, ok = chol.solve_host(spd(n, 2), np.ones(n))        # a good matrix clears the flag again
    assert ok


def test_dense_cholesky_refuses_a_bad_defer(device):
    needs_fp64(device)
    with pytest.raises(ValueError, match="defer must be a positive number of block columns"):
        DenseCholesky(device, 8, block=(4, 2), defer=0)
    with pytest.raises(ValueError, match="super_rows must be a positive multiple of the block size 4"):
        DenseCholesky(device, 8, block=(4, 2), super_rows=0)
    with pytest.raises(ValueError, match="super_rows must be a positive multiple of the block size 4"):
        DenseCholesky(device, 8, block=(4, 2), super_rows=6)
    with pytest.raises(ValueError, match="super_rows=400000 needs .* bytes of local memory"):
        DenseCholesky(device, 8, block=(4, 2), super_rows=400000)
    with pytest.raises(ValueError, match="panel_width must be a positive number of work-items"):
        DenseCholesky(device, 8, block=(4, 2), panel_width=0)


def test_dense_cholesky_block_sizes_respect_the_device(device):
    nb, rt = block_sizes(device.info)
    assert nb <= device.info.max_work_group_size and (nb // rt) ** 2 <= device.info.max_work_group_size
    # Two tiles (panel, update, super-block inverses), or a tile and a super-block's vector (solves).
    assert max(2 * nb * (nb + 1), nb * (nb + 1) + super_rows_for(nb)) * 8 <= device.info.local_mem_bytes
    assert local_bytes(nb) <= device.info.local_mem_bytes and nb % rt == 0


@pytest.mark.parametrize("n", [1, 37, 100])
@pytest.mark.parametrize("solves", ["one-group", "per-block"])
def test_dense_bytes_counts_what_an_instance_allocates(device, n, solves):
    """dense_bytes, which decides whether the device factorises, counts the matrix, the vectors,
    the diagonal blocks and their inverses, and the super-blocks' inverses where the solves use
    them (per-block solves): never below what the instance allocates, at most the flag's
    padding above."""
    needs_fp64(device)
    small = 4096 if solves == "one-group" else 0
    chol = DenseCholesky(device, n, block=(8, 2), small_solve_max=small, super_rows=24)
    assert chol.small_solve == (solves == "one-group")
    assert 0 <= dense_bytes(n, 8, small_solve_max=small, SS=24) - chol.nbytes <= 8


# -- the assembly --------------------------------------------------------------------------------

def host_system(st, r, jc, jp, seed):
    """S (dense) and rhs as solvers.ba.schur's sparse_schur assembles them, with its inputs."""
    neq = NormalEquations(st, r, jc, jp)
    D = np.random.default_rng(seed).uniform(0.05, 1.0, 9 * st.nc + 3 * st.npt)
    D2 = D * D
    Dc2, Dp2 = D2[:9 * st.nc].reshape(st.nc, 9), D2[9 * st.nc:].reshape(st.npt, 3)
    Vinv = neq.v_inverse(Dp2)
    blocks, diag, rhs = neq.reduced_camera_system(Vinv, Dc2)
    return neq, Vinv, Dc2, neq.dense_reduced_matrix(blocks, diag), rhs


def device_inputs(device, neq, jc, jp, Vinv, Dc2):
    iu = np.triu_indices(9)
    dev = lambda a: arrays.to_device(device, np.ascontiguousarray(a, dtype=np.float64))  # noqa: E731
    return dict(Jc=dev(jc), Jp=dev(jp), Vinv=dev(Vinv), B=dev(neq.B[:, iu[0], iu[1]]), dc2=dev(Dc2),
                gc=dev(neq.gc), gp=dev(neq.gp))


def assemble_on_device(device, st, inputs, max_run, keep, whole_run=None):
    pat = ReducedPattern(st.cam, st.pt, st.nc, st.npt, max_run=max_run)
    system = ReducedCameraSystem(device, pat, whole_run=whole_run)
    n, k = 9 * st.nc, inputs
    flag = arrays.to_device(device, np.zeros(1, np.int32))
    rhs = arrays.scratch(device, n, np.float64)
    blocks = arrays.scratch(device, pat.nblocks * 81, np.float64)
    dense = arrays.to_device(device, np.zeros(n * n))
    keep(system, flag, rhs, blocks, dense)
    system.enqueue_groups(k["Jc"], k["Jp"], k["Vinv"])
    system.enqueue_rhs(k["gc"], k["gp"], rhs, flag)
    system.enqueue_blocks(k["B"], k["dc2"], blocks, flag)
    system.enqueue_dense(k["B"], k["dc2"], dense, n, flag)
    bl = blocks.get().reshape(-1, 9, 9)
    S = np.zeros((st.nc, 9, st.nc, 9))
    for b, (ra, cb) in enumerate(zip(pat.block_row, pat.block_col)):
        S[ra, :, cb, :] = bl[b]
        S[cb, :, ra, :] = bl[b].T
    return pat, S.reshape(n, n), dense.get().reshape(n, n), rhs.get(), int(flag.get()[0])


def check_assembly(device, st, r, jc, jp, max_run, keep=lambda *a: None, whole_run=None):
    neq, Vinv, Dc2, S, rhs = host_system(st, r, jc, jp, seed=st.nc)
    inputs = device_inputs(device, neq, jc, jp, Vinv, Dc2)
    keep(inputs)
    pat, S_blocks, S_dense, rhs_dev, flag = assemble_on_device(device, st, inputs, max_run, keep, whole_run)
    assert flag == 0
    scale = np.abs(S).max()
    np.testing.assert_allclose(S_blocks, S, rtol=0, atol=1e-12 * scale)
    # The dense form: the lower triangle (the diagonal blocks whole, which the factor ignores above).
    np.testing.assert_allclose(np.tril(S_dense), np.tril(S), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(rhs_dev, rhs, rtol=0, atol=1e-12 * np.abs(rhs).max())
    # Every camera's diagonal block, and exactly the pairs of cameras that share a point.
    shared = {(a, b) for a, b in zip(st.pairs().block_row, st.pairs().block_col)}
    assert set(zip(pat.block_row, pat.block_col)) == shared | {(c, c) for c in range(st.nc)}
    return pat


@pytest.mark.oclgrind
@pytest.mark.parametrize("max_run", [4096, 1], ids=["whole-blocks", "one-pair-runs"])
@pytest.mark.parametrize("whole_run", [True, False], ids=["item-per-run", "item-per-row"])
def test_assembly_matches_the_host_on_odd_cases(device, max_run, whole_run, keep_on_simulator):
    """A point seen once, a camera that sees a point twice, an unobserved camera and point;
    pair_partials as CPUs run it (a work-item per run) and as GPUs do (one per row of it)."""
    needs_fp64(device)
    st, r, jc, jp = small_system()
    pat = check_assembly(device, st, r, jc, jp, max_run, keep_on_simulator, whole_run)
    if max_run == 1:
        assert pat.nruns == pat.npairs > pat.nblocks


@pytest.mark.slow
def test_assembly_matches_the_host_on_a_bal_problem(device):
    needs_fp64(device)
    p = solvers.read_bal(bal_file("problem-49-7776-pre"))
    order = np.argsort(p.point_index, kind="stable")
    ci, pi, obs = p.camera_index[order], p.point_index[order], p.observations[order]
    r, jc, jp = ReferenceSnavelyModel(ci, pi, obs).residuals_and_jacobians(p.cameras, p.points)
    st = Structure(ci, pi, p.num_cameras, p.num_points)
    check_assembly(device, st, r, jc, jp, max_run=64)


def test_a_non_finite_jacobian_sets_the_flag(device, keep_on_simulator):
    needs_fp64(device)
    st, r, jc, jp = small_system(seed=2)
    jc = jc.copy()
    jc[5, 1, 3] = np.nan
    neq, Vinv, Dc2, _, _ = host_system(st, r, jc, jp, seed=1)
    inputs = device_inputs(device, neq, jc, jp, Vinv, Dc2)
    keep_on_simulator(inputs)
    pat, *_, flag = assemble_on_device(device, st, inputs, 4096, keep_on_simulator)
    assert flag & ssd.NOT_FINITE


def test_pattern_rejects_bad_indices():
    with pytest.raises(ValueError, match="sorted by point"):
        ReducedPattern([0, 1], [1, 0], 2, 2)
    with pytest.raises(ValueError, match="out of range"):
        ReducedPattern([0, 2], [0, 1], 2, 2)


def plain_pattern(cam, pt, nc):
    """ReducedPattern's groups and pairs from their definition: a group per (camera, point) seen,
    numbered by camera then point; a pair per two groups of one point (a group with itself too)
    with the first one's camera at most the second's, sorted by block (camera, camera), then point."""
    keys = sorted(set(zip(cam.tolist(), pt.tolist())))
    gid = {k: i for i, k in enumerate(keys)}
    pairs = []
    for (ca, p) in keys:
        for (cb, q) in keys:
            if p == q and ca <= cb:
                pairs.append((ca * nc + cb, p, gid[(ca, p)], gid[(cb, q)]))
    pairs.sort()
    blocks = sorted({b for b, *_ in pairs} | {c * nc + c for c in range(nc)})
    return keys, pairs, blocks


@pytest.mark.parametrize("seed", range(6))
def test_pattern_is_the_plain_definition(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    if seed % 2:        # many small tasks on several threads
        monkeypatch.setattr(ordering, "CHUNK", 16)
        monkeypatch.setattr(ordering, "threads", lambda: 3)
    nc, npt = int(rng.integers(1, 12)), int(rng.integers(1, 40))
    n = 0 if seed == 0 else int(rng.integers(1, 200))
    cam, pt = rng.integers(0, nc, n), rng.integers(0, npt, n)       # repeats, unseen cameras too
    order = np.argsort(pt, kind="stable")
    cam, pt = cam[order], pt[order]
    pat = ReducedPattern(cam, pt, nc, npt, max_run=3)
    keys, pairs, blocks = plain_pattern(cam, pt, nc)
    assert [tuple(k) for k in zip(pat.group_cam.tolist(), pat.group_pt.tolist())] == keys
    assert pat.pair_a.tolist() == [a for *_, a, _ in pairs]
    assert pat.pair_b.tolist() == [b for *_, b in pairs]
    assert (pat.block_row * nc + pat.block_col).tolist() == blocks
    # each block's runs cover exactly its pairs, in order, at most max_run long
    block_of_pair = [b for b, *_ in pairs]
    for i, blk in enumerate(blocks):
        runs = range(pat.block_run[i], pat.block_run[i + 1])
        covered = [j for r in runs for j in range(pat.run_start[r], pat.run_start[r + 1])]
        assert covered == [j for j, b in enumerate(block_of_pair) if b == blk]
        assert all(pat.run_start[r + 1] - pat.run_start[r] <= 3 for r in runs)

# -- the host factorisers ------------------------------------------------------------------------

def factorisers():
    names = ["cholmod", "cholespy", "superlu", "lapack"]
    if os.environ.get("PYCLAD_REQUIRE_CHOLMOD") != "1":    # CI installs CHOLMOD: there it must run
        names = [n for n in names if host_cholesky.installed(n)]
    return names


@pytest.mark.parametrize("name", factorisers())
def test_host_factorisers_solve_a_block_sparse_matrix(name):
    st, r, jc, jp = small_system(seed=4)
    _, _, _, S, rhs = host_system(st, r, jc, jp, seed=3)
    pat = ReducedPattern(st.cam, st.pt, st.nc, st.npt)
    blocks = np.stack([S[9 * a:9 * a + 9, 9 * b:9 * b + 9] for a, b in zip(pat.block_row, pat.block_col)])
    f = host_cholesky.make_factoriser(pat.block_row, pat.block_col, pat.nc, 9, name)
    for scale in (1.0, 2.0):        # a second numeric factorisation on the same pattern
        f.factor(scale * blocks)
        np.testing.assert_allclose(f.solve(rhs), np.linalg.solve(scale * S, rhs), rtol=1e-8, atol=1e-12)
    bad = blocks.copy()
    bad[0, 4, 4] = -1e3
    with pytest.raises(host_cholesky.NotPositiveDefinite):
        f.factor(bad)


def test_the_best_sparse_factoriser_is_cholmod_when_installed():
    if not host_cholesky.installed("cholmod"):
        if os.environ.get("PYCLAD_REQUIRE_CHOLMOD") == "1":
            pytest.fail("PYCLAD_REQUIRE_CHOLMOD=1 but scikit-sparse (sksparse.cholmod) is not installed")
        pytest.skip("scikit-sparse is not installed")
    assert host_cholesky.best_sparse() == "cholmod"


# -- where S is factorised, and the failures -----------------------------------------------------

@dataclasses.dataclass
class FakeInfo:
    is_cpu: bool
    global_mem_bytes: int = 80 << 30
    max_alloc_bytes: int = 20 << 30
    local_mem_bytes: int = 48 << 10
    max_work_group_size: int = 1024


def test_choice_of_factorisation():
    gpu, cpu = FakeInfo(is_cpu=False), FakeInfo(is_cpu=True)
    sparse = host_cholesky.best_sparse()
    assert choose_factorisation(gpu, 657, 1 << 30) == "device"
    assert choose_factorisation(gpu, 16384, 1 << 30) == "device"
    assert choose_factorisation(gpu, 16385, 1 << 30) == sparse                    # the size limit
    assert choose_factorisation(FakeInfo(False, max_alloc_bytes=1 << 20), 657, 0) == "lapack"   # one buffer
    assert choose_factorisation(FakeInfo(False, global_mem_bytes=4 << 30), 16000, 3 << 30) == sparse
    assert choose_factorisation(cpu, 657, 0) == "lapack"
    assert choose_factorisation(cpu, factorisation_limits.HOST_DENSE_MAX + 1, 0) == sparse
    # A nearly full S (a COLMAP scene's) is LAPACK's up to its limit; a sparse one stays sparse.
    assert choose_factorisation(cpu, factorisation_limits.HOST_DENSE_MAX + 1, 0, fill=factorisation_limits.DENSE_FILL) == "lapack"
    assert choose_factorisation(cpu, factorisation_limits.DENSE_FILL_MAX, 0, fill=1.0) == "lapack"
    assert choose_factorisation(cpu, factorisation_limits.DENSE_FILL_MAX + 1, 0, fill=1.0) == sparse
    assert choose_factorisation(cpu, factorisation_limits.HOST_DENSE_MAX + 1, 0, fill=0.99 * factorisation_limits.DENSE_FILL) == sparse
    assert choose_factorisation(gpu, 657, 1 << 30, fill=1.0) == "device"


ROUTES = {"device": dict(DEVICE_DENSE_MAX_CPU=10 ** 6, DEVICE_DENSE_MAX=10 ** 6),
          # the same, factorised in float32 and refined in float64 (mixed_precision_solves)
          "device-mixed": dict(DEVICE_DENSE_MAX_CPU=10 ** 6, DEVICE_DENSE_MAX=10 ** 6),
          "lapack": dict(DEVICE_DENSE_MAX_CPU=0, DEVICE_DENSE_MAX=0),
          # (the small test matrices are nearly full: the fill rule is lifted too)
          "sparse": dict(DEVICE_DENSE_MAX_CPU=0, DEVICE_DENSE_MAX=0, HOST_DENSE_MAX=0, DENSE_FILL_MAX=0)}


def force_route(monkeypatch, route):
    for name, value in ROUTES[route].items():
        monkeypatch.setattr(factorisation_limits, name, value)


@pytest.mark.oclgrind
@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("case", ["good", "not-finite", "not-positive-definite"])
def test_device_sparse_schur_solves_as_the_host_path(device, route, case, defer, monkeypatch, keep_on_simulator):
    """The camera step and the message of solvers.ba.schur's sparse_schur, for each factorisation;
    ``defer``: the device factorisation's verdict read after the queue has passed it."""
    needs_fp64(device)
    st, r, jc, jp = small_system(seed=5)
    D = np.random.default_rng(5).uniform(0.05, 1.0, 9 * st.nc + 3 * st.npt)
    if case == "not-finite":
        jp = jp.copy()
        jp[3, 0, 1] = np.inf
    elif case == "not-positive-definite":
        D[9 * 6:9 * 7] = 0.0               # camera 6 sees nothing: its block of S is zero
    neq = NormalEquations(st, r, jc, jp)
    with np.errstate(all="ignore"):
        want = neq.solve(D, "sparse_schur")     # the host path with its own (default) choice
    force_route(monkeypatch, route)             # then the device solver's factorisation forced
    D2 = D * D
    Dc2, Dp2 = D2[:9 * st.nc].reshape(st.nc, 9), D2[9 * st.nc:].reshape(st.npt, 3)
    with np.errstate(all="ignore"):
        Vinv = neq.v_inverse(Dp2)
    solver = DeviceSparseSchur(device, st.cam, st.pt, st.nc, st.npt, mixed=route == "device-mixed")
    assert solver.where == {"device": "device", "device-mixed": "device", "lapack": "lapack",
                            "sparse": host_cholesky.best_sparse()}[route]
    assert ("on the device" in solver.description) == route.startswith("device")
    assert ("refined in float64" in solver.description) == (route == "device-mixed")
    inputs = device_inputs(device, neq, jc, jp, Vinv, Dc2)
    x = arrays.scratch(device, 9 * st.nc, np.float64)
    keep_on_simulator(solver, inputs, x)
    ok, msg = solver.solve(inputs["Jc"], inputs["Jp"], inputs["Vinv"], inputs["B"], inputs["dc2"],
                           inputs["gc"], inputs["gp"], x, defer=defer)
    if defer and route.startswith("device"):
        assert ok is None
        device.queue.finish()
        ok, msg = solver.outcome()
    assert (ok, msg) == (want.ok, want.message)
    if ok:
        np.testing.assert_allclose(x.get(), want.y[:9 * st.nc], rtol=1e-8, atol=1e-10 * np.abs(want.y).max())


@pytest.mark.oclgrind
@pytest.mark.parametrize("route", list(ROUTES))
def test_device_sparse_schur_tiny_solve(device, route, monkeypatch, keep_on_simulator):
    """A whole tiny solve on each route (on Oclgrind too: every new kernel with LM's inputs)."""
    needs_fp64(device)
    force_route(monkeypatch, route)
    p = solvers.synthetic_problem(4, 12, 3, seed=9)
    kw = dict(linear_solver="sparse_schur", max_iterations=2, loss="huber", handle_sigint=False)
    mixed = dict(mixed_precision_solves=route == "device-mixed")
    # The reference in numpy: the host path's OpenCL products are not what this test is about.
    host = solvers.bundle_adjust(p, device=device, device_resident=False, schur_backend="numpy", **kw)
    dev = solvers.bundle_adjust(p, device=device, device_resident=True, **mixed, **kw)
    assert dev.state == "device"
    assert [h.cost for h in dev.history] == pytest.approx([h.cost for h in host.history], rel=1e-10)
    assert [h.step_is_successful for h in dev.history] == [h.step_is_successful for h in host.history]


@pytest.mark.slow
@pytest.mark.parametrize("route", ["device", "sparse"])
@pytest.mark.parametrize("name", ["problem-21-11315-pre", "problem-73-11032-pre"])
def test_each_factorisation_follows_the_host_path_on_bal(device, route, name, monkeypatch):
    """The routes a CPU device does not take by default (tests/test_solver_lm_device.py runs the
    default one on all five problems): the same trajectory as the host path."""
    needs_fp64(device)
    force_route(monkeypatch, route)
    problem = solvers.read_bal(bal_file(name))
    kw = dict(linear_solver="sparse_schur", handle_sigint=False, device=device)
    host = solvers.bundle_adjust(problem, device_resident=False, **kw)
    dev = solvers.bundle_adjust(problem, device_resident=True, **kw)
    label = "dense Cholesky on the device" if route == "device" else host_cholesky.LABELS[host_cholesky.best_sparse()]
    assert label in dev.linear_solver_detail
    assert len(dev.history) == len(host.history)
    assert [h.step_is_successful for h in dev.history] == [h.step_is_successful for h in host.history]
    np.testing.assert_allclose([h.cost for h in dev.history], [h.cost for h in host.history], rtol=1e-9)
    assert dev.termination_type == host.termination_type
    assert dev.final_cost == pytest.approx(host.final_cost, rel=1e-9)


def test_verbose_log_and_report_say_where_s_is_factorised(device, monkeypatch, capsys):
    needs_fp64(device)
    force_route(monkeypatch, "device")
    p = solvers.synthetic_problem(5, 40, 3, seed=3)
    r = solvers.bundle_adjust(p, device=device, max_iterations=1, verbose=True, handle_sigint=False)
    out = capsys.readouterr().out
    assert out.count("Reduced camera matrix: 45 x 45, dense Cholesky on the device") == 1
    assert r.linear_solver_detail == "Reduced camera matrix: 45 x 45, dense Cholesky on the device"
    assert "dense Cholesky on the device" in r.full_report()
    host = solvers.bundle_adjust(p, device=device, max_iterations=1, device_resident=False, handle_sigint=False)
    assert host.linear_solver_detail == "Reduced camera matrix: 45 x 45, dense Cholesky (LAPACK) on the host"
