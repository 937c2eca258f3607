"""iterative_schur's device CG (solvers.linalg.schur_pcg_device) against the host CG (solvers.linalg.cg) on the same
systems: same iterations, same termination, same solution up to the order of the sums."""
import re

import numpy as np
import pytest

import solvers.linalg.schur_pcg_device as schur_pcg
from solvers.linalg.cg import conjugate_gradients
from solvers.ba.schur import NormalEquations
from solvers.ba.schur_device import ClStructure, NormalEquationsCL

from small_systems import small_system

NUMBER = re.compile(r"-?\d+\.\d+e[+-]\d+")


def _system(seed, Dscale=1.0, zero_residuals=False):
    st, r, jc, jp = small_system(seed=seed)
    if zero_residuals:
        r = np.zeros_like(r)
    neq = NormalEquations(st, r, jc, jp)
    D = Dscale * np.random.default_rng(seed).uniform(0.05, 1.0, 9 * st.nc + 3 * st.npt)
    D2 = D * D
    Dc2, Dp2 = D2[:9 * st.nc].reshape(st.nc, 9), D2[9 * st.nc:].reshape(st.npt, 3)
    return st, r, jc, jp, neq, neq.v_inverse(Dp2), Dc2


def _host_cg(neq, Vinv, Dc2, Pinv, **kw):
    apply_S, b = neq.pcg_operator(Vinv, Dc2)
    nc = neq.st.nc
    M = lambda v: np.einsum("cij,cj->ci", Pinv, v.reshape(nc, 9)).ravel()  # noqa: E731
    return conjugate_gradients(apply_S, b, M, **kw)


def _same_message(got, want):
    """Equal messages, the numbers they quote equal to 1e-6 (the sums' order differs)."""
    assert NUMBER.sub("#", got) == NUMBER.sub("#", want), (got, want)
    for a, b in zip(NUMBER.findall(got), NUMBER.findall(want)):
        assert float(a) == pytest.approx(float(b), rel=1e-6, abs=1e-300)


CASES = {
    # name: (system options, CG options, expected ending)
    "nash-sofer": ({}, dict(q_tolerance=0.1), "Convergence: zeta"),
    "residual-resets": (dict(Dscale=30.0), dict(q_tolerance=-np.inf, r_tolerance=1e-10, max_iterations=1000), "tol_r"),
    "max-iterations": ({}, dict(q_tolerance=-np.inf, max_iterations=12), "Maximum number"),
    "zero-rhs": (dict(zero_residuals=True), {}, "|b| = 0"),
    "indefinite": ({}, {}, "Matrix is indefinite"),
}


# The products' layouts: fused (CPUs); the GPU layout with project_points staging its groups'
# observations in local memory, with groups of 2 points of which those with more than 4
# observations read theirs directly, the same through the wide kernel, and without staging.
LAYOUTS = {"fused": dict(SPLIT_LAYOUT=False),
           "gpu-layout": dict(SPLIT_LAYOUT=True),
           "gpu-layout-some-unstaged": dict(SPLIT_LAYOUT=True, STAGE_POINTS=2, STAGE_MAX_OBSERVATIONS=4),
           "gpu-layout-unstaged": dict(SPLIT_LAYOUT=True, STAGED_PROJECTION=False),
           # the wide kernel (4 observations) beside a narrow one of 1
           "gpu-layout-wide": dict(SPLIT_LAYOUT=True, STAGE_POINTS=2, STAGE_MAX_OBSERVATIONS=4,
                                   STAGE_LOCAL_FRACTIONS=(1e-12, 1.0), STAGE_WIDE=True)}


def _layout(monkeypatch, name):
    for key, value in LAYOUTS[name].items():
        monkeypatch.setattr(schur_pcg, key, value)


