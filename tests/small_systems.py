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


def dense_solution(st, r, jc, jp, D):
    """The solution of ``(J^T J + diag(D)^2) y = J^T r`` from the dense Jacobian, and that J."""
    n, nc, npt = st.n, st.nc, st.npt
    J = np.zeros((2 * n, 9 * nc + 3 * npt))
    for o in range(n):  # the plain construction, one observation at a time (reference only)
        J[2 * o:2 * o + 2, 9 * st.cam[o]:9 * st.cam[o] + 9] = jc[o]
        J[2 * o:2 * o + 2, 9 * nc + 3 * st.pt[o]:9 * nc + 3 * st.pt[o] + 3] = jp[o]
    A = J.T @ J + np.diag(D * D)
    return np.linalg.solve(A, J.T @ r.ravel()), J
