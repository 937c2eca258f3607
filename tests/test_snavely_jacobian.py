"""The Snavely reprojection written with pyclad, on every observation of real BAL problems,
against the independent numpy reference (complex-step Jacobians, tests/reference_snavely.py)."""
import numpy as np
import pytest

from reference_snavely import ReferenceSnavelyModel
from solvers.bal import read_bal
from solvers.models.snavely import SnavelyModel


@pytest.fixture(scope="module")
def problems(bal_paths):
    return [read_bal(p) for p in bal_paths[:2]]  # the two smallest: every code path, seconds


@pytest.mark.parametrize("backend", ["codegen", "tape"])
def test_jacobians_on_real_bal_problems(device, problems, backend):
    for problem in problems:
        args = (problem.camera_index, problem.point_index, problem.observations)
        ref = ReferenceSnavelyModel(*args)
        model = SnavelyModel(*args, device=device, backend=backend)
        r, jc, jp = model.residuals_and_jacobians(problem.cameras, problem.points)
        rr, rjc, rjp = ref.residuals_and_jacobians(problem.cameras, problem.points)
        # Relative to each observation's scale: residuals reach 1e3 px, Jacobians 1e4.
        np.testing.assert_allclose(r, rr, rtol=1e-10, atol=1e-9)
        for got, want in ((jc, rjc), (jp, rjp)):
            scale = np.abs(want).max(axis=(1, 2), keepdims=True) + 1.0
            assert np.max(np.abs(got - want) / scale) < 1e-10, problem.name
        np.testing.assert_allclose(model.residuals(problem.cameras, problem.points), r, rtol=0, atol=0)


def test_float32_jacobians_on_a_real_problem(device, problems):
    problem = problems[0]
    args = (problem.camera_index, problem.point_index, problem.observations)
    r, jc, jp = SnavelyModel(*args, dtype=np.float32, device=device).residuals_and_jacobians(
        problem.cameras, problem.points)
    rr, rjc, rjp = ReferenceSnavelyModel(*args).residuals_and_jacobians(problem.cameras, problem.points)
    # A residual is a difference of two numbers of the image's size (hundreds of px).
    residual_error = np.abs(r - rr) / (np.abs(problem.observations) + 1.0)
    assert np.median(residual_error) < 1e-6 and residual_error.max() < 1e-3
    for got, want in ((jc, rjc), (jp, rjp)):
        scale = np.abs(want).max(axis=(1, 2), keepdims=True) + 1.0
        assert np.median(np.abs(got - want) / scale) < 1e-6
        assert np.max(np.abs(got - want) / scale) < 1e-3  # a few ill-conditioned points near P.z = 0


def test_zero_rotation_matches_ceres_first_order_branch(device):
    """At w = 0 (and theta^2 below DBL_EPSILON) Ceres uses R x = x + w x x: same Jacobian."""
    cams = np.array([[0, 0, 0, 0.1, -0.2, -5, 500, 0.01, -0.001],
                     [1e-9, -2e-9, 1e-9, 0.1, -0.2, -5, 500, 0.01, -0.001]], float)
    pts = np.array([[0.3, -0.4, 1.2]])
    obs = np.zeros((2, 2))
    args = ([0, 1], [0, 0], obs)
    r, jc, jp = SnavelyModel(*args, device=device).residuals_and_jacobians(cams, pts)
    rr, rjc, rjp = ReferenceSnavelyModel(*args).residuals_and_jacobians(cams, pts)
    np.testing.assert_allclose(jc, rjc, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(jp, rjp, rtol=1e-12, atol=1e-12)
    # d(R x)/dw at w = 0 is -[x]_x: the first-order branch's derivative, not 0/0
    assert np.isfinite(jc).all()