@pytest.mark.oclgrind
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("max_segment", [256, 2], ids=["whole-cameras", "split-cameras"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_device_cg_matches_host_cg(device, case, max_segment, layout, monkeypatch, keep_on_simulator):
    if not device.info.fp64:
        pytest.skip("the device CG needs fp64")
    _layout(monkeypatch, layout)
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_CPU", max_segment)
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_GPU", max_segment)
    system, kw, ending = CASES[case]
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=7, **system)
    Pinv = neq._schur_jacobi(Vinv, Dc2)
    if case == "indefinite":
        # S = F^T (I - E V^-1 E^T) F - c I with c past its largest eigenvalue, no preconditioner:
        # p'q < 0 at the first iteration.
        apply_S, _ = neq.pcg_operator(Vinv, np.zeros_like(Dc2))
        S = np.stack([apply_S(e) for e in np.eye(9 * st.nc)])
        Dc2 = np.full_like(Dc2, -2.0 * np.linalg.eigvalsh(S).max() - 1.0)
        Pinv = np.broadcast_to(np.eye(9), (st.nc, 9, 9))
    x_h, ok_h, its_h, msg_h = _host_cg(neq, Vinv, Dc2, Pinv, **kw)
    cs = ClStructure(st, device)
    cl_neq = NormalEquationsCL(st, r, jc, jp, cs)
    pcg = cs.device_pcg()
    assert (pcg.nseg > st.nc) == (max_segment == 2)
    if layout in ("gpu-layout-some-unstaged", "gpu-layout-wide"):      # both kinds of group are there
        counts = np.diff(np.asarray(st.pt).searchsorted(np.arange(0, st.npt + 2, 2).clip(max=st.npt)))
        assert pcg.stage == 4 and (counts > 4).any() and (counts <= 4).any()
    pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
    x_d, ok_d, its_d, msg_d = pcg.solve(Vinv, Dc2, Pinv, **kw)
    assert (ok_d, its_d) == (ok_h, its_h), (msg_d, msg_h)
    _same_message(msg_d, msg_h)
    assert ending in msg_d
    if x_h is None:
        assert x_d is None
    else:
        scale = max(1e-300, np.abs(x_h).max())
        np.testing.assert_allclose(x_d, x_h, rtol=1e-8, atol=1e-10 * scale)
    keep_on_simulator(cs, cl_neq)
    if case == "residual-resets":
        assert its_d > 20                   # went through at least two residual resets
    if case == "indefinite":
        assert its_d == 1 and not np.any(x_d)


@pytest.mark.oclgrind
@pytest.mark.parametrize("max_segment", [256, 2], ids=["whole-cameras", "split-cameras"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_preconditioner_blocks_and_back_substitution(device, max_segment, layout, monkeypatch, keep_on_simulator):
    """jacobi_sums and back_substitute (from Jc and Jp) against the numpy pair sums and W^T y
    (from W), on a system where a camera sees a point three times."""
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_CPU", max_segment)
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_GPU", max_segment)
    _layout(monkeypatch, layout)
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=3)
    assert np.any((st.cam[1:] == st.cam[:-1]) & (st.pt[1:] == st.pt[:-1]))
    cs = ClStructure(st, device)
    cl_neq = NormalEquationsCL(st, r, jc, jp, cs)
    pcg = cs.device_pcg()
    pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
    want = neq.diagonal_pair_sums(Vinv)
    np.testing.assert_allclose(pcg.jacobi_sums(Vinv), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    yc = np.random.default_rng(0).standard_normal((st.nc, 9))
    want = neq.back_substitute(Vinv, yc)
    np.testing.assert_allclose(pcg.back_substitute(Vinv, neq.gp, yc), want, rtol=1e-11,
                               atol=1e-11 * np.abs(want).max())
    keep_on_simulator(cs, cl_neq)


@pytest.mark.oclgrind
@pytest.mark.parametrize("max_segment", [256, 2], ids=["whole-cameras", "split-cameras"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_parts_camera_sums(device, max_segment, layout, monkeypatch, keep_on_simulator):
    """What a part of a split solve reads back (solvers.split.partitioned_device): its share of S v
    without Dc^2, of the reduced right-hand side and of the Schur-Jacobi blocks, summed per camera
    on the device (camera_sums), against the numpy operator and pair sums; the CG state with them."""
    if not device.info.fp64:
        pytest.skip("float64 systems need fp64")
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_CPU", max_segment)
    monkeypatch.setattr(schur_pcg, "MAX_SEGMENT_GPU", max_segment)
    _layout(monkeypatch, layout)
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=5)
    cs = ClStructure(st, device)
    cl_neq = NormalEquationsCL(st, r, jc, jp, cs)
    pcg = cs.device_pcg()
    pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
    pending = []
    pcg._upload_vinv(Vinv, pending)
    pcg.split_begin()
    apply_S, b = neq.pcg_operator(Vinv, np.zeros_like(Dc2))
    v = np.random.default_rng(1).standard_normal(9 * st.nc)
    pcg.p.set(v)
    for name, want in (("p", apply_S(v)), ("f", b)):
        got, state = pcg.split_share(name, 0)
        assert state[schur_pcg.S_STATUS] == schur_pcg.RUNNING
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    rows, cols = np.triu_indices(9)
    want = neq.diagonal_pair_sums(Vinv)[:, rows, cols].ravel()
    np.testing.assert_allclose(pcg.part_jacobi_sums(), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())
    keep_on_simulator(cs, cl_neq)


def test_staged_projection_gives_the_unstaged_bits(device, monkeypatch):
    """project_points staged in local memory (every group, or some) does the same arithmetic in
    the same order as reading global memory directly: the same CG iterates, bit for bit."""
    if not device.info.fp64:
        pytest.skip("the device CG needs fp64")
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=7)
    Pinv = neq._schur_jacobi(Vinv, Dc2)
    got = {}
    for layout in ("gpu-layout", "gpu-layout-some-unstaged", "gpu-layout-wide", "gpu-layout-unstaged"):
        with monkeypatch.context() as m:
            _layout(m, layout)
            cs = ClStructure(st, device)
            cl_neq = NormalEquationsCL(st, r, jc, jp, cs)
            pcg = cs.device_pcg()
            pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
            got[layout] = pcg.solve(Vinv, Dc2, Pinv, q_tolerance=-np.inf, max_iterations=15)
    want = got.pop("gpu-layout-unstaged")
    assert want[2] == 15
    for layout, (x, ok, its, msg) in got.items():
        assert (ok, its, msg) == want[1:], layout
        np.testing.assert_array_equal(x, want[0], err_msg=layout)


@pytest.mark.parametrize("layout", ["fused", "gpu-layout"])
def test_a_jacobian_rewritten_in_place_is_the_one_used(device, layout, monkeypatch):
    """A caller that writes a new Jacobian into the buffers it bound before and binds them again
    (solvers.general.implicit_schur_device does) gets products of the new values: the GPU
    layout's camera-ordered copy of F is made again, not kept from the first Jacobian."""
    if not device.info.fp64:
        pytest.skip("float64 systems need fp64")
    _layout(monkeypatch, layout)
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=5)
    cs = ClStructure(st, device)
    cl_neq = NormalEquationsCL(st, r, jc, jp, cs)
    pcg = cs.device_pcg()
    pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
    v = np.random.default_rng(2).standard_normal(9 * st.nc)
    pcg.apply(Vinv, v)                                  # a product of the first Jacobian
    jc2 = jc * np.random.default_rng(3).uniform(0.5, 2.0, jc.shape)
    cl_neq.Jc_dev.set(np.ascontiguousarray(jc2, cl_neq.Jc_dev.dtype).reshape(cl_neq.Jc_dev.shape))
    pcg.bind_jacobian(cl_neq.Jc_dev, cl_neq.Jp_dev, cl_neq.r_dev)
    neq2 = NormalEquations(st, r, jc2, jp)
    apply_S, _ = neq2.pcg_operator(Vinv, np.zeros_like(Dc2))
    want = apply_S(v).reshape(st.nc, 9)
    np.testing.assert_allclose(pcg.apply(Vinv, v), want, rtol=1e-11, atol=1e-11 * np.abs(want).max())


def test_device_cg_needs_a_jacobian(device):
    if not device.info.fp64:
        pytest.skip("the device CG needs fp64")
    st, r, jc, jp, neq, Vinv, Dc2 = _system(seed=1)
    pcg = ClStructure(st, device).device_pcg()
    with pytest.raises(RuntimeError, match="bind_jacobian"):
        pcg.solve(Vinv, Dc2, np.zeros((st.nc, 9, 9)))
    cl_neq = NormalEquationsCL(st, r, jc, jp, ClStructure(st, device))
    with pytest.raises(ValueError, match="float64 device blocks"):
        pcg.bind_jacobian(cl_neq.Jp_dev, cl_neq.Jc_dev, cl_neq.r_dev)


def test_camera_segments():
    cam = np.array([2, 0, 2, 2, 0, 2, 2])      # camera 1 unobserved, camera 2 seen 5 times
    order, seg_start, cam_seg = schur_pcg._camera_segments(cam, np.arange(7), 3, 2)
    assert order.tolist() == [1, 4, 0, 2, 3, 5, 6]
    assert seg_start.tolist() == [0, 2, 4, 6, 7]
    assert cam_seg.tolist() == [0, 1, 1, 4]
    # Camera 2 sees point 1 twice (observations 2 and 3, camera-order positions 3 and 4): the run
    # that would end at position 4 ends after the group instead.
    pt = np.array([0, 0, 1, 1, 1, 2, 3])
    order, seg_start, cam_seg = schur_pcg._camera_segments(cam, pt, 3, 2)
    assert order.tolist() == [1, 4, 0, 2, 3, 5, 6]
    assert seg_start.tolist() == [0, 2, 5, 6, 7]
    assert cam_seg.tolist() == [0, 1, 1, 4]
