"""Small bundle-adjustment linear systems with their odd cases, and the dense reference solve,
for the linear-solver tests (numpy, OpenCL products and the device CG)."""
import numpy as np

import solvers
from solvers.ba.schur import Structure

from reference_snavely import ReferenceSnavelyModel


def small_system(seed=0):
    """A small problem with odd cases: a point seen once, a camera seeing a point twice, an
    unobserved camera and an unobserved point (their blocks hold only D^2)."""
    p = solvers.synthetic_problem(6, 40, 3, seed=seed)
    ci, pi, obs = p.camera_index, p.point_index, p.observations
    cams, pts = p.cameras, p.points
    ci = np.concatenate([ci, [2, 3, 3]])
    pi = np.concatenate([pi, [40, 5, 5]])             # point 40 seen once; camera 3 sees point 5 twice more
    obs = np.concatenate([obs, [[1.0, 2.0], [3.0, -1.0], [2.0, 2.0]]])
    pts = np.concatenate([pts, [[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]]])   # point 41: unobserved
    cams = np.concatenate([cams, cams[:1]])                           # camera 6: unobserved
    order = np.argsort(pi, kind="stable")
    ci, pi, obs = ci[order], pi[order], obs[order]
    r, jc, jp = ReferenceSnavelyModel(ci, pi, obs).residuals_and_jacobians(cams, pts)
    st = Structure(ci, pi, len(cams), len(pts))
    return st, r, jc, jp


def sized_system(C, P, R, seed=0, nc=5, npt=30):
    """Random Jacobian blocks (n, R, C) and (n, R, P) and residuals (n, R) on a random pattern
    with the odd cases of :func:`small_system` (a point seen once, a camera seeing a point twice,
    an unobserved camera and point), for block sizes other than BAL's."""
    rng = np.random.default_rng(seed)
    pi = np.repeat(np.arange(npt - 2), rng.integers(2, 5, npt - 2))
    ci = rng.integers(0, nc - 1, pi.size)                    # camera nc - 1: unobserved
    pi = np.concatenate([pi, [npt - 2, 4, 4]])               # point npt-2 seen once; npt-1 never
    ci = np.concatenate([ci, [1, 2, 2]])
    order = np.argsort(pi, kind="stable")
    ci, pi = ci[order], pi[order]
    n = pi.size
    jc, jp = rng.standard_normal((n, R, C)), rng.standard_normal((n, R, P))
    st = Structure(ci, pi, nc, npt, C, P, R)
    return st, rng.standard_normal((n, R)), jc, jp


def dense_solution(st, r, jc, jp, D):
    """The solution of ``(J^T J + diag(D)^2) y = J^T r`` from the dense Jacobian, and that J."""
    n, nc, npt = st.n, st.nc, st.npt
    R, C, P = jc.shape[1], jc.shape[2], jp.shape[2]
    J = np.zeros((R * n, C * nc + P * npt))
    for o in range(n):  # the plain construction, one observation at a time (reference only)
        J[R * o:R * o + R, C * st.cam[o]:C * st.cam[o] + C] = jc[o]
        J[R * o:R * o + R, C * nc + P * st.pt[o]:C * nc + P * st.pt[o] + P] = jp[o]
    A = J.T @ J + np.diag(D * D)
    return np.linalg.solve(A, J.T @ r.ravel()), J


def spd(n, seed, cond=1e3):
    """A random symmetric positive definite matrix with eigenvalues from 1 to ``cond`` (exactly
    symmetric: the dense Cholesky tests read either triangle)."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    S = (Q * np.geomspace(1.0, cond, n)) @ Q.T
    return (S + S.T) / 2
